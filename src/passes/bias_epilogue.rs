//! A bias added to a matrix product: `matmul(x, w) + b`, where only the add reads the
//! product and `b` is a vector of the product's last dim in its type, becomes one matmul
//! with a bias (`Op::MatMul { bias: true }`), which cuBLASLt runs as its bias epilogue: one
//! launch instead of two, and no product stored before the add. The bias is added to the
//! fp32 accumulator before the output's one rounding, so in fp32 the values are the same
//! and in 16 bits they are rounded once instead of twice (as PyTorch's `addmm` does).

use super::autodiff::Differentiated;
use super::rewrite::{rebuild, remap_pairs, Edit};
use super::StageError;
use crate::ir::{BinaryFn, Graph, Op, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// For an add of a bias to a product only it reads: the product, and the matmul with the
/// bias that replaces the add (its op and inputs).
fn fusable(
    graph: &Graph,
    v: ValueId,
    outputs: &BTreeSet<ValueId>,
) -> Option<(ValueId, Op, Vec<ValueId>)> {
    let node = graph.node(v);
    if node.op != Op::Binary(BinaryFn::Add) {
        return None;
    }
    let [a, b] = node.inputs[..] else {
        return None;
    };
    [(a, b), (b, a)].into_iter().find_map(|(product, bias)| {
        let p = graph.node(product);
        let Op::MatMul {
            ta,
            tb,
            f32_out,
            bias: false,
        } = p.op
        else {
            return None;
        };
        let cols = p.ty.shape.last().copied();
        let bias_ty = &graph.node(bias).ty;
        let fits = p.phase == node.phase
            && graph.users(product) == [v]
            && !outputs.contains(&product)
            && p.ty == node.ty
            && bias_ty.dtype == p.ty.dtype
            && cols.is_some_and(|c| bias_ty.shape == [c]);
        let op = Op::MatMul {
            ta,
            tb,
            f32_out,
            bias: true,
        };
        fits.then(|| (product, op, vec![p.inputs[0], p.inputs[1], bias]))
    })
}

/// `graph` with every such add folded into its product (see the module doc): the new graph
/// and each old value's new one (`None` for a folded product).
pub fn fold(graph: &Graph) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let outputs: BTreeSet<ValueId> = graph.outputs.iter().map(|(_, v)| *v).collect();
    let fused: BTreeMap<ValueId, (ValueId, Op, Vec<ValueId>)> = graph
        .values()
        .filter_map(|v| fusable(graph, v, &outputs).map(|f| (v, f)))
        .collect();
    let products: BTreeSet<ValueId> = fused.values().map(|(p, _, _)| *p).collect();
    rebuild(graph, "bias_epilogue", |v| match fused.get(&v) {
        Some((_, op, inputs)) => Edit::Rebuild(op.clone(), inputs.clone()),
        None if products.contains(&v) => Edit::Drop,
        None => Edit::Keep,
    })
}

/// [`fold`] on a differentiated graph, its gradients following their values; also each old
/// value's new one, for the values the caller holds.
pub fn run(diff: &Differentiated) -> Result<(Differentiated, Vec<Option<ValueId>>), StageError> {
    let (graph, map) = fold(&diff.graph)?;
    let diff = Differentiated {
        graph,
        grads: remap_pairs(&diff.grads, &map, "bias_epilogue")?,
        alternatives: Vec::new(),
    };
    Ok((diff, map))
}
