//! Tiled execution: a window's plan run over every tile gives what the whole input's plan
//! gives (inference outputs; a training step's loss and updates), the halo is what makes
//! it so, the refusals name the op, and the 3-D case study's exact bytes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use memc::exec::cpu::CpuExecutor;
use memc::tiling::{compile_tiled, run, TileSpec, Tiling};
use memc::{Compiled, Options};
use std::path::Path;

/// A 2-D UNet of two levels with a dilated convolution at the bottom: pooling, transposed
/// convolution, concatenated skip.
const UNET2D: &str = "model unet2d {
  dim B = 1, S = 64, F = 4, K = 3
  input image: [B, 2, S, S]
  input labels: i32[B, S, S]

  block double(x, cin, cout) {
    param c1: conv2d(cin, cout, 3, bias = true)
    param c2: conv2d(cout, cout, 3, bias = true)
    let h = relu(conv2d(x, c1, padding = 1))
    return relu(conv2d(h, c2, padding = 1))
  }

  param d: conv2d(2*F, 2*F, 3, bias = true)
  param t: conv_transpose2d(2*F, F, 2, bias = true)
  param head: conv2d(F, K, 1, bias = true)
  let e1 = double(image, 2, F)
  let e2 = double(max_pool2d(e1, 2), F, 2*F)
  let b = relu(conv2d(e2, d, padding = 2, dilation = 2))
  let x = double(concat(conv_transpose2d(b, t, stride = 2), e1, axis = 1), 2*F, F)
  let scores = conv2d(x, head)
  TAIL
}";

/// `UNET2D` as an inference model (its scores the output).
fn unet2d_inference() -> String {
    UNET2D.replace("TAIL", "output y = scores")
}

/// `UNET2D` trained with SGD on a per-pixel cross-entropy that ignores id -1.
fn unet2d_training() -> String {
    UNET2D.replace(
        "TAIL",
        "let logits = permute(reshape(scores, (B, K, S*S)), (0, 2, 1))
  loss = cross_entropy(logits, reshape(labels, (B, S*S)), ignore_index = -1)
  train { optimizer = sgd(lr = 1.0) }",
    )
}

/// A 3-D UNet of two levels (3-D max pooling, transposed convolution, skip), one
/// convolution a level.
const UNET3D_SMALL: &str = "model unet3d_small {
  dim B = 1, S = 24, F = 2
  input volume: [B, 1, S, S, S]
  param c1: conv3d(1, F, 3, bias = true)
  param c2: conv3d(F, 2*F, 3, bias = true)
  param t: conv_transpose3d(2*F, F, 2, bias = true)
  param c3: conv3d(2*F, 2, 3, bias = true)
  let e1 = relu(conv3d(volume, c1, padding = 1))
  let e2 = relu(conv3d(max_pool3d(e1, 2), c2, padding = 1))
  let u = concat(conv_transpose3d(e2, t, stride = 2), e1, axis = 1)
  output y = conv3d(u, c3, padding = 1)
}";

fn spec(text: &str) -> TileSpec {
    text.parse().unwrap()
}

/// A tiling's shape: pooling factor, halo below and above, window side, tile count.
fn geometry(t: &Tiling) -> (usize, usize, usize, usize, usize) {
    (t.factor, t.lo, t.hi, t.window, t.count())
}

fn tiled(src: &str, options: &Options, side: &str) -> (Compiled, Tiling) {
    match compile_tiled(src, options, &spec(side)) {
        Ok(c) => c,
        Err(memc::CompileError::User(e)) => {
            panic!("{:?}", miette::Report::new(e.with_source("test.mdl", src)))
        }
        Err(memc::CompileError::Internal(e)) => panic!("internal: {e:?}"),
    }
}

/// Seeded values for a whole input of `shape`: normal-ish floats, or class ids below
/// `classes` as bit patterns.
fn data(shape: &[usize], classes: Option<u32>, seed: u32) -> run::Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed)
                .wrapping_mul(2_654_435_761)
                .rotate_left(13)
                ^ seed;
            match classes {
                Some(k) => f32::from_bits(h % k),
                None => (h % 2001) as f32 / 1000.0 - 1.0,
            }
        })
        .collect();
    run::Tensor {
        shape: shape.to_vec(),
        data,
    }
}

/// Writes every parameter of `from` into the same-named parameter of `to`.
fn copy_params(from: &CpuExecutor, to: &mut CpuExecutor) {
    let params = to.plan().params.clone();
    for p in params {
        let src = from
            .plan()
            .params
            .iter()
            .find(|q| q.name == p.name)
            .unwrap();
        let values = from.read(src.buffer).into_owned();
        to.write(p.buffer, &values).unwrap();
    }
}

/// The whole input's outputs for `inputs` from a plan compiled without tiling.
fn whole_outputs(c: &Compiled, ex: &mut CpuExecutor, inputs: &[(String, run::Tensor)]) -> Vec<f32> {
    for b in c.plan.plan().inputs.clone() {
        let x = &inputs.iter().find(|(n, _)| *n == b.name).unwrap().1;
        ex.bind_input(b.buffer, x.data.clone()).unwrap();
    }
    ex.run_step(None).unwrap();
    ex.output("y").unwrap().into_owned()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Tiled inference of `src` with tiles of `side` equals the whole input's to the bit, and
/// differs by more than `off` with the windows pushed `shift` voxels forward (so each
/// window misses that much of the halo before its tile).
fn assert_tiled_inference_exact(
    src: &str,
    side: &str,
    inputs: &[(String, run::Tensor)],
    (shift, off): (usize, f32),
) {
    let whole = common::compiled(src);
    let mut wx = CpuExecutor::new(&whole.plan).unwrap();
    wx.init_params(7).unwrap();
    let expected = whole_outputs(&whole, &mut wx, inputs);
    let (c, tiling) = tiled(src, &Options::default(), side);
    let mut tx = CpuExecutor::new(&c.plan).unwrap();
    copy_params(&wx, &mut tx);
    let got = run::infer(&mut tx, &c.plan, &tiling, inputs).unwrap();
    assert_eq!(
        got[0].1.shape,
        whole.plan.plan().buffers[whole.plan.plan().outputs[0].1.index()]
            .ty
            .shape
    );
    let exact = max_abs_diff(&got[0].1.data, &expected);
    let short = Tiling {
        lo: tiling.lo - shift,
        ..tiling.clone()
    };
    let got = run::infer(&mut tx, &c.plan, &short, inputs).unwrap();
    let short = max_abs_diff(&got[0].1.data, &expected);
    assert_eq!(exact, 0.0, "{side}: tiled differs from whole by {exact}");
    assert!(
        short > off,
        "{side}: a halo {shift} short still matched ({short})"
    );
}

/// Tiled 2-D inference equals the whole image's to the bit, with tiles that divide the side
/// and tiles that do not (the last tile along each axis pushed inward to end at the border,
/// keeping the voxels the others leave).
#[test]
fn tiled_2d_inference_equals_the_whole_image() {
    let src = unet2d_inference();
    let inputs = vec![("image".to_string(), data(&[1, 2, 64, 64], None, 1))];
    let (_, tiling) = tiled(&src, &Options::default(), "S=8");
    // Two 3x3 convolutions (2), pooled, two more and a dilated one (2*(2+2)), transposed
    // (+1: its sibling's cell), two more at full resolution (2): 13, rounded up to the
    // pooling factor 2.
    assert_eq!(geometry(&tiling), (2, 14, 14, 36, 64));
    assert_tiled_inference_exact(&src, "S=8", &inputs, (8, 1e-4));
    let (_, tiling) = tiled(&src, &Options::default(), "S=12");
    // 64 = 5 x 12 + 4: six tiles an axis, the last keeping 4.
    assert_eq!(geometry(&tiling), (2, 14, 14, 40, 36));
    assert_eq!(tiling.last(), 4);
    assert_tiled_inference_exact(&src, "S=12", &inputs, (8, 1e-4));
}

/// The same in 3-D, on a side the tile divides (24) and on one it does not (26).
#[test]
fn tiled_3d_inference_equals_the_whole_volume() {
    let inputs = vec![("volume".to_string(), data(&[1, 1, 24, 24, 24], None, 3))];
    let (_, tiling) = tiled(UNET3D_SMALL, &Options::default(), "S=8");
    assert_eq!(geometry(&tiling), (2, 6, 6, 20, 27));
    assert_eq!(tiling.input_bytes, 24 * 24 * 24 * 4);
    assert_eq!(tiling.output_bytes, 2 * 24 * 24 * 24 * 4);
    assert_tiled_inference_exact(UNET3D_SMALL, "S=8", &inputs, (2, 1e-3));
    let src = UNET3D_SMALL.replace("S = 24", "S = 26");
    let inputs = vec![("volume".to_string(), data(&[1, 1, 26, 26, 26], None, 3))];
    let (_, tiling) = tiled(&src, &Options::default(), "S=8");
    // 26 = 3 x 8 + 2.
    assert_eq!(geometry(&tiling), (2, 6, 6, 20, 64));
    assert_tiled_inference_exact(&src, "S=8", &inputs, (2, 1e-3));
}

/// One training step of `src` over tiles of `side` against the whole input's step, both
/// accumulating `accumulate` micro-batches (`inputs` holding all of them): the losses
/// agree within 1e-5 and every update (SGD with lr 1: minus the gradient) within 1e-3 of
/// the largest update of its parameter.
fn assert_tiled_step_matches(
    src: &str,
    side: &str,
    inputs: &[(String, run::Tensor)],
    accumulate: u32,
) {
    let options = Options {
        accumulate: (accumulate > 1).then_some(accumulate),
        ..Options::default()
    };
    let whole = common::compiled_with(src, &options);
    let mut wx = CpuExecutor::new(&whole.plan).unwrap();
    wx.init_params(11).unwrap();
    let (c, tiling) = tiled(src, &options, side);
    assert_eq!(tiling.targets, Some(("labels".to_string(), -1)));
    let mut tx = CpuExecutor::new(&c.plan).unwrap();
    assert_eq!(
        tx.micro_steps() as usize,
        tiling.count() * accumulate as usize
    );
    copy_params(&wx, &mut tx);
    let before: Vec<(String, Vec<f32>)> = (wx.plan().params.iter())
        .map(|p| (p.name.clone(), wx.read(p.buffer).into_owned()))
        .collect();
    for b in whole.plan.plan().inputs.clone() {
        let x = &inputs.iter().find(|(n, _)| *n == b.name).unwrap().1;
        wx.bind_input(b.buffer, x.data.clone()).unwrap();
    }
    wx.run_step(None).unwrap();
    let whole_loss = wx.output("loss").unwrap()[0];
    let tiled_loss = run::train(&mut tx, &c.plan, &tiling, inputs).unwrap();
    let mut worst = 0.0f32;
    for (name, p0) in &before {
        let find = |ex: &CpuExecutor| {
            let b = ex
                .plan()
                .params
                .iter()
                .find(|q| &q.name == name)
                .unwrap()
                .buffer;
            ex.read(b).into_owned()
        };
        let (pw, pt) = (find(&wx), find(&tx));
        let scale = pw
            .iter()
            .zip(p0)
            .map(|(a, b)| (a - b).abs())
            .fold(1e-3, f32::max);
        let gw: Vec<f32> = pw.iter().zip(p0).map(|(a, b)| a - b).collect();
        let gt: Vec<f32> = pt.iter().zip(p0).map(|(a, b)| a - b).collect();
        worst = worst.max(max_abs_diff(&gw, &gt) / scale);
    }
    let loss = (whole_loss - tiled_loss).abs();
    assert!(loss < 1e-5, "{side}: loss {whole_loss} vs {tiled_loss}");
    assert!(
        worst < 1e-3,
        "{side}: tiled updates differ from whole by {worst} (relative)"
    );
}

/// The 2-D UNet's image and labels, `batches` micro-batches of them.
fn unet2d_inputs(batches: usize, labels_seed: u32) -> Vec<(String, run::Tensor)> {
    let mut image = data(&[batches, 2, 64, 64], None, 5);
    let mut labels = data(&[batches, 64, 64], Some(3), labels_seed);
    image.shape[0] = 1;
    labels.shape[0] = 1;
    vec![("image".to_string(), image), ("labels".to_string(), labels)]
}

#[test]
fn tiled_training_step_equals_the_whole_image_step() {
    let (_, tiling) = tiled(&unet2d_training(), &Options::default(), "S=8");
    assert_eq!((tiling.count(), tiling.window), (64, 36));
    assert_tiled_step_matches(&unet2d_training(), "S=8", &unet2d_inputs(1, 9), 1);
}

/// The 256^3 case study of the README: the tileable 3-D UNet's window plans, exact bytes.
#[test]
fn case_study_tiles_of_the_256_cube() {
    let src = common::example("unet3d_tileable");
    let options = Options {
        checkpoint: memc::budget::CheckpointMode::parse("block").unwrap(),
        precision: Some(memc::settings::Precision::Bf16),
        ..Options::default()
    };
    let keep_all = Options {
        checkpoint: memc::budget::CheckpointMode::parse("none").unwrap(),
        ..Options::default()
    };
    let whole = common::compiled_with(&src, &keep_all);
    assert_eq!(whole.plan.plan().arena_bytes, 25_283_356_420);
    // unet3d.mdl's 5,601,220 less its 14 batch norms' weights and biases (2 x 1,408
    // channels), plus the 14 convolutions' biases (1,408).
    assert_eq!(whole.plan.plan().report.param_count, 5_599_812);
    let (c, _) = tiled(&src, &keep_all, "S=64");
    assert_eq!(c.plan.plan().arena_bytes, 8_283_621_124);
    let whole = common::compiled_with(&src, &options);
    assert_eq!(whole.plan.plan().arena_bytes, 9_538_050_308);
    let rows = [
        ("S=128", 7_893_360_900u64, 8, 240),
        ("S=88", 4_605_712_900, 27, 200),
        ("S=64", 3_167_240_452, 64, 176),
        ("S=48", 2_401_904_900, 216, 160),
        ("S=32", 1_775_300_868, 512, 144),
    ];
    for (side, arena, count, window) in rows {
        let (c, t) = tiled(&src, &options, side);
        assert_eq!(
            (c.plan.plan().arena_bytes, t.count(), t.window),
            (arena, count, window),
            "{side}"
        );
        assert_eq!(
            (t.lo, t.hi, t.factor, t.input_bytes),
            (56, 56, 8, 134_217_728)
        );
    }
    let budgeted = Options {
        budget: Some(4 << 30),
        ..options
    };
    let (c, t) = tiled(&src, &budgeted, "S=auto");
    assert_eq!((t.tile, c.plan.plan().arena_bytes), (64, 3_167_240_452));
    // 88 (three tiles an axis, the last keeping 80) fits 4.5 GiB: fewer tiles, less work.
    let budgeted = Options {
        budget: Some(9 << 29),
        ..budgeted
    };
    let (c, t) = tiled(&src, &budgeted, "S=auto");
    assert_eq!(
        (t.tile, t.last(), c.plan.plan().arena_bytes),
        (88, 80, 4_605_712_900)
    );
}

/// Every model of tests/tiling/ is refused under its first line's `--tile` with a
/// diagnostic (exit 2, a help line, the op at fault under its source line).
#[test]
fn refusal_corpus() {
    insta::glob!("tiling", "*.mdl", |path| {
        let text = std::fs::read_to_string(path).unwrap();
        let flags: Vec<&str> = text
            .lines()
            .next()
            .unwrap()
            .trim_start_matches("# memc check")
            .split_whitespace()
            .collect();
        let rel = path
            .strip_prefix(std::path::Path::new(env!("CARGO_MANIFEST_DIR")))
            .unwrap();
        let mut args = vec!["check", rel.to_str().unwrap()];
        args.extend(flags);
        let out = common::memc(&args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{}: {stderr}", path.display());
        assert!(
            stderr.contains("help:") && !stderr.contains("panicked"),
            "{stderr}"
        );
        insta::assert_snapshot!("stderr", stderr);
    });
}

/// `memc compile --tile` prints the window's report and the tiling: tiles, windows, halo,
/// the recompute of overlapping windows, the whole tensors beside the arena.
#[test]
fn compile_reports_the_tiling() {
    let path = common::scratch("tiling-report").join("unet3d_small.mdl");
    std::fs::write(&path, UNET3D_SMALL).unwrap();
    let report =
        |tile: &str| common::stdout_of(&["compile", path.to_str().unwrap(), "--tile", tile]);
    let stdout = report("S=8");
    assert!(
        stdout.contains("tiling: S = 24^3 cut into 27 tiles of 8^3 (3 per axis); windows of 20^3 (halo 6 before, 6 after, grid factor 2)"),
        "{stdout}"
    );
    // 27 windows of 20^3 over 24^3 voxels: 2.5^3 - 1.
    assert!(
        stdout.contains("tiling: overlapping windows recompute 1462.50% of the voxel work; beside the arena, whole inputs 55296 B, whole outputs 110592 B"),
        "{stdout}"
    );
    let stdout = report("S=10");
    assert!(
        stdout.contains("tiling: S = 24^3 cut into 27 tiles of 10^3 (3 per axis, the last keeping 4 of its tile); windows of 22^3"),
        "{stdout}"
    );
    std::fs::write(&path, VALID2D).unwrap();
    let stdout = report("S=16");
    assert!(
        stdout.contains("tiling: S = 64^2 (output 60^2: unpadded convolutions drop 4 at the end) cut into 16 tiles of 16^2 (4 per axis, the last keeping 12 of its tile); windows of 28^2 (halo 4 before, 8 after, grid factor 2)"),
        "{stdout}"
    );
}

/// The `step N loss X` lines of `memc run` on `path` with `extra` flags.
fn run_losses(path: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["run", path.to_str().unwrap(), "--steps", "3"];
    args.extend(extra);
    common::step_lines(&common::stdout_of(&args))
}

/// `memc run --tile` trains over tiles from the same seeded parameters and whole inputs as
/// `memc run`: three steps print the same losses (to the printed digits).
#[test]
fn run_trains_over_tiles_as_over_the_whole_image() {
    let path = common::scratch("tiling-run-train").join("unet2d.mdl");
    std::fs::write(&path, unet2d_training().replace("lr = 1.0", "lr = 0.1")).unwrap();
    let whole = run_losses(&path, &[]);
    assert_eq!(whole.len(), 3, "{whole:?}");
    assert_eq!(run_losses(&path, &["--tile", "S=8"]), whole);
    // Tiles that do not divide 64, each step accumulating two micro-batches.
    let whole = run_losses(&path, &["--accumulate", "2"]);
    assert_eq!(whole.len(), 3, "{whole:?}");
    assert_eq!(
        run_losses(&path, &["--tile", "S=12", "--accumulate", "2"]),
        whole
    );
}

/// `memc run --tile --dump` writes the whole output, equal to the untiled run's.
#[test]
fn run_infers_over_tiles_into_the_whole_output() {
    let dir = common::scratch("tiling-run-infer");
    let path = dir.join("unet3d_small.mdl");
    std::fs::write(&path, UNET3D_SMALL).unwrap();
    let read = |sub: &str, tile: &[&str]| {
        let out_dir = dir.join(sub);
        let mut args = vec![
            "run",
            path.to_str().unwrap(),
            "--dump",
            out_dir.to_str().unwrap(),
        ];
        args.extend(tile);
        common::assert_success(&common::memc(&args));
        let bytes = std::fs::read(out_dir.join("output.y.npy")).unwrap();
        match memc::exec::io::read_npy(&bytes).unwrap() {
            memc::exec::io::TensorData::F32(shape, v) => (shape, v),
            other => panic!("not f32: {other:?}"),
        }
    };
    let (whole_shape, whole) = read("whole", &[]);
    let (shape, tiled) = read("tiled", &["--tile", "S=8"]);
    assert_eq!(
        (shape, whole_shape.clone()),
        (vec![1, 2, 24, 24, 24], whole_shape)
    );
    assert_eq!(max_abs_diff(&tiled, &whole), 0.0);
}

/// A 2-D network of unpadded (`valid`) convolutions around a padded one: 64^2 in, 60^2 out,
/// each output voxel standing for the input voxel of its first tap.
const VALID2D: &str = "model valid2d {
  dim B = 1, S = 64, F = 4
  input image: [B, 2, S, S]
  param c1: conv2d(2, F, 3, bias = true)
  param c2: conv2d(F, 2*F, 3, bias = true)
  param t: conv_transpose2d(2*F, F, 2, bias = true)
  param c3: conv2d(F, 3, 3, bias = true)
  let e = relu(conv2d(image, c1))
  let d = relu(conv2d(max_pool2d(e, 2), c2, padding = 1))
  let u = relu(conv_transpose2d(d, t, stride = 2))
  output y = conv2d(u, c3)
}";

/// Unpadded convolutions tile for inference: the output covers the input's first voxels
/// (60 of 64 here, 34 of 36 in 3-D), tiles cut the output, and the whole output is the
/// whole input's to the bit, with tiles that divide it and tiles that do not.
#[test]
fn tiled_inference_of_unpadded_networks_equals_the_whole_input() {
    let inputs = vec![("image".to_string(), data(&[1, 2, 64, 64], None, 7))];
    for (side, count) in [("S=12", 25), ("S=16", 16)] {
        let (_, tiling) = tiled(VALID2D, &Options::default(), side);
        // Reads 1 voxel before (the padded convolution, on the pooled grid: 2), 2 + 2 +
        // 2 after (each unpadded 3x3, the pooled one on cells of 2) and the transposed
        // convolution's sibling: rounded up to the grid factor 2.
        assert_eq!(
            (tiling.extent, tiling.lo, tiling.hi, tiling.count()),
            (60, 4, 8, count)
        );
        assert_tiled_inference_exact(VALID2D, side, &inputs, (4, 1e-4));
    }
    let src = "model valid3d {
  dim B = 1, S = 36, F = 2
  input volume: [B, 1, S, S, S]
  param c1: conv3d(1, F, 3, bias = true)
  param t: conv_transpose3d(F, F, 2, bias = true)
  param c2: conv3d(F, 2, 3, bias = true)
  let p = max_pool3d(relu(conv3d(volume, c1)), 2)
  output y = conv3d(relu(conv_transpose3d(p, t, stride = 2)), c2, padding = 1)
}";
    let inputs = vec![("volume".to_string(), data(&[1, 1, 36, 36, 36], None, 3))];
    let (_, tiling) = tiled(src, &Options::default(), "S=8");
    // 34 = 4 x 8 + 2.
    assert_eq!((tiling.extent, tiling.last(), tiling.count()), (34, 2, 125));
    assert_tiled_inference_exact(src, "S=8", &inputs, (2, 1e-4));
}

/// Training over tiles that do not divide the side: the last tiles keep fewer voxels, and
/// each voxel's loss still counts once and alike.
#[test]
fn tiled_2d_training_over_tiles_not_dividing_the_side() {
    assert_tiled_step_matches(&unet2d_training(), "S=12", &unet2d_inputs(1, 9), 1);
}

/// The same in 3-D: the small 3-D UNet trained on a per-voxel cross-entropy over a 26^3
/// volume in tiles of 8 (three of 8 and a last keeping 2 an axis), its labels holding the
/// ignored id.
#[test]
fn tiled_3d_training_over_tiles_not_dividing_the_side() {
    let src = UNET3D_SMALL.replace("S = 24", "S = 26").replace(
        "  output y = conv3d(u, c3, padding = 1)",
        "  input labels: i32[B, S, S, S]
  let scores = conv3d(u, c3, padding = 1)
  let logits = permute(reshape(scores, (B, 2, S*S*S)), (0, 2, 1))
  loss = cross_entropy(logits, reshape(labels, (B, S*S*S)), ignore_index = -1)
  train { optimizer = sgd(lr = 1.0) }",
    );
    let mut labels = data(&[1, 26, 26, 26], Some(2), 17);
    for i in (0..26 * 26 * 26).step_by(5) {
        labels.data[i] = f32::from_bits(-1i32 as u32);
    }
    let inputs = vec![
        ("volume".to_string(), data(&[1, 1, 26, 26, 26], None, 3)),
        ("labels".to_string(), labels),
    ];
    assert_tiled_step_matches(&src, "S=8", &inputs, 1);
}

/// `--tile` with `--accumulate 2`: one step over both micro-batches' tiles, the update
/// once, as the untiled accumulated step; the targets holding the ignored id too (each
/// micro-batch's mean divides by its own kept voxels).
#[test]
fn tiled_training_accumulates_micro_batches_over_tiles() {
    let mut inputs = unet2d_inputs(2, 13);
    for i in (0..2 * 64 * 64).step_by(7) {
        inputs[1].1.data[i] = f32::from_bits(-1i32 as u32);
    }
    assert_tiled_step_matches(&unet2d_training(), "S=12", &inputs, 2);
}
