//! Whether a forward graph can run tile by tile, and the halo its tiles need.
//!
//! The analysis follows the tiled axes (the input dims written as the tiled dim) through
//! the forward graph: every value's dims as factors ([`atoms`]), a tiled factor on a
//! [`atoms::Grid`] saying which input voxels one element may read. Convolutions, pools and
//! transposed convolutions move the grids ([`geometry`]); elementwise ops, per-voxel
//! matmuls and norms, channel concatenation, reshapes that keep tiled axes whole and
//! per-voxel losses keep them; anything whose result at a voxel depends on the whole input
//! or on where the tile lies (statistics over space, reductions over a tiled axis,
//! attention, dropout masks, position-dependent terms) is refused, naming the op
//! ([`rules`]). Outputs must be per voxel, so an output tile reads a window of the input
//! `lo` voxels before and `hi` after it; cropping that reach from a window's result leaves
//! exactly what the whole input gives there. An element stands for the voxel of its first
//! tap, so unpadded (`valid`) convolutions and pools drop voxels at the end of a tiled axis
//! only: the outputs then cover its first [`Field::extent`] voxels, which tile the same way
//! (a value covering more than the input is refused).

pub mod atoms;
pub mod geometry;
mod rules;

use crate::diagnostic::UserError;
use crate::ir::{Graph, Op, ValueId};
use crate::ops::norm::NormKind;
use crate::passes::rewrite::Edit;
use atoms::{Atom, Layout};

/// Per input name, each dim's tiled axis (None: not tiled).
pub type TiledDims = Vec<(String, Vec<Option<usize>>)>;

/// What tiling a graph needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The least common multiple of every value's cell size: window starts and tile sides
    /// are multiples of it, so each tile's pooled grids line up with the whole input's.
    pub factor: usize,
    /// Input voxels before an output voxel that it may read (over every tiled axis).
    pub lo: usize,
    /// Input voxels after an output voxel that it may read.
    pub hi: usize,
    /// The voxels of a tiled axis the outputs cover, from its start: the side, less the
    /// border unpadded (`valid`) convolutions and pools drop at its end (an element stands
    /// for the voxel of its first tap, so nothing is dropped before).
    pub extent: usize,
    /// Per output (inference) or for the loss's rows (training, named `loss`): each dim's
    /// tiled axis, None where the dim holds none.
    pub outputs: TiledDims,
}

/// What the tiled step computes per voxel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Objective {
    /// Every graph output, tile by tile.
    Outputs,
    /// The training loss `loss`: a cross-entropy whose ignored id masks each window's halo.
    Loss,
}

/// Analyses `graph` (forward only) whose inputs hold the tiled axes `inputs` say, every
/// tiled axis `side` voxels long: the halo and factor, or a [`UserError`] at the first op
/// that cannot run tile by tile.
pub fn analyze(
    graph: &Graph,
    inputs: &TiledDims,
    side: usize,
    objective: Objective,
) -> Result<Field, UserError> {
    let mut layouts: Vec<Layout> = Vec::with_capacity(graph.len());
    let mut factor = 1usize;
    for v in graph.values() {
        let node = graph.node(v);
        let layout = match &node.op {
            Op::Input { name, ty } => input_layout(name, &ty.shape, inputs),
            _ => {
                let ins: Vec<&Layout> = node.inputs.iter().map(|i| &layouts[i.index()]).collect();
                rules::transfer(graph, v, &ins).map_err(|r| {
                    let name = op_name(&node.op);
                    UserError::at(
                        node.span,
                        format!("`{name}` cannot run tile by tile: {}", r.reason),
                        format!("{name} here"),
                        r.help,
                    )
                })?
            }
        };
        for a in layout.tiled_atoms() {
            if let Atom::Tiled { extent, grid, .. } = a {
                if extent * grid.r > side {
                    return Err(UserError::at(
                        node.span,
                        format!(
                            "`{}` cannot run tile by tile: it takes a tiled axis past the input: {extent} elements of {} voxel(s) each cover {} voxels, and the input has {side}",
                            op_name(&node.op),
                            grid.r,
                            extent * grid.r
                        ),
                        "covers more than the input",
                        "pad a convolution at most to `same` (dilation x (kernel - 1) / 2), and give a transposed convolution an output at most stride times its input",
                    ));
                }
                factor = lcm(factor, grid.r);
            }
        }
        layouts.push(layout);
    }
    let targets = match objective {
        Objective::Outputs => graph.outputs.clone(),
        Objective::Loss => vec![("loss".to_string(), loss_rows(graph)?)],
    };
    let (mut lo, mut hi, mut covered) = (0, 0, None);
    let mut outputs = Vec::new();
    for (name, v) in targets {
        let dims = output_axes(graph, v, &name, &layouts[v.index()], objective)?;
        for a in layouts[v.index()].tiled_atoms() {
            if let Atom::Tiled { grid, extent, .. } = a {
                lo = lo.max(grid.lo);
                hi = hi.max(grid.hi);
                if *covered.get_or_insert(extent) != extent {
                    return Err(UserError::at(
                        graph.node(v).span,
                        format!("output `{name}` cannot be tiled: it covers {extent} voxels of a tiled axis, and another output (or axis) covers {}", covered.unwrap_or(extent)),
                        "this output",
                        "tile outputs that cover the same voxels (the same unpadded convolutions on the way)",
                    ));
                }
            }
        }
        outputs.push((name, dims));
    }
    let extent = covered.unwrap_or(side);
    if let (Objective::Loss, true, Some(loss)) = (objective, extent != side, graph.output("loss")) {
        return Err(UserError::at(
            graph.node(loss).span,
            format!("tiled training needs the loss's rows to cover every input voxel, and they cover {extent} of {side} along a tiled axis (unpadded convolutions drop the border)"),
            "the loss",
            "pad the convolutions to `same` (dilation x (kernel - 1) / 2) to train over tiles; an unpadded network tiles for inference",
        ));
    }
    Ok(Field {
        factor,
        lo,
        hi,
        extent,
        outputs,
    })
}

/// `graph` with every [`Op::KeptCount`] replaced by the f32 scalar input
/// [`crate::tiling::KEPT`]: each cross-entropy's mean then divides by the value bound to it
/// for the micro-step (a micro-batch's kept voxels over its tiles) instead of the kept rows
/// of the window's own targets.
pub fn kept_from_input(graph: &Graph) -> Result<Graph, crate::passes::StageError> {
    let mut kept = None;
    let (out, _) = crate::passes::rewrite::rebuild(graph, "tile", |v| match graph.node(v).op {
        Op::KeptCount(_) => match kept {
            Some(first) => Edit::Alias(first),
            None => {
                kept = Some(v);
                let ty = crate::ir::TensorType::new(crate::ir::DType::F32, vec![]);
                let name = crate::tiling::KEPT.to_string();
                Edit::Rebuild(Op::Input { name, ty }, Vec::new())
            }
        },
        _ => Edit::Keep,
    })?;
    Ok(out)
}

/// An input's layout: its tiled dims on the input's own grid.
fn input_layout(name: &str, shape: &[usize], inputs: &TiledDims) -> Layout {
    let axes = inputs.iter().find(|(n, _)| n == name).map(|(_, a)| a);
    Layout {
        dims: shape
            .iter()
            .enumerate()
            .map(
                |(i, &e)| match axes.and_then(|a| a.get(i).copied().flatten()) {
                    Some(axis) => vec![Atom::Tiled {
                        axis,
                        extent: e,
                        grid: atoms::Grid::INPUT,
                    }],
                    None => atoms::plain_dim(e),
                },
            )
            .collect(),
        from_fills: false,
    }
}

/// The logits a training loss averages per voxel: the loss must be a cross-entropy with an
/// `ignore_index`, which masks each window's halo out of the mean.
fn loss_rows(graph: &Graph) -> Result<ValueId, UserError> {
    let Some(loss) = graph.output("loss") else {
        return Err(UserError::general(
            "tiled training needs a `loss`",
            "add `loss = cross_entropy(...)`",
        ));
    };
    let node = graph.node(loss);
    match &node.op {
        Op::CrossEntropy(ce) if ce.ignore_index.is_some() => Ok(node.inputs[0]),
        _ => Err(UserError::at(
            node.span,
            "tiled training needs the loss to be a per-voxel cross-entropy with an `ignore_index`",
            "the loss",
            "write `loss = cross_entropy(logits, targets, ignore_index = -1)`: each tile's halo voxels take that id, so every voxel's loss counts once",
        )),
    }
}

/// Each dim's tiled axis for an output of `layout`: every tiled factor on the input's own
/// voxels (an output per voxel); for inference outputs also one factor a dim, so a tile of
/// the output is a box.
fn output_axes(
    graph: &Graph,
    v: ValueId,
    name: &str,
    layout: &Layout,
    objective: Objective,
) -> Result<Vec<Option<usize>>, UserError> {
    let span = graph.node(v).span;
    let bad = |why: &str| {
        UserError::at(
            span,
            format!("output `{name}` cannot be tiled: {why}"),
            "this output",
            "make the output a per-voxel tensor, e.g. [B, K, S, S, S] before any flattening",
        )
    };
    if !layout.is_tiled() {
        return Err(bad("it holds no tiled axis"));
    }
    let mut axes = Vec::with_capacity(layout.dims.len());
    for d in &layout.dims {
        if d.iter()
            .any(|a| matches!(a, Atom::Tiled { grid, .. } if grid.r != 1))
        {
            return Err(bad(
                "its elements stand for several input voxels (a coarser grid)",
            ));
        }
        match d[..] {
            [Atom::Tiled { axis, .. }] => axes.push(Some(axis)),
            _ if objective == Objective::Outputs && atoms::has_tiled(d) => {
                return Err(bad("a dim merges a tiled axis with others"))
            }
            _ => axes.push(None),
        }
    }
    Ok(axes)
}

/// An op's name as the model writes it where that differs from the IR's (the kinds of
/// norm).
fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Norm { kind, .. } => match kind {
            NormKind::Batch => "batchnorm",
            NormKind::Group(_) => "groupnorm",
            NormKind::Layer => "layernorm",
            NormKind::Rms => "rmsnorm",
        },
        _ => op.name(),
    }
}

fn lcm(a: usize, b: usize) -> usize {
    let gcd = |mut x: usize, mut y: usize| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    a / gcd(a, b) * b
}
