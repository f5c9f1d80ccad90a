//! Running a window's plan over the whole input on the CPU reference backend: inference
//! tile by tile into whole outputs, training as one step accumulated over the tiles.

use super::windows::{copy_box, spans, Span1};
use super::{Tiling, KEPT};
use crate::exec::cpu::CpuExecutor;
use crate::exec::ExecError;
use crate::plan::VerifiedPlan;

/// A whole tensor (every tiled axis `side` long): its shape and row-major values (i32 ids
/// as their bit patterns); for a training step that accumulates micro-batches, every
/// micro-batch's values one after another.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Every tile's window along each tiled axis, tiles in row-major order of their positions.
fn tiles(t: &Tiling) -> Vec<Vec<Span1>> {
    let axis = spans(t.side, t.extent, t.tile, t.window, t.lo);
    let mut all = vec![Vec::new()];
    for _ in 0..t.axes {
        all = all
            .into_iter()
            .flat_map(|prefix| {
                axis.iter().map(move |&s| {
                    let mut p = prefix.clone();
                    p.push(s);
                    p
                })
            })
            .collect();
    }
    all
}

/// Per dim of a tensor of `shape` with tiled dims `dims`: the offset `pick` gives a tiled
/// dim's span (0 elsewhere) and the extent `extent` gives it (the dim's own elsewhere).
fn boxed(
    shape: &[usize],
    dims: &[Option<usize>],
    tile: &[Span1],
    pick: impl Fn(Span1) -> usize,
    extent: impl Fn(Span1) -> usize,
) -> (Vec<usize>, Vec<usize>) {
    let at = dims
        .iter()
        .map(|d| d.map_or(0, |a| pick(tile[a])))
        .collect();
    let extent = shape
        .iter()
        .zip(dims)
        .map(|(&e, d)| d.map_or(e, |a| extent(tile[a])))
        .collect();
    (at, extent)
}

/// The window of input `name` (one micro-batch of it, `data` of the whole `shape`) for
/// `tile`: the whole input's voxels under the window, or for the loss's targets only the
/// voxels the tile keeps, the rest holding the ignored id.
fn window_of(
    t: &Tiling,
    name: &str,
    (shape, data): (&[usize], &[f32]),
    tile: &[Span1],
) -> Result<Vec<f32>, ExecError> {
    let dims = t.input_dims(name);
    let window: Vec<usize> = (shape.iter().zip(dims))
        .map(|(&e, d)| if d.is_some() { t.window } else { e })
        .collect();
    let n: usize = window.iter().product();
    match &t.targets {
        Some((target, id)) if target == name => {
            let mut out = vec![f32::from_bits(*id as u32); n];
            let (from_at, extent) = boxed(shape, dims, tile, |s| s.at, |s| s.len);
            let (to_at, _) = boxed(shape, dims, tile, |s| s.at - s.start, |s| s.len);
            copy_box(
                (data, shape, &from_at),
                (&mut out, &window, &to_at),
                &extent,
            );
            Ok(out)
        }
        _ => {
            let mut out = vec![0.0; n];
            let (from_at, extent) = boxed(shape, dims, tile, |s| s.start, |_| t.window);
            let zero = vec![0; window.len()];
            copy_box((data, shape, &from_at), (&mut out, &window, &zero), &extent);
            Ok(out)
        }
    }
}

/// The whole inputs as the plan's inputs, in its order (all but [`KEPT`]), each checked to
/// hold `batches` micro-batches whose tiled dims are `side` long.
fn named<'a>(
    plan: &VerifiedPlan,
    t: &Tiling,
    inputs: &'a [(String, Tensor)],
    batches: usize,
) -> Result<Vec<(crate::plan::BufferId, &'a str, &'a Tensor)>, ExecError> {
    let mut out = Vec::new();
    for b in plan.plan().inputs.iter().filter(|b| b.name != KEPT) {
        let Some((name, x)) = inputs.iter().find(|(n, _)| *n == b.name) else {
            return Err(ExecError::Shape(format!("input `{}` is not given", b.name)));
        };
        let dims = t.input_dims(name);
        let whole = dims.len() == x.shape.len()
            && (x.shape.iter().zip(dims)).all(|(&e, d)| d.is_none() || e == t.side);
        if !whole || x.data.len() != x.shape.iter().product::<usize>() * batches {
            return Err(ExecError::Shape(format!(
                "`{name}` is {:?} holding {} values, and must hold {batches} micro-batch(es) whose tiled dims are {} long",
                x.shape,
                x.data.len(),
                t.side
            )));
        }
        out.push((b.buffer, name.as_str(), x));
    }
    Ok(out)
}

/// Runs the inference plan of `exec` (parameters already set) on every tile's window of
/// `inputs`, writing the voxels each tile keeps of every output into its whole tensor.
pub fn infer(
    exec: &mut CpuExecutor,
    plan: &VerifiedPlan,
    t: &Tiling,
    inputs: &[(String, Tensor)],
) -> Result<Vec<(String, Tensor)>, ExecError> {
    let bound = named(plan, t, inputs, 1)?;
    let mut outputs: Vec<(String, Vec<usize>, Tensor)> = Vec::new();
    for (name, dims) in &t.outputs {
        let b = plan.plan().outputs.iter().find(|(n, _)| n == name);
        let b = b.ok_or_else(|| ExecError::Shape(format!("no output `{name}` in the plan")))?;
        let window = plan.plan().buffers[b.1.index()].ty.shape.clone();
        let shape = t.output_shape(dims, &window);
        let data = vec![0.0; shape.iter().product()];
        outputs.push((name.clone(), window, Tensor { shape, data }));
    }
    for tile in tiles(t) {
        for &(b, name, whole) in &bound {
            let words = window_of(t, name, (&whole.shape, &whole.data), &tile)?;
            exec.bind_input(b, words)?;
        }
        exec.run_step(None)?;
        for ((name, dims), (_, shape, whole)) in t.outputs.iter().zip(outputs.iter_mut()) {
            let window = exec
                .output(name)
                .ok_or_else(|| ExecError::Shape(format!("no output `{name}`")))?
                .into_owned();
            let (from_at, extent) = boxed(&whole.shape, dims, &tile, |s| s.at - s.start, |s| s.len);
            let (to_at, _) = boxed(&whole.shape, dims, &tile, |s| s.at, |s| s.len);
            copy_box(
                (&window, shape, &from_at),
                (&mut whole.data, &whole.shape, &to_at),
                &extent,
            );
        }
    }
    Ok(outputs.into_iter().map(|(n, _, t)| (n, t)).collect())
}

/// Runs one training step of the plan of `exec` (compiled with one micro-step per tile of
/// each micro-batch) over every tile's window of `inputs`: the gradients accumulate over
/// the micro-batches' tiles, then one update. Each micro-step's cross-entropy divides by
/// its micro-batch's kept voxels over its tiles ([`KEPT`]), so a micro-batch's tiles add up
/// to its mean over every voxel, whatever each tile keeps. Returns the step's loss, the
/// mean of the micro-batches' losses.
pub fn train(
    exec: &mut CpuExecutor,
    plan: &VerifiedPlan,
    t: &Tiling,
    inputs: &[(String, Tensor)],
) -> Result<f32, ExecError> {
    let bound = named(plan, t, inputs, t.accumulate)?;
    let all = tiles(t);
    if exec.micro_steps() as usize != all.len() * t.accumulate {
        return Err(ExecError::Shape(format!(
            "the plan runs {} micro-steps, and {} micro-batch(es) of {} tiles take {}",
            exec.micro_steps(),
            t.accumulate,
            all.len(),
            all.len() * t.accumulate
        )));
    }
    for &(b, name, whole) in &bound {
        let mut words = Vec::new();
        for batch in whole
            .data
            .chunks(whole.shape.iter().product::<usize>().max(1))
        {
            for tile in &all {
                words.extend(window_of(t, name, (&whole.shape, batch), tile)?);
            }
        }
        exec.bind_input(b, words)?;
    }
    let kept = plan.plan().inputs.iter().find(|b| b.name == KEPT);
    let targets = t.targets.as_ref().and_then(|(name, id)| {
        let x = bound.iter().find(|(_, n, _)| n == name)?.2;
        Some((x, *id as u32))
    });
    let (Some(kept), Some((x, ignored))) = (kept, targets) else {
        return Err(ExecError::Shape(format!(
            "a tiled training plan reads `{KEPT}` and the loss's targets"
        )));
    };
    let mut words = Vec::with_capacity(all.len() * t.accumulate);
    for batch in x.data.chunks(x.shape.iter().product::<usize>().max(1)) {
        let count = batch
            .iter()
            .filter(|v| v.to_bits() != ignored)
            .count()
            .max(1);
        words.extend(std::iter::repeat_n(
            count as f32 / all.len() as f32,
            all.len(),
        ));
    }
    exec.bind_input(kept.buffer, words)?;
    exec.run_step(None)?;
    Ok(exec.output("loss").map_or(f32::NAN, |l| l[0]))
}
