//! Widening casts folded into the arithmetic that reads them: in a mixed-precision step the
//! residual stream is fp32 and each block's output a bf16/fp16 product, widened by a cast
//! before the residual add. The add reads the 16-bit operand itself instead, widening each
//! element as it loads it (the binary ops' type promotion, `crate::ops::pointwise`): the
//! same bits, one launch fewer, and no fp32 copy of the operand. A cast folds when it
//! widens a bf16/fp16 value to fp32, only one arithmetic op (add, sub, mul, div) of the same
//! phase reads it, the op's other operand is fp32, and the cast is no graph output.
//!
//! Likewise a layer or RMS norm's gradients read a 16-bit `dy` as it is (the loss head's or
//! an MLP's bf16 input gradient, widened before the norm's backward): a widening cast that
//! only the norm's input and weight gradients and its bias gradient's `sum_to` read, in its
//! phase, is dropped, the `sum_to` storing its fp32 sum (LLaMA-7B bf16: 64 launches and
//! two fp32 copies a layer).

use super::rewrite::{absorb, rebuild, Edit};
use super::StageError;
use crate::ir::{BinaryFn, DType, Graph, NormKind, Op, ValueId};
use std::collections::BTreeSet;

/// Whether `v` is a widening cast (bf16/fp16 to fp32) that may fold into its reader `by`.
fn folds(graph: &Graph, v: ValueId, by: ValueId, outputs: &BTreeSet<ValueId>) -> bool {
    let node = graph.node(v);
    let narrow = |u: ValueId| matches!(graph.node(u).ty.dtype, DType::BF16 | DType::F16);
    node.op == (Op::Cast { to: DType::F32 })
        && node.inputs.first().is_some_and(|&x| narrow(x))
        && graph.users(v) == [by]
        && graph.node(by).phase == node.phase
        && !outputs.contains(&v)
}

/// For an arithmetic op reading a foldable cast: the cast, and the op's inputs with the
/// cast's input in its place.
fn promoted(
    graph: &Graph,
    v: ValueId,
    outputs: &BTreeSet<ValueId>,
) -> Option<(ValueId, Vec<ValueId>)> {
    let node = graph.node(v);
    let Op::Binary(BinaryFn::Add | BinaryFn::Sub | BinaryFn::Mul | BinaryFn::Div) = node.op else {
        return None;
    };
    let [a, b] = node.inputs[..] else {
        return None;
    };
    let fp32 = |u: ValueId| graph.node(u).ty.dtype == DType::F32;
    let inner = |u: ValueId| graph.node(u).inputs[0];
    if a == b {
        None
    } else if fp32(a) && folds(graph, b, v, outputs) {
        Some((b, vec![a, inner(b)]))
    } else if fp32(b) && folds(graph, a, v, outputs) {
        Some((a, vec![inner(a), b]))
    } else {
        None
    }
}

/// `graph` with every such cast folded into its readers (see the module doc): the new graph
/// and each old value's new one (`None` for a folded cast).
pub fn fold(graph: &Graph) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let (arithmetic, first) = absorb(graph, "promote", |graph, v, outputs| {
        let (cast, inputs) = promoted(graph, v, outputs)?;
        Some((cast, graph.node(v).op.clone(), inputs))
    })?;
    let (out, second) = fold_norm_dy(&arithmetic)?;
    let map = (first.iter())
        .map(|v| v.and_then(|u| second[u.index()]))
        .collect();
    Ok((out, map))
}
/// Whether `u` reads `c` only as a layer or RMS norm gradient's `dy` (input gradient,
/// weight gradient) or as the whole input of a `sum_to` (a layer norm's bias gradient).
fn reads_as_dy(graph: &Graph, c: ValueId, u: ValueId) -> bool {
    let node = graph.node(u);
    let only_at = |i: usize| {
        node.inputs.get(i) == Some(&c) && node.inputs.iter().filter(|&&x| x == c).count() == 1
    };
    let layer_or_rms = |kind: &NormKind| matches!(kind, NormKind::Layer | NormKind::Rms);
    match &node.op {
        Op::NormBackwardInput { kind, .. } => layer_or_rms(kind) && only_at(2),
        Op::NormBackwardWeight { kind, .. } => layer_or_rms(kind) && only_at(1),
        Op::SumTo { .. } => node.inputs == [c],
        _ => false,
    }
}

/// The widening casts that only norm gradients (and a bias gradient's `sum_to`) read as
/// their `dy`, in their phase, none a graph output.
fn norm_dy_casts(graph: &Graph) -> BTreeSet<ValueId> {
    let outputs: BTreeSet<ValueId> = graph.outputs.iter().map(|(_, v)| *v).collect();
    let narrow = |u: ValueId| matches!(graph.node(u).ty.dtype, DType::BF16 | DType::F16);
    (graph.values())
        .filter(|&c| {
            let node = graph.node(c);
            let users = graph.users(c);
            node.op == (Op::Cast { to: DType::F32 })
                && node.inputs.first().is_some_and(|&x| narrow(x))
                && !outputs.contains(&c)
                && !users.is_empty()
                && users
                    .iter()
                    .all(|&u| reads_as_dy(graph, c, u) && graph.node(u).phase == node.phase)
        })
        .collect()
}

/// `graph` with each widening cast that only norm gradients read as `dy` dropped, its
/// readers reading the 16-bit value itself (a `sum_to` storing its fp32 sum): the same
/// values, as the norm kernels widen `dy` as they load it.
fn fold_norm_dy(graph: &Graph) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let casts = norm_dy_casts(graph);
    rebuild(graph, "promote", |v| {
        let node = graph.node(v);
        if casts.contains(&v) {
            return Edit::Drop;
        }
        if !node.inputs.iter().any(|i| casts.contains(i)) {
            return Edit::Keep;
        }
        let inputs = (node.inputs.iter())
            .map(|&i| match casts.contains(&i) {
                true => graph.node(i).inputs[0],
                false => i,
            })
            .collect();
        let op = match &node.op {
            Op::SumTo { shape, .. } => Op::SumTo {
                shape: shape.clone(),
                f32_out: true,
            },
            op => op.clone(),
        };
        Edit::Rebuild(op, inputs)
    })
}

#[cfg(test)]
mod tests {
    use super::fold;
    use crate::ir::{
        BinaryFn, DType, Graph, NormKind, Op, Origin, Phase, Span, TensorType, UnaryFn, ValueId,
    };
    use crate::passes::test_graphs;

    #[test]
    fn only_a_widening_cast_read_once_by_fp32_arithmetic_folds() {
        let origin = Origin {
            span: Span::default(),
            scope: String::new(),
            phase: Phase::Forward,
        };
        let mut g = Graph::new();
        let input = |g: &mut Graph, name: &str, dtype| {
            let ty = TensorType::new(dtype, vec![4, 3]);
            let op = Op::Input {
                name: name.to_string(),
                ty,
            };
            g.add(op, vec![], &origin).expect("input")
        };
        let x = input(&mut g, "x", DType::F32);
        let y = input(&mut g, "y", DType::BF16);
        let wide = Op::Cast { to: DType::F32 };
        let cast = |g: &mut Graph| g.add(wide.clone(), vec![y], &origin).expect("cast");
        let (c1, c2, c3, c4) = (cast(&mut g), cast(&mut g), cast(&mut g), cast(&mut g));
        let op = |g: &mut Graph, f, inputs| g.add(Op::Binary(f), inputs, &origin).expect("op");
        let folded = op(&mut g, BinaryFn::Sub, vec![c1, x]);
        let shared = op(&mut g, BinaryFn::Add, vec![x, c2]);
        let relu = g.add(Op::Unary(UnaryFn::Relu), vec![c2], &origin);
        let extremum = op(&mut g, BinaryFn::Maximum, vec![x, c3]);
        let doubled = op(&mut g, BinaryFn::Mul, vec![c4, c4]);
        g.outputs = vec![("folded".into(), folded), ("shared".into(), shared)];
        g.outputs.push(("relu".into(), relu.expect("relu")));
        g.outputs.push(("extremum".into(), extremum));
        g.outputs.push(("doubled".into(), doubled));
        let (out, map) = fold(&g).expect("fold");
        assert_eq!(map[c1.index()], None);
        let new = map[folded.index()].expect("the promoted sub");
        assert_eq!(
            out.node(new).inputs,
            vec![y, x],
            "the bf16 operand read as it is"
        );
        assert_eq!(out.node(new).ty, TensorType::new(DType::F32, vec![4, 3]));
        for kept in [c2, c3, c4] {
            assert!(map[kept.index()].is_some(), "{kept} is not folded");
        }
        let casts = out.values().filter(|&v| out.node(v).op == wide).count();
        assert_eq!(casts, 3);
    }

    #[test]
    fn a_widened_dy_only_norm_gradients_read_is_read_as_it_is() {
        let origin = test_graphs::origin(Phase::Backward);
        let mut g = Graph::new();
        let x = test_graphs::input(&mut g, &origin, "x", (DType::F32, &[4, 8]));
        let w = test_graphs::input(&mut g, &origin, "w", (DType::F32, &[8]));
        let dy = test_graphs::input(&mut g, &origin, "dy", (DType::BF16, &[4, 8]));
        let wide = Op::Cast { to: DType::F32 };
        let mut add = |op: Op, inputs| g.add(op, inputs, &origin).expect("node");
        let (folded, kept) = (add(wide.clone(), vec![dy]), add(wide.clone(), vec![dy]));
        let (kind, eps) = (NormKind::Layer, 1e-5);
        let dx = add(Op::NormBackwardInput { kind, eps }, vec![x, w, folded]);
        let dw = add(Op::NormBackwardWeight { kind, eps }, vec![x, folded]);
        let db = add(Op::sum_to(vec![8]), vec![folded]);
        // The second cast is read by arithmetic too: it stays.
        let other = add(Op::NormBackwardInput { kind, eps }, vec![x, w, kept]);
        let relu = add(Op::Unary(UnaryFn::Relu), vec![kept]);
        g.outputs = [
            ("dx", dx),
            ("dw", dw),
            ("db", db),
            ("o", other),
            ("r", relu),
        ]
        .map(|(n, v)| (n.to_string(), v))
        .to_vec();
        let (out, map) = fold(&g).expect("fold");
        assert_eq!(map[folded.index()], None);
        assert!(map[kept.index()].is_some());
        let new = |v: ValueId| out.node(map[v.index()].expect("kept"));
        assert_eq!(new(dx).inputs, [x, w, dy]);
        assert_eq!(new(dw).inputs, [x, dy]);
        assert_eq!(
            (new(db).inputs.clone(), new(db).ty.dtype),
            (vec![dy], DType::F32)
        );
        let sum = Op::SumTo {
            shape: vec![8],
            f32_out: true,
        };
        assert_eq!(new(db).op, sum);
    }
}
