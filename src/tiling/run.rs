//! Running a window's plan over the whole input on the CPU reference backend: inference
//! tile by tile into whole outputs, training as one step accumulated over the tiles.

use super::windows::{copy_box, spans, Span1};
use super::Tiling;
use crate::exec::cpu::CpuExecutor;
use crate::exec::ExecError;
use crate::plan::VerifiedPlan;

/// A whole tensor (every tiled axis `side` long): its shape and row-major values (i32 ids
/// as their bit patterns).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Every tile's window along each tiled axis, tiles in row-major order of their positions.
fn tiles(t: &Tiling) -> Vec<Vec<Span1>> {
    let axis = spans(t.side, t.tile, t.window, t.lo);
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

/// Per dim of a tensor with tiled dims `dims`: the offset `pick` gives a tiled dim's span
/// (0 elsewhere) and the extent (`side` along tiled dims, the dim's own elsewhere).
fn boxed(
    shape: &[usize],
    dims: &[Option<usize>],
    tile: &[Span1],
    pick: impl Fn(Span1) -> usize,
    side: usize,
) -> (Vec<usize>, Vec<usize>) {
    let at = dims
        .iter()
        .map(|d| d.map_or(0, |a| pick(tile[a])))
        .collect();
    let extent = shape
        .iter()
        .zip(dims)
        .map(|(&e, d)| if d.is_some() { side } else { e })
        .collect();
    (at, extent)
}

/// The window of input `name` for `tile`: the whole input's voxels under the window, or for
/// the loss's targets only the tile's own voxels, the halo holding the ignored id.
fn window_of(
    t: &Tiling,
    name: &str,
    whole: &Tensor,
    tile: &[Span1],
) -> Result<Vec<f32>, ExecError> {
    let dims = t.input_dims(name);
    if dims.len() != whole.shape.len()
        || whole
            .shape
            .iter()
            .zip(dims)
            .any(|(&e, d)| d.is_some() && e != t.side)
    {
        return Err(ExecError::Shape(format!(
            "`{name}` is {:?}, and its tiled dims must be {} long",
            whole.shape, t.side
        )));
    }
    let shape: Vec<usize> = (whole.shape.iter().zip(dims))
        .map(|(&e, d)| if d.is_some() { t.window } else { e })
        .collect();
    let n: usize = shape.iter().product();
    match &t.targets {
        Some((target, id)) if target == name => {
            let mut out = vec![f32::from_bits(*id as u32); n];
            let (from_at, extent) = boxed(&whole.shape, dims, tile, |s| s.at, t.tile);
            let (to_at, _) = boxed(&whole.shape, dims, tile, |s| s.at - s.start, t.tile);
            copy_box(
                (&whole.data, &whole.shape, &from_at),
                (&mut out, &shape, &to_at),
                &extent,
            );
            Ok(out)
        }
        _ => {
            let mut out = vec![0.0; n];
            let (from_at, extent) = boxed(&whole.shape, dims, tile, |s| s.start, t.window);
            let zero = vec![0; shape.len()];
            copy_box(
                (&whole.data, &whole.shape, &from_at),
                (&mut out, &shape, &zero),
                &extent,
            );
            Ok(out)
        }
    }
}

/// The whole inputs as the plan's inputs, in its order.
fn named<'a>(
    plan: &VerifiedPlan,
    inputs: &'a [(String, Tensor)],
) -> Result<Vec<(crate::plan::BufferId, &'a str, &'a Tensor)>, ExecError> {
    plan.plan()
        .inputs
        .iter()
        .map(|b| {
            inputs
                .iter()
                .find(|(n, _)| *n == b.name)
                .map(|(n, x)| (b.buffer, n.as_str(), x))
                .ok_or_else(|| ExecError::Shape(format!("input `{}` is not given", b.name)))
        })
        .collect()
}

/// Runs the inference plan of `exec` (parameters already set) on every tile's window of
/// `inputs`, writing each tile of every output into its whole tensor.
pub fn infer(
    exec: &mut CpuExecutor,
    plan: &VerifiedPlan,
    t: &Tiling,
    inputs: &[(String, Tensor)],
) -> Result<Vec<(String, Tensor)>, ExecError> {
    let bound = named(plan, inputs)?;
    let mut outputs: Vec<(String, Vec<usize>, Tensor)> = Vec::new();
    for (name, dims) in &t.outputs {
        let b = plan.plan().outputs.iter().find(|(n, _)| n == name);
        let b = b.ok_or_else(|| ExecError::Shape(format!("no output `{name}` in the plan")))?;
        let window = plan.plan().buffers[b.1.index()].ty.shape.clone();
        let shape = t.whole_shape(dims, &window);
        let data = vec![0.0; shape.iter().product()];
        outputs.push((name.clone(), window, Tensor { shape, data }));
    }
    for tile in tiles(t) {
        for &(b, name, whole) in &bound {
            let words = window_of(t, name, whole, &tile)?;
            exec.bind_input(b, words)?;
        }
        exec.run_step(None)?;
        for ((name, dims), (_, shape, whole)) in t.outputs.iter().zip(outputs.iter_mut()) {
            let window = exec
                .output(name)
                .ok_or_else(|| ExecError::Shape(format!("no output `{name}`")))?
                .into_owned();
            let (from_at, extent) = boxed(&whole.shape, dims, &tile, |s| s.at - s.start, t.tile);
            let (to_at, _) = boxed(&whole.shape, dims, &tile, |s| s.at, t.tile);
            copy_box(
                (&window, shape, &from_at),
                (&mut whole.data, &whole.shape, &to_at),
                &extent,
            );
        }
    }
    Ok(outputs.into_iter().map(|(n, _, t)| (n, t)).collect())
}

/// Runs one training step of the plan of `exec` (compiled with one micro-step per tile)
/// over every tile's window of `inputs`: the gradients accumulate over the tiles, then one
/// update. Returns the step's loss, the mean of the tiles' losses.
pub fn train(
    exec: &mut CpuExecutor,
    plan: &VerifiedPlan,
    t: &Tiling,
    inputs: &[(String, Tensor)],
) -> Result<f32, ExecError> {
    let bound = named(plan, inputs)?;
    if let Some((name, id)) = &t.targets {
        let ignored = *id as u32;
        let held = bound.iter().find(|(_, n, _)| n == name);
        if held.is_some_and(|(_, _, x)| x.data.iter().any(|v| v.to_bits() == ignored)) {
            return Err(ExecError::Unsupported(format!(
                "`{name}` holds the ignored id {id}: each tile's loss is the mean over its own voxels, so tiles with ignored voxels would weigh the rest unequally; train over tiles on targets without it"
            )));
        }
    }
    let all = tiles(t);
    if exec.micro_steps() as usize != all.len() {
        return Err(ExecError::Shape(format!(
            "the plan runs {} micro-steps, and the input has {} tiles",
            exec.micro_steps(),
            all.len()
        )));
    }
    for &(b, name, whole) in &bound {
        let mut words = Vec::new();
        for tile in &all {
            words.extend(window_of(t, name, whole, tile)?);
        }
        exec.bind_input(b, words)?;
    }
    exec.run_step(None)?;
    Ok(exec.output("loss").map_or(f32::NAN, |l| l[0]))
}
