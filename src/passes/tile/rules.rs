//! Each forward op's effect on where the tiled axes sit, or why the op cannot run tile by
//! tile (its result at a voxel would depend on more than a bounded neighbourhood, or on
//! where the tile lies).

use super::atoms::{has_tiled, merge, plain_dim, reshape, Atom, Dim, Layout};
use super::geometry::Window;
use crate::ir::{Graph, Op, ValueId};
use crate::ops::conv::ConvParams;
use crate::ops::norm::NormKind;

/// Why an op cannot be tiled: what it does to the tiled axes, and what to do instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: String,
    pub help: String,
}

fn refuse(reason: impl Into<String>, help: impl Into<String>) -> Refusal {
    Refusal {
        reason: reason.into(),
        help: help.into(),
    }
}

const SPATIAL_HELP: &str =
    "tiling runs the network on windows of the input; keep this op's reach bounded in space";

/// The layout of node `v`'s output from its inputs' layouts (`ins`, in input order).
/// Nodes without inputs (parameters, fills, inputs not tiled) get plain layouts here.
pub fn transfer(graph: &Graph, v: ValueId, ins: &[&Layout]) -> Result<Layout, Refusal> {
    let node = graph.node(v);
    let shape = &node.ty.shape;
    let any_tiled = ins.iter().any(|l| l.is_tiled());
    if !any_tiled {
        let from_fills = match node.op {
            Op::Fill { .. } => true,
            Op::Input { .. } | Op::Param { .. } | Op::OptimState { .. } => false,
            _ => ins.iter().all(|l| l.from_fills),
        };
        return Ok(Layout::plain(shape, from_fills));
    }
    let input_shape = |i: usize| &graph.node(node.inputs[i]).ty.shape;
    match &node.op {
        Op::Unary(_) | Op::Affine { .. } | Op::Cast { .. } | Op::Clamp(_) => Ok(ins[0].clone()),
        Op::Binary(_) | Op::Where => broadcast(ins, shape),
        Op::BroadcastTo { .. } => broadcast(ins, shape),
        Op::Reshape { shape } => match reshape(&ins[0].dims, shape) {
            Some(dims) => Ok(Layout {
                dims,
                from_fills: false,
            }),
            None => Err(refuse(
                "it splits a tiled axis into several dims",
                "reshape only whole tiled axes (merging them, e.g. to rows of a loss, is fine)",
            )),
        },
        Op::Permute { perm } => Ok(Layout {
            dims: perm.iter().map(|&p| ins[0].dims[p].clone()).collect(),
            from_fills: false,
        }),
        Op::Concat { axis } => {
            if ins.iter().any(|l| has_tiled(&l.dims[*axis])) {
                return Err(refuse(
                    "it concatenates along a tiled axis",
                    "concatenate along channels",
                ));
            }
            let mut out = broadcast(ins, shape)?;
            out.dims[*axis] = plain_dim(shape[*axis]);
            Ok(out)
        }
        Op::Slice { axis, .. } | Op::PadSlice { axis, .. } => {
            if has_tiled(&ins[0].dims[*axis]) {
                return Err(refuse(
                    "it cuts or pads a tiled axis at fixed positions",
                    "use a convolution's padding instead of explicit slicing",
                ));
            }
            let mut out = ins[0].clone();
            out.dims[*axis] = plain_dim(shape[*axis]);
            Ok(out)
        }
        Op::SumTo { .. } | Op::MaxTo { .. } => reduce(ins[0], input_shape(0), shape),
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            if has_tiled(&ins[0].dims[*axis]) {
                return Err(refuse(
                    "it normalizes across a tiled axis",
                    "normalize over channels",
                ));
            }
            Ok(ins[0].clone())
        }
        Op::Norm { kind, .. } => norm(*kind, ins[0]),
        Op::Conv(conv) => slide(
            ins[0],
            shape,
            &conv_windows(conv, input_shape(1)),
            false,
            false,
        ),
        Op::ConvTranspose { conv, .. } => slide(
            ins[0],
            shape,
            &conv_windows(conv, input_shape(1)),
            true,
            false,
        ),
        Op::MaxPool2d(p) | Op::AvgPool2d(p) => {
            let windows: Vec<Window> = (0..2)
                .map(|a| Window {
                    kernel: p.kernel[a],
                    stride: p.stride[a],
                    padding: p.padding[a],
                    dilation: 1,
                })
                .collect();
            slide(ins[0], shape, &windows, false, true)
        }
        Op::MatMul { ta, .. } => matmul(ins, *ta, shape),
        Op::CrossEntropy(_) | Op::KeptCount(_) | Op::Mse => loss(&node.op, ins),
        Op::Embedding { .. } if !ins[0].is_tiled() => {
            let mut dims = ins[1].dims.clone();
            dims.push(plain_dim(shape[shape.len() - 1]));
            Ok(Layout {
                dims,
                from_fills: false,
            })
        }
        Op::Dropout { .. } => Err(refuse(
            "its mask is drawn per element index, which differs between a tile and the whole input",
            "drop the dropout, or run without tiling",
        )),
        Op::Attention(_) | Op::Rope { .. } => Err(refuse(
            "it mixes positions across the whole tiled axis (attention across tiles)",
            "attention over space is global; run without tiling",
        )),
        _ => Err(refuse(
            "memc does not know it to be translation-equivariant over the tiled axes",
            SPATIAL_HELP,
        )),
    }
}

/// Elementwise over inputs broadcast to `shape` (aligned on the right): a tiled dim takes
/// the tiled operands' union; a plain operand may stand along it only if it is computed from
/// fills (the same at every size), not from a parameter or input that varies along it.
fn broadcast(ins: &[&Layout], shape: &[usize]) -> Result<Layout, Refusal> {
    let mut dims: Vec<Dim> = shape.iter().map(|&e| plain_dim(e)).collect();
    let mut tiled = vec![false; shape.len()];
    let mut plain_from_fills = vec![true; shape.len()];
    for l in ins {
        let skip = shape.len() - l.dims.len();
        for (i, d) in l.dims.iter().enumerate() {
            let k = skip + i;
            if shape[k] == 1 || d.iter().map(|a| a.extent()).product::<usize>() != shape[k] {
                continue;
            }
            if has_tiled(d) {
                tiled[k] = true;
            } else {
                plain_from_fills[k] &= l.from_fills;
            }
            dims[k] = merge(&dims[k], d).ok_or_else(|| {
                refuse(
                    "it combines different tiled axes elementwise (e.g. a transpose of space)",
                    SPATIAL_HELP,
                )
            })?;
        }
    }
    if (0..shape.len()).any(|k| tiled[k] && !plain_from_fills[k]) {
        return Err(refuse(
            "it combines a tiled axis with a tensor that varies along it by position (a parameter or untiled input)",
            "position-dependent terms such as learned positional embeddings make the network depend on where a tile lies",
        ));
    }
    Ok(Layout {
        dims,
        from_fills: false,
    })
}

/// A sum or max down to `shape`: a reduced dim must not hold a tiled axis.
fn reduce(x: &Layout, from: &[usize], shape: &[usize]) -> Result<Layout, Refusal> {
    let skip = from.len() - shape.len();
    let reduced = |i: usize| i < skip || (shape[i - skip] == 1 && from[i] != 1);
    if (0..from.len()).any(|i| reduced(i) && has_tiled(&x.dims[i])) {
        return Err(refuse(
            "it reduces over a tiled axis (global pooling or a spatial sum), so every voxel's result depends on the whole input",
            "pool with a bounded window (max_pool3d, avg_pool2d) instead of over the whole volume",
        ));
    }
    Ok(Layout {
        dims: x.dims[skip..].to_vec(),
        from_fills: false,
    })
}

/// Layer and RMS norms over a plain last axis are per position; batch norms that train and
/// group norms take statistics over space (an eval-mode batch norm is a per-channel scale
/// and shift, no norm op).
fn norm(kind: NormKind, x: &Layout) -> Result<Layout, Refusal> {
    match kind {
        NormKind::Batch | NormKind::Group(_) => Err(refuse(
            "its statistics span the tiled axes, so a tile's statistics would differ from the whole input's (a batch norm in training; eval mode, without `train { }`, tiles)",
            "normalize per voxel (layernorm over channels), or drop the norm, to tile this network",
        )),
        NormKind::Layer | NormKind::Rms if has_tiled(&x.dims[x.dims.len() - 1]) => Err(refuse(
            "it normalizes across a tiled axis",
            "normalize over channels (the last axis)",
        )),
        NormKind::Layer | NormKind::Rms => Ok(x.clone()),
    }
}

/// One window per spatial axis of a convolution whose weight has shape `weight`
/// (`[out or in channels, channels per group, kernel...]`).
fn conv_windows(conv: &ConvParams, weight: &[usize]) -> Vec<Window> {
    (0..conv.rank())
        .map(|a| Window {
            kernel: weight[2 + a],
            stride: conv.stride[a],
            padding: conv.padding[a],
            dilation: conv.dilation[a],
        })
        .collect()
}

/// A convolution or pool (`transposed`: a transposed convolution) over the trailing dims of
/// `x` with one window per spatial dim. A dim under an identity window keeps its factors;
/// otherwise it must be one tiled axis (or plain). Channels (and batch) may carry tiled axes
/// only through a pool, which treats every channel alone.
fn slide(
    x: &Layout,
    shape: &[usize],
    windows: &[Window],
    transposed: bool,
    per_channel: bool,
) -> Result<Layout, Refusal> {
    let first = x.dims.len() - windows.len();
    if !per_channel && x.dims[..first].iter().any(|d| has_tiled(d)) {
        return Err(refuse(
            "it mixes channels that hold a tiled axis",
            "keep the tiled axes in the spatial dims of a convolution",
        ));
    }
    let mut dims = x.dims[..first].to_vec();
    if !per_channel {
        dims[1] = plain_dim(shape[1]);
    }
    for (a, &w) in windows.iter().enumerate() {
        let d = &x.dims[first + a];
        let out_extent = shape[first + a];
        let dim = match d[..] {
            _ if w.is_identity() && w.dilation == 1 => d.clone(),
            _ if !has_tiled(d) => plain_dim(out_extent),
            [Atom::Tiled { axis, grid, .. }] => {
                let grid = if transposed {
                    w.transposed(grid).ok_or_else(|| {
                        refuse(
                            "it upsamples below the input's voxel grid",
                            "tiling needs every value's cells to be whole input voxels",
                        )
                    })?
                } else {
                    w.forward(grid)
                };
                vec![Atom::Tiled {
                    axis,
                    extent: out_extent,
                    grid,
                }]
            }
            _ => {
                return Err(refuse(
                    "it slides a window over a dim that merges a tiled axis with others",
                    SPATIAL_HELP,
                ))
            }
        };
        dims.push(dim);
    }
    Ok(Layout {
        dims,
        from_fills: false,
    })
}

/// `a @ b` per position: tiled axes may sit in `a`'s batch or row dims, never in the
/// contracted dim or in `b`.
fn matmul(ins: &[&Layout], ta: bool, shape: &[usize]) -> Result<Layout, Refusal> {
    let (a, b) = (ins[0], ins[1]);
    let n = a.dims.len();
    let (rows, inner) = if ta { (n - 1, n - 2) } else { (n - 2, n - 1) };
    if b.is_tiled() || has_tiled(&a.dims[inner]) {
        return Err(refuse(
            "it contracts over a tiled axis",
            "multiply per voxel (channels as the contracted dim)",
        ));
    }
    let out_rank = shape.len();
    let mut dims: Vec<Dim> = shape.iter().map(|&e| plain_dim(e)).collect();
    let batch = n - 2;
    for i in 0..batch {
        dims[out_rank - n + i] = a.dims[i].clone();
    }
    dims[out_rank - 2] = a.dims[rows].clone();
    Ok(Layout {
        dims,
        from_fills: false,
    })
}

/// A mean loss over rows: a scalar. The class axis (cross-entropy's last) must be plain;
/// tiled axes in the rows make it the mean of per-voxel losses, which tiles sum.
fn loss(op: &Op, ins: &[&Layout]) -> Result<Layout, Refusal> {
    if matches!(op, Op::CrossEntropy(_)) && has_tiled(&ins[0].dims[ins[0].dims.len() - 1]) {
        return Err(refuse(
            "its classes run along a tiled axis",
            "put the classes in the last dim, the voxels in the rows",
        ));
    }
    Ok(Layout::plain(&[], false))
}
