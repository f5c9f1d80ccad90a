//! Tensor parallelism, Megatron's split: T tensor ranks (and data x tensor ranks) train as one
//! rank does up to fp32 summation order, replicated parameters stay bitwise identical, each
//! rank's split parameters are exact bytes, and the refusals name the op.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled_with, example, overrides};
use memc::exec::ranks::Ranks;
use memc::parallel::Parallel;
use memc::settings::Precision;
use memc::{compile, CompileError, Options};

const GPT: &[(&str, i64)] = common::PARALLEL_GPT;
const LLAMA: &[(&str, i64)] = common::PARALLEL_LLAMA;

/// `dims` at batch `batch` in `precision` over `layout` (`data x tensor`, ZeRO `zero`; the
/// batch split over the data ranks).
fn layout(
    dims: &[(&str, i64)],
    batch: i64,
    precision: Precision,
    split: (u32, u32, u8),
) -> Options {
    let mut dims = dims.to_vec();
    dims.push(("B", batch));
    let (data, tensor, zero) = split;
    Options {
        overrides: overrides(&dims),
        precision: Some(precision),
        parallel: (data * tensor > 1).then_some(Parallel {
            data,
            tensor,
            zero,
            global_batch: true,
            ..Parallel::default()
        }),
        ..Options::default()
    }
}

/// The ranks of `model` under `options` after `steps` steps from seed 3, and the losses.
fn trained(model: &str, options: &Options, steps: usize) -> (Ranks, Vec<f32>) {
    let c = compiled_with(&example(model), options);
    let mut ranks = Ranks::new(&c.plan).unwrap();
    ranks.start(3).unwrap();
    let losses = (0..steps)
        .map(|_| {
            ranks
                .run_step()
                .unwrap()
                .unwrap_or_else(|| panic!("{model}: no loss"))
        })
        .collect();
    (ranks, losses)
}

/// Tensor = 2 and data = 2 x tensor = 2 (every ZeRO stage) print the losses of one rank
/// with the whole batch on a small GPT-2 and a small LLaMA with grouped-query attention,
/// within fp32 summation order (the row-parallel matmuls' partial sums are added across
/// ranks), and in bf16 within its rounding.
#[test]
fn tensor_ranks_train_as_one_rank() {
    for (model, dims) in [("gpt2", GPT), ("llama7b", LLAMA)] {
        for (precision, tolerance) in [(Precision::Fp32, 2e-6), (Precision::Bf16, 5e-5)] {
            let (_, one) = trained(model, &layout(dims, 4, precision, (1, 1, 0)), 3);
            let mut splits = vec![(1, 2, 0)];
            splits.extend((0..=3).map(|zero| (2, 2, zero)));
            for split in splits {
                let (_, many) = trained(model, &layout(dims, 4, precision, split), 3);
                let what = format!("{model} {precision:?} {split:?}");
                common::assert_losses_close(&one, &many, tolerance, &what);
            }
        }
    }
}

/// After two steps a replica's tensor ranks hold the same bits of every replicated
/// parameter (norms, embeddings, the loss head, the row-parallel biases) and different
/// slices of every split one.
#[test]
fn tensor_ranks_share_what_is_replicated() {
    let o = layout(GPT, 2, Precision::Fp32, (1, 2, 0));
    let (ranks, _) = trained("gpt2", &o, 2);
    let [first, second] = ranks.executors() else {
        panic!("not two ranks");
    };
    let plan = ranks.executors()[0].plan().clone();
    let mut split = 0;
    for p in &plan.params {
        let bits = |ex: &memc::exec::cpu::CpuExecutor| -> Vec<u32> {
            ex.read(p.buffer).iter().map(|v| v.to_bits()).collect()
        };
        assert_eq!(
            bits(first) == bits(second),
            p.tensor_split.is_none(),
            "{}",
            p.name
        );
        split += usize::from(p.tensor_split.is_some());
    }
    // Per layer: qkv weight and bias, proj weight, fc weight and bias, fc_proj weight.
    assert_eq!(split, 2 * 6);
}

/// Exact per-rank bytes of the small GPT-2 over tensor = 2 in fp32: the split weights and
/// biases are halved, the embedding, positions, norms and row-parallel biases whole.
#[test]
fn split_parameters_are_exact_bytes() {
    let (d, v, t, layers) = (64u64, 128u64, 16u64, 2u64);
    let whole = v * d + t * d + 2 * d + layers * (2 * 2 * d + 2 * d);
    let split = layers * (d * 3 * d + 3 * d + d * d + d * 4 * d + 4 * d + 4 * d * d);
    let per_rank = whole + split / 2;
    assert_eq!(per_rank, 59_712);
    for tensor in [2, 1] {
        let o = layout(GPT, 2, Precision::Fp32, (1, tensor, 0));
        let c = compiled_with(&example("gpt2"), &o);
        let r = &c.plan.plan().report;
        let params = whole + split / u64::from(tensor);
        assert_eq!(r.bytes.params, 4 * params, "tensor = {tensor}");
        assert_eq!(r.bytes.grads, 4 * params, "tensor = {tensor}");
        assert_eq!(r.bytes.optimizer, 8 * params, "tensor = {tensor}");
        if let Some(p) = &r.parallel {
            assert_eq!((p.tensor, p.per_rank.len()), (2, 2));
            assert!(p.per_rank.iter().all(|e| e.bytes == p.per_rank[0].bytes));
            assert_eq!(
                p.per_rank[1].role,
                "tensor-parallel 1/2 slice, data-parallel replica"
            );
            assert_eq!(p.per_rank[0].bytes.params, 238_848);
        }
    }
}

/// The heads, the key/value heads and the MLP width must divide by the tensor ranks: the
/// refusal names the op and its line.
#[test]
fn undivisible_splits_are_refused() {
    for (dims, tensor, message) in [
        (
            LLAMA,
            4,
            "does not divide the 2 key/value heads of this `attention`",
        ),
        (GPT, 8, "does not divide the 4 heads of this `attention`"),
        (
            &[
                ("L", 1),
                ("D", 64),
                ("T", 16),
                ("V", 128),
                ("H", 4),
                ("KV", 4),
                ("F", 90),
            ][..],
            4,
            "does not divide the 90 output columns",
        ),
    ] {
        let model = if dims.len() == GPT.len() {
            "gpt2"
        } else {
            "llama7b"
        };
        let o = layout(dims, 2, Precision::Fp32, (1, tensor, 0));
        match compile(&example(model), &o) {
            Err(CompileError::User(e)) => {
                assert!(e.message.contains(message), "{}", e.message);
                assert!(e.span.is_some(), "{}", e.message);
            }
            Err(e) => panic!("{model}: not a user error: {e:?}"),
            Ok(_) => panic!("{model} over tensor = {tensor} compiled"),
        }
    }
}

/// `memc run --parallel tensor=2` and `data=2,tensor=2` print the per-step loss lines of
/// one rank (to the printed digits), and `--device cuda` refuses them with exit 2.
#[test]
fn the_command_line_runs_tensor_ranks() {
    let run = |extra: &[&str]| {
        let dims: Vec<String> = (LLAMA.iter().chain(&[("B", 2)]))
            .flat_map(|(k, v)| ["--set".to_string(), format!("{k}={v}")])
            .collect();
        let mut args = vec!["run", "examples/llama7b.mdl", "--steps", "2"];
        args.extend(dims.iter().map(String::as_str));
        args.extend(extra);
        common::step_lines(&common::stdout_of(&args))
    };
    let one = run(&[]);
    assert_eq!(one.len(), 2);
    assert_eq!(run(&["--parallel", "tensor=2"]), one);
    assert_eq!(run(&["--parallel", "data=2,tensor=2,batch=global"]), one);
    let cuda = common::memc(&[
        "run",
        "examples/llama7b.mdl",
        "--parallel",
        "tensor=2",
        "--device",
        "cuda",
    ]);
    assert_eq!(cuda.status.code(), Some(2));
}

/// A matmul whose output also reaches the loss directly cannot run split: its weight (and
/// the row weight after it, now fed a whole value) stay whole on every rank, the other
/// pair splits, and the ranks still train as one.
#[test]
fn a_region_that_escapes_stays_whole() {
    let src = "model m {
  dim B = 4, D = 8, F = 16
  input x: [B, D]
  param w1: [D, F] = normal(0.5)
  param w2: [F, D] = normal(0.5)
  param w3: [D, F] = normal(0.5)
  param w4: [F, D] = normal(0.5)
  let h = x @ w3
  let y = relu(x @ w1) @ w2 + relu(h) @ w4
  loss = mean(y * y) + mean(h)
  train {
    optimizer = adamw(lr = 1e-2)
  }
}";
    let run = |tensor: u32| {
        let o = layout(&[], 4, Precision::Fp32, (1, tensor, 0));
        let c = compiled_with(src, &o);
        let split: Vec<String> = (c.plan.plan().params.iter())
            .filter(|p| p.tensor_split.is_some())
            .map(|p| p.name.clone())
            .collect();
        let mut ranks = Ranks::new(&c.plan).unwrap();
        ranks.start(1).unwrap();
        let losses: Vec<f32> = (0..3).map(|_| ranks.run_step().unwrap().unwrap()).collect();
        (split, losses)
    };
    let (none, one) = run(1);
    let (split, two) = run(2);
    assert!(none.is_empty());
    assert_eq!(split, ["w1", "w2"]);
    for (a, b) in one.iter().zip(&two) {
        assert!((a - b).abs() <= 2e-6 * a.abs(), "{a} vs {b}");
    }
}
