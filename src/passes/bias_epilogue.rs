//! A bias added to a matrix product: `matmul(x, w) + b`, where only the add reads the
//! product and `b` is a vector of the product's last dim in its type, becomes one matmul
//! with a bias (`Op::MatMul { bias: true }`), which cuBLASLt runs as its bias epilogue: one
//! launch instead of two, and no product stored before the add. The bias is added to the
//! fp32 accumulator before the output's one rounding, so in fp32 the values are the same
//! and in 16 bits they are rounded once instead of twice (as PyTorch's `addmm` does).

use super::rewrite::{absorb, Absorbed};
use super::StageError;
use crate::ir::{BinaryFn, Graph, Op, ValueId};
use std::collections::BTreeSet;

/// For an add of a bias to a product only it reads: the product, and the matmul with the
/// bias that replaces the add (its op and inputs).
fn fusable(graph: &Graph, v: ValueId, outputs: &BTreeSet<ValueId>) -> Option<Absorbed> {
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
    absorb(graph, "bias_epilogue", fusable)
}

#[cfg(test)]
mod tests {
    use super::fold;
    use crate::ir::{BinaryFn, DType, Graph, Op, Origin, Phase, Span, TensorType, UnaryFn};

    #[test]
    fn only_a_vector_added_to_a_product_nothing_else_reads_folds() {
        let origin = Origin {
            span: Span::default(),
            scope: String::new(),
            phase: Phase::Forward,
        };
        let mut g = Graph::new();
        let input = |g: &mut Graph, name: &str, shape: Vec<usize>| {
            let ty = TensorType::new(DType::F32, shape);
            let op = Op::Input {
                name: name.to_string(),
                ty,
            };
            g.add(op, vec![], &origin).expect("input")
        };
        let x = input(&mut g, "x", vec![4, 3]);
        let w = input(&mut g, "w", vec![3, 5]);
        let b = input(&mut g, "b", vec![5]);
        let c = input(&mut g, "c", vec![4, 5]);
        let add = Op::Binary(BinaryFn::Add);
        let linear = |g: &mut Graph, bias, product_first: bool| {
            let m = g
                .add(Op::matmul(false, false), vec![x, w], &origin)
                .expect("matmul");
            let inputs = if product_first {
                vec![m, bias]
            } else {
                vec![bias, m]
            };
            (m, g.add(add.clone(), inputs, &origin).expect("add"))
        };
        let (_, folded) = linear(&mut g, b, false);
        let (_, full) = linear(&mut g, c, true);
        let (shared, _) = linear(&mut g, b, true);
        let relu = Op::Unary(UnaryFn::Relu);
        let other = g.add(relu, vec![shared], &origin).expect("relu");
        g.outputs = vec![("folded".into(), folded), ("full".into(), full)];
        g.outputs.push(("other".into(), other));
        let (out, map) = fold(&g).expect("fold");
        let count = |f: &dyn Fn(&Op) -> bool| out.values().filter(|&v| f(&out.node(v).op)).count();
        assert_eq!(count(&|o| matches!(o, Op::MatMul { bias: true, .. })), 1);
        assert_eq!(count(&|o| *o == add), 2);
        let new = map[folded.index()].expect("the folded add");
        assert_eq!(out.node(new).inputs, vec![x, w, b]);
        assert_eq!(out.node(new).ty, TensorType::new(DType::F32, vec![4, 5]));
    }
}
