//! A linear layer's bias gradient beside its weight gradient: `dW = x^T @ dy` and `db`, a
//! `sum_to` of the same `dy` over its rows, both read all of `dy`. Merged
//! ([`Op::MatMulBiasGrad`]), cuBLASLt sums `dy`'s columns in the epilogue of the weight
//! gradient's GEMM (`CUBLASLT_EPILOGUE_BGRADA`): one call where there were a call and a
//! launch, and `dy` read once. The two gradients are [`Op::Member`] views of one flat
//! output, placed at the weight gradient (the bias gradient, made earlier, moves there: it
//! lives less long, and the weight gradient as long as before).

use super::rewrite::rebuild_in_order;
use super::StageError;
use crate::ir::{Graph, Op, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// A weight gradient and the bias gradient that merges into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightAndBias {
    /// The 2-D product `op(x) @ y` (a [`Op::MatMul`] without bias, `y` not transposed).
    pub weight: ValueId,
    /// The `sum_to` of `y` (or of the value `y` reshapes) onto `y`'s columns.
    pub bias: ValueId,
}

/// `v` and every value it reshapes, nearest first.
fn reshaped_from(graph: &Graph, mut v: ValueId) -> Vec<ValueId> {
    let mut chain = vec![v];
    while let Op::Reshape { .. } = graph.node(v).op {
        v = graph.node(v).inputs[0];
        chain.push(v);
    }
    chain
}

/// Every weight gradient with a bias gradient of the same `dy` that one call computes: a
/// 2-D [`Op::MatMul`] without bias whose right operand is not transposed, and a `sum_to` of
/// that operand (or of a value it reshapes, with the same last dim) onto its columns, of
/// the same type and phase; neither a graph output or written in place, and nothing reading
/// the sum before the product (where the merged op is placed).
pub fn pairs(graph: &Graph) -> Vec<WeightAndBias> {
    let outputs: BTreeSet<ValueId> = graph.outputs.iter().map(|(_, v)| *v).collect();
    let written = super::rewrite::written_in_place(graph);
    let free = |v: ValueId| !outputs.contains(&v) && !written.contains(&v);
    let mut taken: BTreeSet<ValueId> = BTreeSet::new();
    let mut out = Vec::new();
    for weight in graph.values() {
        let node = graph.node(weight);
        let Op::MatMul {
            tb: false,
            bias: false,
            ..
        } = node.op
        else {
            continue;
        };
        let [x, y] = node.inputs[..] else { continue };
        let (x_ty, y_ty) = (&graph.node(x).ty, &graph.node(y).ty);
        if x_ty.shape.len() != 2 || y_ty.shape.len() != 2 || !free(weight) {
            continue;
        }
        let columns = y_ty.shape[1];
        let sums_columns = |u: ValueId, of: ValueId| {
            let n = graph.node(u);
            matches!(&n.op, Op::SumTo { shape, .. } if *shape == [columns])
                && graph.node(of).ty.shape.last() == Some(&columns)
                && n.ty.dtype == node.ty.dtype
                && n.phase == node.phase
                && free(u)
                && !taken.contains(&u)
                && graph.users(u).iter().all(|&r| r > weight)
        };
        let bias = (reshaped_from(graph, y).into_iter())
            .find_map(|of| graph.users(of).into_iter().find(|&u| sums_columns(u, of)));
        if let Some(bias) = bias {
            taken.insert(bias);
            out.push(WeightAndBias { weight, bias });
        }
    }
    out
}

/// `graph` with each of `pairs` one [`Op::MatMulBiasGrad`] at its weight gradient, the two
/// gradients member views of its output; also each old value's new one.
pub fn run(
    graph: &Graph,
    pairs: &[WeightAndBias],
) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let deferred: BTreeSet<ValueId> = pairs.iter().map(|p| p.bias).collect();
    let bias_of: BTreeMap<ValueId, ValueId> = pairs.iter().map(|p| (p.weight, p.bias)).collect();
    let mut order = Vec::with_capacity(graph.len());
    for v in graph.values().filter(|v| !deferred.contains(v)) {
        order.push(v);
        order.extend(bias_of.get(&v));
    }
    let mut roots: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    rebuild_in_order(graph, "bias_grad_epilogue", &order, |b, v| {
        let node = graph.node(v);
        if let Some(&bias) = bias_of.get(&v) {
            let Op::MatMul {
                ta, tb, f32_out, ..
            } = node.op
            else {
                return b.copy(v);
            };
            let inputs = vec![b.new_of(node.inputs[0])?, b.new_of(node.inputs[1])?];
            let root = b.add(v, Op::MatMulBiasGrad { ta, tb, f32_out }, inputs)?;
            roots.insert(bias, root);
            let shape = node.ty.shape.clone();
            return b.add(v, Op::member(0, shape), vec![root]);
        }
        let Some(&root) = roots.get(&v) else {
            return b.copy(v);
        };
        // The sums are the flat output's last elements (`ops::matmul::bias_grad_offset`).
        let shape = node.ty.shape.clone();
        let op = Op::member(
            (b.out.node(root).ty.numel() - node.ty.numel()) as usize,
            shape,
        );
        b.add(v, op, vec![root])
    })
}

#[cfg(test)]
mod tests {
    use super::{pairs, run, WeightAndBias};
    use crate::ir::{DType, Graph, Op, Phase, TensorType, UnaryFn, ValueId};
    use crate::passes::test_graphs::{input, origin};

    /// A backward graph: `x [4, 3]`, `dy [2, 2, 5]`, the bias gradient (a `sum_to` of `dy`
    /// onto its 5 columns) made before the weight gradient `x^T @ reshape(dy)`, and a step
    /// reading the bias gradient after it (before it when `read_early`): the graph and (dw,
    /// db).
    fn linear_grads(read_early: bool) -> (Graph, [ValueId; 2]) {
        let origin = origin(Phase::Backward);
        let mut g = Graph::new();
        let x = input(&mut g, &origin, "x", (DType::F32, &[4, 3]));
        let dy = input(&mut g, &origin, "dy", (DType::F32, &[2, 2, 5]));
        let db = g.add(Op::sum_to(vec![5]), vec![dy], &origin).expect("db");
        let relu = Op::Unary(UnaryFn::Relu);
        if read_early {
            g.add(relu.clone(), vec![db], &origin)
                .expect("early reader");
        }
        let flat = Op::Reshape { shape: vec![4, 5] };
        let rows = g.add(flat, vec![dy], &origin).expect("reshape");
        let dw = g.add(Op::matmul(true, false), vec![x, rows], &origin);
        let dw = dw.expect("dw");
        g.add(relu, vec![db], &origin).expect("reader");
        (g, [dw, db])
    }

    #[test]
    fn the_bias_sum_moves_to_its_weight_gradient_and_both_are_views() {
        let (g, [dw, db]) = linear_grads(false);
        let found = pairs(&g);
        assert_eq!(
            found,
            [WeightAndBias {
                weight: dw,
                bias: db
            }]
        );
        let (out, map) = run(&g, &found).expect("run");
        let (new_dw, new_db) = (map[dw.index()].expect("dw"), map[db.index()].expect("db"));
        let root = out.node(new_dw).inputs[0];
        let merged = Op::MatMulBiasGrad {
            ta: true,
            tb: false,
            f32_out: false,
        };
        assert_eq!(out.node(root).op, merged);
        // 3 x 5 products, rounded up to 128 elements, then the 5 sums.
        assert_eq!(out.node(root).ty, TensorType::new(DType::F32, vec![133]));
        let member = |offset, shape: Vec<usize>| Op::member(offset, shape);
        assert_eq!(out.node(new_dw).op, member(0, vec![3, 5]));
        assert_eq!(out.node(new_db).op, member(128, vec![5]));
        assert_eq!(out.node(new_db).inputs, [root]);
        // The sum is made after its root, and its reader after it.
        assert!(root < new_db && out.users(new_db).iter().all(|&r| r > new_db));
    }

    #[test]
    fn a_sum_read_before_the_weight_gradient_stays_apart() {
        let (g, _) = linear_grads(true);
        assert!(pairs(&g).is_empty());
    }
}
