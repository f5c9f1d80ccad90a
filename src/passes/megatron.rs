//! Tensor parallelism as Megatron-LM splits a transformer block (Shoeybi et al., 2019), as
//! a rewrite of one tensor rank's forward graph before mixed precision and autodiff.
//!
//! A *column* matmul `x @ W` (W a trained 2-D parameter that nothing else reads) starts a
//! region: its output, split along the last dim, flows through ops that keep that split
//! (pointwise ops, adds of split biases, slices of the last dim, rope, attention over whole
//! heads) to *row* matmuls `y @ W2`, whose weight is split by rows and whose partial sums
//! the tensor ranks add ([`Op::TensorReduce`], Megatron's `g`). The region's input enters
//! through [`Op::TensorCopy`] (`f`), whose gradient is the ranks' sum of the partial input
//! gradients. A region that reaches anything else (a norm, the loss, an output) stays
//! whole: the embedding, the loss head and the norms are replicated. So the first MLP
//! matmul and the q, k, v projections are column-parallel (by heads: attention runs
//! `heads / T` heads on each rank), the second MLP matmul and the output projection
//! row-parallel.

use super::StageError;
use crate::diagnostic::UserError;
use crate::ir::{Graph, Op, TypeError, ValueId};
use crate::parallel::TensorSplit;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What the split refuses, or an internal failure.
#[derive(Debug)]
pub enum SplitError {
    /// The model does not split over the tensor ranks (a diagnostic with span and help).
    User(UserError),
    /// A broken invariant.
    Internal(StageError),
}

fn internal(e: TypeError) -> SplitError {
    SplitError::Internal(StageError::internal("megatron", e.message))
}

/// One tensor rank's graph and how each split parameter is sliced.
#[derive(Debug, Clone)]
pub struct Split {
    /// The rewritten graph: split parameters at their slice's shape, collectives inserted.
    pub graph: Graph,
    /// The slicing of each split parameter, by name.
    pub params: BTreeMap<String, TensorSplit>,
}

/// The values a column matmul's output reaches while split, the row matmuls that end it and
/// whether it reaches anything that cannot run split.
#[derive(Debug, Default)]
struct Region {
    values: BTreeSet<ValueId>,
    rows: BTreeSet<ValueId>,
    escapes: bool,
}

/// A trained floating-point parameter of rank `rank` that only `user` reads.
fn private_param(graph: &Graph, v: ValueId, rank: usize, user: ValueId) -> bool {
    let node = graph.node(v);
    let trained = matches!(&node.op, Op::Param { ty, frozen: false, .. }
        if ty.dtype.is_float() && ty.shape.len() == rank);
    let is_output = graph.outputs.iter().any(|(_, o)| *o == v);
    trained && !is_output && graph.users(v) == vec![user]
}

/// `x @ W` with W a private 2-D parameter.
fn weight_matmul(graph: &Graph, v: ValueId) -> bool {
    let node = graph.node(v);
    matches!(
        node.op,
        Op::MatMul {
            ta: false,
            tb: false,
            ..
        }
    ) && node.inputs.len() == 2
        && graph.node(node.inputs[0]).ty.shape.len() >= 2
        && private_param(graph, node.inputs[1], 2, v)
}

/// Whether `op` (reading a split value) keeps the split along the last dim.
fn keeps_split(graph: &Graph, v: ValueId) -> bool {
    let node = graph.node(v);
    let last = node.ty.shape.len().saturating_sub(1);
    match &node.op {
        Op::Unary(_) | Op::Binary(_) | Op::Rope { .. } | Op::Attention(_) => true,
        Op::Slice { axis, .. } => *axis == last,
        _ => false,
    }
}

/// Where the split output of column matmul `c` flows.
fn region(graph: &Graph, c: ValueId) -> Region {
    let mut r = Region::default();
    let mut todo = vec![c];
    while let Some(v) = todo.pop() {
        if !r.values.insert(v) {
            continue;
        }
        r.escapes |= graph.outputs.iter().any(|(_, o)| *o == v);
        for u in graph.users(v) {
            let node = graph.node(u);
            if weight_matmul(graph, u) && node.inputs[0] == v {
                r.rows.insert(u);
            } else if keeps_split(graph, u) {
                todo.push(u);
            } else {
                r.escapes = true;
            }
        }
    }
    r
}

/// Whether every op of `r` can run split when the values of `split` are split: each other
/// operand of an op in it is split too or a split bias, attention reads split q, k and v.
fn closes(graph: &Graph, r: &Region, split: &BTreeSet<ValueId>) -> bool {
    let bias = |u: ValueId, b: ValueId| {
        let last = graph.node(u).ty.shape.last().copied();
        private_param(graph, b, 1, u) && graph.node(b).ty.shape.first().copied() == last
    };
    let rows_ok = r
        .rows
        .iter()
        .all(|&m| split.contains(&graph.node(m).inputs[0]));
    let ops_ok = r.values.iter().all(|&v| {
        let node = graph.node(v);
        match &node.op {
            Op::Binary(_) => node
                .inputs
                .iter()
                .all(|&i| split.contains(&i) || bias(v, i)),
            Op::Attention(_) => node.inputs.iter().take(3).all(|i| split.contains(i)),
            _ => true,
        }
    });
    !r.escapes && rows_ok && ops_ok
}

/// The column matmuls whose regions close together, and their regions.
fn regions(graph: &Graph) -> BTreeMap<ValueId, Region> {
    let mut accepted: BTreeMap<ValueId, Region> = graph
        .values()
        .filter(|&v| weight_matmul(graph, v))
        .map(|v| (v, region(graph, v)))
        .collect();
    loop {
        let split: BTreeSet<ValueId> = accepted.values().flat_map(|r| r.values.clone()).collect();
        let fed_split = |c: &ValueId| split.contains(&graph.node(*c).inputs[0]);
        let rejected: Vec<ValueId> = (accepted.iter())
            .filter(|(c, r)| fed_split(c) || !closes(graph, r, &split))
            .map(|(c, _)| *c)
            .collect();
        if rejected.is_empty() {
            return accepted;
        }
        for c in rejected {
            accepted.remove(&c);
        }
    }
}

/// The parts of a split extent `width` in `r`: cut where slices of that width start and end.
fn parts(graph: &Graph, r: &Region, width: usize) -> Vec<usize> {
    let mut cuts = BTreeSet::from([0, width]);
    for &v in &r.values {
        let node = graph.node(v);
        if let Op::Slice { start, end, .. } = node.op {
            if graph.node(node.inputs[0]).ty.shape.last() == Some(&width) {
                cuts.extend([start, end]);
            }
        }
    }
    let cuts: Vec<usize> = cuts.into_iter().collect();
    cuts.windows(2).map(|w| w[1] - w[0]).collect()
}

/// Refuses `what` of op `v` unless `ranks` divides `n`.
fn divides(
    graph: &Graph,
    v: ValueId,
    (n, what): (usize, &str),
    ranks: u32,
) -> Result<(), SplitError> {
    if n % ranks as usize == 0 {
        return Ok(());
    }
    let op = graph.node(v).op.name();
    Err(SplitError::User(UserError::at(
        graph.node(v).span,
        format!("tensor = {ranks} does not divide the {n} {what} of this `{op}`"),
        "not divisible",
        format!("Megatron's split gives each tensor rank 1/{ranks} of them: choose a `tensor` that divides {n}"),
    )))
}

/// How each split parameter is sliced, checking that the ranks divide every split extent,
/// head count and slice.
fn param_splits(
    graph: &Graph,
    regions: &BTreeMap<ValueId, Region>,
    ranks: u32,
) -> Result<HashMap<ValueId, TensorSplit>, SplitError> {
    let mut out = HashMap::new();
    let split = |p: ValueId, axis: usize, parts: Vec<usize>| TensorSplit {
        full: graph.node(p).ty.shape.clone(),
        axis,
        parts,
        ranks,
    };
    for (&c, r) in regions {
        let w = graph.node(c).inputs[1];
        let width = graph.node(w).ty.shape[1];
        let column = parts(graph, r, width);
        for &n in &column {
            divides(graph, c, (n, "output columns (MLP width or heads)"), ranks)?;
        }
        out.insert(w, split(w, 1, column));
        for &v in &r.values {
            let node = graph.node(v);
            match &node.op {
                Op::Attention(a) => {
                    divides(graph, v, (a.heads, "heads"), ranks)?;
                    divides(graph, v, (a.kv_heads, "key/value heads"), ranks)?;
                }
                Op::Rope { heads, .. } => divides(graph, v, (*heads, "heads"), ranks)?,
                Op::Binary(_) => {
                    for &b in node.inputs.iter().filter(|&&i| !r.values.contains(&i)) {
                        if matches!(graph.node(b).op, Op::Param { .. }) {
                            let len = graph.node(b).ty.shape[0];
                            out.insert(b, split(b, 0, parts(graph, r, len)));
                        }
                    }
                }
                _ => {}
            }
        }
        for &m in &r.rows {
            let w2 = graph.node(m).inputs[1];
            let rows = graph.node(w2).ty.shape[0];
            divides(graph, m, (rows, "input rows"), ranks)?;
            out.insert(w2, split(w2, 0, vec![rows]));
        }
    }
    Ok(out)
}

/// `graph` as one of `ranks` tensor ranks runs it (see the module doc). Refuses a model
/// with nothing to split, or whose split extents, heads or key/value heads `ranks` does
/// not divide, naming the op.
pub fn run(graph: &Graph, ranks: u32) -> Result<Split, SplitError> {
    let regions = regions(graph);
    if regions.is_empty() {
        return Err(SplitError::User(UserError::general(
            format!("tensor = {ranks}: no matmul pair to split Megatron's way"),
            "tensor parallelism splits `x @ W1 ... @ W2` chains (MLPs, attention projections) \
             whose weights are parameters; plan data parallelism instead",
        )));
    }
    let splits = param_splits(graph, &regions, ranks)?;
    let split_values: BTreeSet<ValueId> = regions.values().flat_map(|r| r.values.clone()).collect();
    let rows: BTreeSet<ValueId> = regions.values().flat_map(|r| r.rows.clone()).collect();
    let t = ranks as usize;
    let mut out = Graph::new();
    let mut map: Vec<ValueId> = Vec::with_capacity(graph.len());
    let mut entries: HashMap<ValueId, ValueId> = HashMap::new();
    let mut params = BTreeMap::new();
    for v in graph.values() {
        let node = graph.node(v);
        let origin = node.origin();
        let mut inputs: Vec<ValueId> = node.inputs.iter().map(|u| map[u.index()]).collect();
        let op = match (&node.op, splits.get(&v)) {
            (
                Op::Param {
                    name,
                    ty,
                    init,
                    frozen,
                    buffer,
                },
                Some(s),
            ) => {
                params.insert(name.clone(), s.clone());
                let ty = crate::ir::TensorType::new(ty.dtype, s.local_shape());
                Op::Param {
                    name: name.clone(),
                    ty,
                    init: *init,
                    frozen: *frozen,
                    buffer: *buffer,
                }
            }
            (Op::Slice { axis, start, end }, _) if split_values.contains(&v) => Op::Slice {
                axis: *axis,
                start: start / t,
                end: end / t,
            },
            (
                Op::Rope {
                    heads,
                    base,
                    inverse,
                },
                _,
            ) if split_values.contains(&v) => Op::Rope {
                heads: heads / t,
                base: *base,
                inverse: *inverse,
            },
            (Op::Attention(a), _) if split_values.contains(&v) => {
                let mut a = *a;
                (a.heads, a.kv_heads) = (a.heads / t, a.kv_heads / t);
                Op::Attention(a)
            }
            (op, _) => op.clone(),
        };
        if regions.contains_key(&v) {
            let x = node.inputs[0];
            let entry = match entries.get(&x) {
                Some(&e) => e,
                None => {
                    let e = (out.add(Op::TensorCopy { ranks }, vec![inputs[0]], &origin))
                        .map_err(internal)?;
                    entries.insert(x, e);
                    e
                }
            };
            inputs[0] = entry;
        }
        let mut new = out.add(op, inputs, &origin).map_err(internal)?;
        if rows.contains(&v) {
            new = (out.add(Op::TensorReduce { ranks }, vec![new], &origin)).map_err(internal)?;
        }
        map.push(new);
    }
    out.outputs = (graph.outputs.iter())
        .map(|(name, v)| (name.clone(), map[v.index()]))
        .collect();
    Ok(Split { graph: out, params })
}
