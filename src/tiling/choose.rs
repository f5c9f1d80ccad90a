//! The tile: what the whole model's graph says about tiling it (halo, grid factor, the
//! tiles a side allows), and the window's plan for a given tile or for the fewest tiles
//! that fit the budget.

use super::{tiled_inputs, Tiling};
use crate::diagnostic::UserError;
use crate::ir::{Graph, Op};
use crate::passes::tile::{analyze, Field, Objective, TiledDims};
use crate::{CompileError, Compiled, Options};

/// The whole model's tiling geometry, before a tile is chosen.
#[derive(Debug, Clone)]
pub struct Geometry {
    dim: String,
    side: usize,
    axes: usize,
    inputs: TiledDims,
    field: Field,
    objective: Objective,
    targets: Option<(String, i32)>,
    accumulate: usize,
    input_bytes: u64,
    output_bytes: u64,
    budget: Option<u64>,
}

impl Geometry {
    /// Analyses the model at its own size (`options.overrides` applied) for tiling `dim`.
    pub fn of(source: &str, options: &Options, dim: &str) -> Result<Geometry, CompileError> {
        let ast = crate::front::parse(source)?;
        let module = crate::front::lower(&ast, &options.overrides)?;
        let (inputs, axes) = tiled_inputs(&ast, dim)?;
        let side = dim_value(&module.dims, dim)?;
        let objective = match &module.train {
            Some(_) => Objective::Loss,
            None => Objective::Outputs,
        };
        let accumulate = match &module.train {
            Some(t) => options.accumulate.unwrap_or(t.settings.accumulate).max(1) as usize,
            None => 1,
        };
        let field = analyze(&module.graph, &inputs, side, objective)?;
        if !side.is_multiple_of(field.factor) {
            return Err(UserError::general(
                format!(
                    "{dim} = {side} is not a multiple of the network's grid factor {}: windows pushed to the input's end would not line up with its pooled grids",
                    field.factor
                ),
                format!("choose a side that is a multiple of {}", field.factor),
            )
            .into());
        }
        let targets = match objective {
            Objective::Loss => Some(targets(&module.graph)?),
            Objective::Outputs => None,
        };
        let bytes = |names: &mut dyn Iterator<Item = crate::ir::ValueId>| {
            names.map(|v| module.graph.node(v).ty.bytes()).sum::<u64>()
        };
        let input_bytes = bytes(&mut module.graph.values().filter(|&v| {
            matches!(&module.graph.node(v).op, Op::Input { name, .. }
                if inputs.iter().any(|(n, d)| n == name && d.iter().any(Option::is_some)))
        }));
        let output_bytes = match objective {
            Objective::Outputs => bytes(&mut module.graph.outputs.iter().map(|&(_, v)| v)),
            Objective::Loss => 0,
        };
        let budget = options
            .budget
            .or(module.train.as_ref().and_then(|t| t.settings.budget));
        Ok(Geometry {
            dim: dim.to_string(),
            side,
            axes,
            inputs,
            field,
            objective,
            targets,
            accumulate,
            input_bytes,
            output_bytes,
            budget,
        })
    }

    /// The halo before and after a tile: the receptive field's reach rounded up to the grid
    /// factor, so every window starts on the coarsest grid.
    fn halo(&self) -> (usize, usize) {
        let f = self.field.factor;
        (self.field.lo.div_ceil(f) * f, self.field.hi.div_ceil(f) * f)
    }

    /// The tiling with tiles of `tile`, or why that tile is not one: a multiple of the grid
    /// factor, at most the output's side, whose window fits inside the input.
    fn tiling(&self, tile: usize) -> Result<Tiling, UserError> {
        let (lo, hi) = self.halo();
        let (f, extent) = (self.field.factor, self.field.extent);
        let whole = tile == extent;
        if !self.allows(tile) {
            let most = extent.min(self.side.saturating_sub(lo + hi)) / f * f;
            return Err(UserError::general(
                format!(
                    "a tile of {tile} does not cut {} = {}: tiles must be multiples of the network's grid factor {f}, at most the output's side {extent}, and a tile with its halo ({lo} before, {hi} after) must fit inside the side",
                    self.dim, self.side
                ),
                match most {
                    0 => format!("the only tile is the whole output, {extent}"),
                    most => format!("take a multiple of {f} from {f} to {most}, or the whole output {extent}"),
                },
            ));
        }
        Ok(Tiling {
            dim: self.dim.clone(),
            side: self.side,
            extent,
            tile,
            lo: if whole { 0 } else { lo },
            hi: if whole { 0 } else { hi },
            factor: f,
            window: if whole { self.side } else { tile + lo + hi },
            axes: self.axes,
            inputs: self.inputs.clone(),
            outputs: self.field.outputs.clone(),
            targets: self.targets.clone(),
            accumulate: self.accumulate,
            input_bytes: self.input_bytes,
            output_bytes: self.output_bytes,
        })
    }

    /// Whether tiles of `tile` cut the output: the whole of it, or a multiple of the grid
    /// factor no longer than it whose window fits inside the input (the last tile along an
    /// axis keeps what the others leave).
    fn allows(&self, tile: usize) -> bool {
        let (lo, hi) = self.halo();
        tile == self.field.extent
            || (tile > 0
                && tile.is_multiple_of(self.field.factor)
                && tile <= self.field.extent
                && tile + lo + hi <= self.side)
    }

    /// The tiles `auto` tries, fewest tiles per axis first (the whole output first): for
    /// each count the smallest tile that gives it, whose window is the smallest. The voxel
    /// work of `n` windows an axis, `n * (tile + lo + hi)`, falls with `n`, so the first of
    /// these whose plan fits is the one that repeats the least work.
    pub fn candidates(&self) -> Vec<usize> {
        let (f, extent) = (self.field.factor, self.field.extent);
        (1..=extent.div_ceil(f))
            .map(|n| (n, (extent.div_ceil(n).div_ceil(f) * f).min(extent)))
            .filter(|&(n, t)| extent.div_ceil(t) == n && self.allows(t))
            .map(|(_, t)| t)
            .collect()
    }
}

/// The window's plan for tiles of `side` (None: of the fewest tiles whose plan fits the
/// budget, [`Geometry::candidates`]).
pub fn compile_at(
    source: &str,
    options: &Options,
    g: &Geometry,
    side: Option<usize>,
) -> Result<(Compiled, Tiling), CompileError> {
    if let Some(side) = side {
        let tiling = g.tiling(side)?;
        return Ok((compile_window(source, options, g, &tiling)?, tiling));
    }
    let Some(budget) = g.budget else {
        return Err(UserError::general(
            format!(
                "--tile {}=auto picks the fewest tiles whose plan fits the budget, and none is set",
                g.dim
            ),
            "give --budget SIZE, or a tile side such as --tile S=64",
        )
        .into());
    };
    let mut last = None;
    for side in g.candidates() {
        let tiling = g.tiling(side)?;
        match compile_window(source, options, g, &tiling) {
            Ok(c) if c.plan.plan().report.budgeted_bytes() <= budget => return Ok((c, tiling)),
            Ok(c) => last = Some(c.plan.plan().report.budgeted_bytes()),
            Err(CompileError::User(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Err(UserError::general(
        format!(
            "no tile of {} fits the budget of {budget} B{}",
            g.dim,
            last.map_or(String::new(), |b| format!(" (the smallest window's plan takes {b} B)"))
        ),
        format!(
            "the smallest tile is {} with windows of {}; raise the budget or combine with --checkpoint and --precision",
            g.candidates().last().copied().unwrap_or(g.field.extent),
            g.candidates().last().map_or(g.side, |&t| g.tiling(t).map_or(g.side, |t| t.window))
        ),
    )
    .into())
}

/// The plan of one window (training: one micro-step per tile), after checking that the
/// model at the window's size tiles the same way.
fn compile_window(
    source: &str,
    options: &Options,
    g: &Geometry,
    tiling: &Tiling,
) -> Result<Compiled, CompileError> {
    let mut overrides = options.overrides.clone();
    overrides.push((g.dim.clone(), tiling.window as i64));
    let ast = crate::front::parse(source)?;
    let module = crate::front::lower(&ast, &overrides)?;
    let field = analyze(&module.graph, &g.inputs, tiling.window, g.objective)?;
    if field.factor != g.field.factor || tiling.window - field.extent != g.side - g.field.extent {
        return Err(CompileError::Internal(vec![format!(
            "tiling: the window of {} has grid factor {} and output side {}, the whole input {} and {}",
            tiling.window, field.factor, field.extent, g.field.factor, g.field.extent
        )]));
    }
    let window = match g.objective {
        Objective::Loss => Options {
            overrides,
            accumulate: Some(micro_steps(tiling)?),
            kept_from_input: true,
            ..options.clone()
        },
        Objective::Outputs => Options {
            overrides,
            ..options.clone()
        },
    };
    crate::compile(source, &window)
}

/// The micro-steps of a tiled training step: every micro-batch's tiles, or a user error
/// where they are more than a step counts.
fn micro_steps(t: &Tiling) -> Result<u32, UserError> {
    u32::try_from(t.count() * t.accumulate).map_err(|_| {
        UserError::general(
            format!(
                "tiles of {} cut {} = {}^{} into {} tiles, which over {} micro-batch(es) are more micro-steps than a training step runs ({})",
                t.tile,
                t.dim,
                t.side,
                t.axes,
                t.count(),
                t.accumulate,
                u32::MAX
            ),
            "take larger tiles (or fewer micro-batches)",
        )
    })
}

/// The value of `dim` after overrides, or an error naming it.
fn dim_value(dims: &[(String, i64)], dim: &str) -> Result<usize, UserError> {
    dims.iter()
        .find(|(n, _)| n == dim)
        .and_then(|&(_, v)| usize::try_from(v).ok())
        .ok_or_else(|| {
            UserError::general(
                format!("`--tile {dim}=...` names no dim of this model"),
                "name a `dim` the inputs' spatial axes are declared with",
            )
        })
}

/// The input that holds the loss's targets (through reshapes and permutes) and the id the
/// loss ignores, which a window's halo voxels take.
fn targets(graph: &Graph) -> Result<(String, i32), UserError> {
    let loss = graph.output("loss").map(|v| graph.node(v));
    let Some((node, Op::CrossEntropy(ce))) = loss.map(|n| (n, &n.op)) else {
        return Err(UserError::general(
            "tiled training needs a cross-entropy `loss`",
            "add one",
        ));
    };
    let mut v = node.inputs[1];
    loop {
        let n = graph.node(v);
        match &n.op {
            Op::Input { name, .. } => {
                return Ok((name.clone(), ce.ignore_index.unwrap_or(-1)));
            }
            Op::Reshape { .. } | Op::Permute { .. } => v = n.inputs[0],
            _ => {
                return Err(UserError::at(
                    n.span,
                    "tiled training needs the loss's targets to be an input (reshaped or permuted at most)",
                    "targets computed here",
                    "pass the targets as an `input` cut into windows like the data",
                ))
            }
        }
    }
}
