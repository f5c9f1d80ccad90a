//! Residual gradients folded into the norm's input gradient: in a pre-norm block the
//! gradient reaching the residual stream is the sum of the gradient passed down the stream
//! and the norm's input gradient, one add after the norm's backward. The input-gradient op
//! takes the other operand as a fourth input and adds it as it stores each element
//! (`dx = g + rstd * (...)`, the same rounding as the separate add): the same bits, one
//! launch fewer, and no separate fp32 copy of the norm's input gradient. An add folds when
//! one operand is an fp32 norm input gradient of three inputs that only this add reads (and
//! is no graph output), the add's output is fp32, and both are of one phase.

use super::rewrite::{absorb, Absorbed};
use super::StageError;
use crate::ir::{BinaryFn, DType, Graph, Op, ValueId};
use std::collections::BTreeSet;

/// Whether `v` is a norm input gradient that may fold into the add `by`.
fn folds(graph: &Graph, v: ValueId, by: ValueId, outputs: &BTreeSet<ValueId>) -> bool {
    let node = graph.node(v);
    matches!(node.op, Op::NormBackwardInput { .. })
        && node.inputs.len() == 3
        && node.ty.dtype == DType::F32
        && graph.users(v) == [by]
        && graph.node(by).phase == node.phase
        && !outputs.contains(&v)
}

/// For an add reading a foldable norm input gradient: that gradient, and the fused op's
/// inputs (the norm's three, then the add's other operand).
fn accumulated(graph: &Graph, v: ValueId, outputs: &BTreeSet<ValueId>) -> Option<Absorbed> {
    let node = graph.node(v);
    if node.op != Op::Binary(BinaryFn::Add) || node.ty.dtype != DType::F32 {
        return None;
    }
    let [a, b] = node.inputs[..] else {
        return None;
    };
    let (norm, other) = match (folds(graph, a, v, outputs), folds(graph, b, v, outputs)) {
        _ if a == b => return None,
        (true, _) => (a, b),
        (false, true) => (b, a),
        (false, false) => return None,
    };
    let fused = graph.node(norm);
    let mut inputs = fused.inputs.clone();
    inputs.push(other);
    Some((norm, fused.op.clone(), inputs))
}

/// `graph` with every such add folded into its norm input gradient (see the module doc): the
/// new graph and each old value's new one (`None` for a folded norm input gradient).
pub fn fold(graph: &Graph) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    absorb(graph, "norm_accumulate", accumulated)
}

#[cfg(test)]
mod tests {
    use super::fold;
    use crate::ir::{BinaryFn, DType, Graph, NormKind, Op, Phase, TensorType};
    use crate::passes::test_graphs;

    #[test]
    fn only_an_fp32_norm_input_gradient_read_once_by_an_add_folds() {
        let origin = test_graphs::origin(Phase::Backward);
        let mut g = Graph::new();
        let input = |g: &mut Graph, name: &str, dtype, shape: &[usize]| {
            test_graphs::input(g, &origin, name, (dtype, shape))
        };
        let x = input(&mut g, "x", DType::F32, &[4, 8]);
        let w = input(&mut g, "w", DType::F32, &[8]);
        let dy = input(&mut g, "dy", DType::F32, &[4, 8]);
        let r = input(&mut g, "r", DType::BF16, &[4, 8]);
        let xb = input(&mut g, "xb", DType::BF16, &[4, 8]);
        let op = Op::NormBackwardInput {
            kind: NormKind::Layer,
            eps: 1e-5,
        };
        let norm = |g: &mut Graph, x| g.add(op.clone(), vec![x, w, dy], &origin).expect("norm");
        let add = |g: &mut Graph, a, b| {
            g.add(Op::Binary(BinaryFn::Add), vec![a, b], &origin)
                .expect("add")
        };
        let (n1, n2, n3, n4) = (
            norm(&mut g, x),
            norm(&mut g, x),
            norm(&mut g, xb),
            norm(&mut g, x),
        );
        let folded = add(&mut g, r, n1);
        let shared = add(&mut g, n2, r);
        let twice = add(&mut g, n4, n4);
        let narrow = add(&mut g, n3, r);
        g.outputs = vec![("folded".into(), folded), ("shared".into(), shared)];
        g.outputs.push(("n2".into(), n2));
        g.outputs.push(("twice".into(), twice));
        g.outputs.push(("narrow".into(), narrow));
        let (out, map) = fold(&g).expect("fold");
        assert_eq!(map[n1.index()], None);
        let new = map[folded.index()].expect("the accumulating norm gradient");
        assert_eq!(out.node(new).op, op);
        assert_eq!(out.node(new).inputs, vec![x, w, dy, r]);
        assert_eq!(out.node(new).ty, TensorType::new(DType::F32, vec![4, 8]));
        for kept in [n2, n3, n4] {
            assert!(map[kept.index()].is_some(), "{kept} is not folded");
        }
        let adds = (out.values())
            .filter(|&v| out.node(v).op == Op::Binary(BinaryFn::Add))
            .count();
        assert_eq!(adds, 3);
    }
}
