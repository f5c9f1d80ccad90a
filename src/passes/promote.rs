//! Widening casts folded into the arithmetic that reads them: in a mixed-precision step the
//! residual stream is fp32 and each block's output a bf16/fp16 product, widened by a cast
//! before the residual add. The add reads the 16-bit operand itself instead, widening each
//! element as it loads it (the binary ops' type promotion, `crate::ops::pointwise`): the
//! same bits, one launch fewer, and no fp32 copy of the operand. A cast folds when it
//! widens a bf16/fp16 value to fp32, only one arithmetic op (add, sub, mul, div) of the same
//! phase reads it, the op's other operand is fp32, and the cast is no graph output.

use super::rewrite::absorb;
use super::StageError;
use crate::ir::{BinaryFn, DType, Graph, Op, ValueId};
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

/// `graph` with every such cast folded into its reader (see the module doc): the new graph
/// and each old value's new one (`None` for a folded cast).
pub fn fold(graph: &Graph) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    absorb(graph, "promote", |graph, v, outputs| {
        let (cast, inputs) = promoted(graph, v, outputs)?;
        Some((cast, graph.node(v).op.clone(), inputs))
    })
}

#[cfg(test)]
mod tests {
    use super::fold;
    use crate::ir::{BinaryFn, DType, Graph, Op, Origin, Phase, Span, TensorType, UnaryFn};

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
}
