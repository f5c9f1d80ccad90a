//! Patch-based execution as a plan transformation: a fully convolutional model compiled at
//! the size of one tile's window (the tile plus the halo its receptive field reads), run
//! window by window over the whole input.
//!
//! `--tile S=64` names the dim whose input axes are cut (every input dim written as `S`
//! alone) and the tile's side; `--tile S=auto` takes the fewest tiles whose plan fits the
//! budget (each count's smallest tile). [`compile_tiled`] checks the forward graph with [`crate::passes::tile::analyze`]
//! (which refuses, naming the op, whatever is not translation-equivariant), rounds the
//! halo up to the network's grid factor, and compiles the window's plan like any other.
//! A tile need not divide the side: the last tile along an axis is pushed inward to end at
//! the border and keeps only the voxels no earlier tile kept ([`windows::spans`]).
//! Inference runs each window and keeps its tile ([`run::infer`]); training runs the
//! windows as the micro-steps of one accumulated step (of every micro-batch's tiles with
//! `accumulate`), each window's halo voxels carrying the loss's ignored id and the loss's
//! mean dividing by the whole micro-batch's kept voxels over its tiles ([`KEPT`]), so each
//! voxel's loss counts once and alike ([`run::train`]).

pub mod choose;
pub mod run;
pub mod windows;

use crate::diagnostic::UserError;
use crate::front::ast::{ExprKind, Item, Model};
use crate::passes::tile::TiledDims;
use crate::{CompileError, Compiled, Options};

/// The input a tiled training plan reads its cross-entropy's divisor from (one value per
/// micro-step, [`crate::Options::kept_from_input`]): a micro-batch's kept voxels over its
/// tiles, so that tiles keeping unequal voxel counts weigh each voxel alike.
pub const KEPT: &str = "tile.kept";

/// `--tile DIM=SIDE` or `--tile DIM=auto`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TileSpec {
    /// The dim whose input axes are tiled.
    pub dim: String,
    /// The tile's side in voxels, or None: the fewest tiles that fit the budget.
    pub side: Option<usize>,
}

impl std::str::FromStr for TileSpec {
    type Err = String;

    /// Parses `DIM=SIDE` or `DIM=auto`.
    fn from_str(s: &str) -> Result<TileSpec, String> {
        let (dim, side) = s
            .split_once('=')
            .ok_or_else(|| format!("`--tile {s}`: expected DIM=SIDE or DIM=auto, e.g. S=64"))?;
        let side = match side {
            "auto" => None,
            n => Some(
                n.parse::<usize>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("`--tile {s}`: {n} is not a positive side"))?,
            ),
        };
        Ok(TileSpec {
            dim: dim.to_string(),
            side,
        })
    }
}

/// How a plan's step runs over tiles: the window it was compiled for and where the windows
/// lie. Every figure is in voxels along one tiled axis unless said otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct Tiling {
    /// The tiled dim.
    pub dim: String,
    /// The whole input's side.
    pub side: usize,
    /// The whole output's side: the input voxels it covers from the start of a tiled axis
    /// (`side`, less the border unpadded convolutions drop at its end).
    pub extent: usize,
    /// The tile's side in output voxels (a multiple of `factor`, at most `extent`; the last
    /// tile along an axis keeps [`Tiling::last`] voxels).
    pub tile: usize,
    /// Halo before a tile: the receptive field's reach, rounded up to `factor`.
    pub lo: usize,
    /// Halo after a tile.
    pub hi: usize,
    /// The network's grid factor (its total down-sampling).
    pub factor: usize,
    /// The window's side in input voxels: `tile + lo + hi` (or `side` when one tile is the
    /// whole output).
    pub window: usize,
    /// How many axes are tiled.
    pub axes: usize,
    /// Each input's tiled dims.
    pub inputs: TiledDims,
    /// Each output's tiled dims (inference), or the loss's rows (training).
    pub outputs: TiledDims,
    /// Training: the input holding the loss's targets and the id that masks a halo voxel.
    pub targets: Option<(String, i32)>,
    /// Training: micro-batches per step, each run over every tile (1 without accumulation).
    pub accumulate: usize,
    /// Bytes of the whole inputs, held beside the arena and cut into windows.
    pub input_bytes: u64,
    /// Bytes of the whole outputs (inference), each tile written into them.
    pub output_bytes: u64,
}

impl Tiling {
    /// Tiles along one axis.
    pub fn per_axis(&self) -> usize {
        self.extent.div_ceil(self.tile)
    }

    /// The voxels the last tile along an axis keeps: `tile` where it divides the output's
    /// side, else those after the previous tiles.
    pub fn last(&self) -> usize {
        self.extent - (self.per_axis() - 1) * self.tile
    }

    /// Tiles in all: `per_axis ^ axes`.
    pub fn count(&self) -> usize {
        self.per_axis().pow(self.axes as u32)
    }

    /// The share of voxel work that overlapping windows add: every window's voxels over
    /// the whole input's, less one.
    pub fn recompute(&self) -> f64 {
        let ratio = (self.per_axis() * self.window) as f64 / self.side as f64;
        ratio.powi(self.axes as i32) - 1.0
    }

    /// The whole shape of an input whose window has shape `window` and whose tiled dims are
    /// `dims`: `side` along them.
    pub fn input_shape(&self, dims: &[Option<usize>], window: &[usize]) -> Vec<usize> {
        whole(dims, window, self.side)
    }

    /// The whole shape of an output whose window has shape `window` and whose tiled dims are
    /// `dims`: `extent` along them.
    pub fn output_shape(&self, dims: &[Option<usize>], window: &[usize]) -> Vec<usize> {
        whole(dims, window, self.extent)
    }

    /// The dims of input `name` that are tiled (empty when it has none).
    pub fn input_dims(&self, name: &str) -> &[Option<usize>] {
        self.inputs
            .iter()
            .find(|(n, _)| n == name)
            .map_or(&[], |(_, d)| d.as_slice())
    }

    /// The report's lines about tiling.
    pub fn lines(&self) -> Vec<String> {
        let cube = |n: usize| format!("{n}^{}", self.axes);
        let last = match self.last() {
            l if l == self.tile => String::new(),
            l => format!(", the last keeping {l} of its tile"),
        };
        let output = match self.extent {
            e if e == self.side => String::new(),
            e => format!(
                " (output {}: unpadded convolutions drop {} at the end)",
                cube(e),
                self.side - e
            ),
        };
        vec![
            format!(
                "tiling: {} = {}{output} cut into {} tiles of {} ({} per axis{last}); windows of {} (halo {} before, {} after, grid factor {})",
                self.dim,
                cube(self.side),
                self.count(),
                cube(self.tile),
                self.per_axis(),
                cube(self.window),
                self.lo,
                self.hi,
                self.factor
            ),
            format!(
                "tiling: overlapping windows recompute {:.2}% of the voxel work; beside the arena, whole inputs {} B, whole outputs {} B",
                self.recompute() * 100.0,
                self.input_bytes,
                self.output_bytes
            ),
        ]
    }
}

/// `window` with its tiled dims (`dims`) `side` long.
fn whole(dims: &[Option<usize>], window: &[usize], side: usize) -> Vec<usize> {
    (window.iter().zip(dims))
        .map(|(&e, d)| if d.is_some() { side } else { e })
        .collect()
}

/// The model's tiled dims: per input, each dim written as `dim` alone is a tiled axis (the
/// first such dim axis 0, the next axis 1, ...). A dim written with `dim` inside an
/// expression is refused; so is a `dim` no input uses.
pub fn tiled_inputs(ast: &Model, dim: &str) -> Result<(TiledDims, usize), UserError> {
    let mut out = Vec::new();
    let mut axes = 0;
    for item in &ast.items {
        let Item::Input(name, ty) = item else {
            continue;
        };
        let mut next = 0;
        let mut dims = Vec::with_capacity(ty.dims.len());
        for e in &ty.dims {
            match &e.kind {
                ExprKind::Path(p) if p.len() == 1 && p[0].name == dim => {
                    dims.push(Some(next));
                    next += 1;
                }
                ExprKind::Path(_) | ExprKind::Number { .. } => dims.push(None),
                _ if mentions(&e.kind, dim) => {
                    return Err(UserError::at(
                        e.span,
                        format!("input `{}` has a dim computed from the tiled dim `{dim}`", name.name),
                        "not the tiled dim alone",
                        format!("tiling cuts dims written as `{dim}` alone; declare this input's extent as `{dim}`"),
                    ))
                }
                _ => dims.push(None),
            }
        }
        axes = axes.max(next);
        out.push((name.name.clone(), dims));
    }
    if axes == 0 {
        return Err(UserError::general(
            format!("no input has a dim written as `{dim}`, so `--tile {dim}=...` cuts nothing"),
            "name the dim that the inputs' spatial axes are declared with, e.g. --tile S=64",
        ));
    }
    Ok((out, axes))
}

/// Whether expression `e` names `dim` anywhere.
fn mentions(e: &ExprKind, dim: &str) -> bool {
    match e {
        ExprKind::Path(p) => p.iter().any(|i| i.name == dim),
        ExprKind::Binary(_, a, b) => mentions(&a.kind, dim) || mentions(&b.kind, dim),
        ExprKind::Neg(a) => mentions(&a.kind, dim),
        ExprKind::Tuple(v) => v.iter().any(|x| mentions(&x.kind, dim)),
        ExprKind::Call(c) => c.args.iter().any(|a| mentions(&a.value.kind, dim)),
        _ => false,
    }
}

/// Compiles `source` to run over tiles as `spec` says: the window's plan (for training,
/// one micro-step per tile) and how its step runs over the whole input.
pub fn compile_tiled(
    source: &str,
    options: &Options,
    spec: &TileSpec,
) -> Result<(Compiled, Tiling), CompileError> {
    let field = choose::Geometry::of(source, options, &spec.dim)?;
    choose::compile_at(source, options, &field, spec.side)
}
