//! The pass packs GPT-2's pattern, forward and backward, and leaves attention alone when its
//! operands are not plain slices of one tensor or a slice has another reader.

use super::fold;
use crate::ir::{
    AttnInput, AttnParams, DType, Graph, Op, Origin, Phase, Span, TensorType, UnaryFn, ValueId,
};

/// How the test graph departs from GPT-2's pattern.
#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Gpt2,
    /// Rope rotates k between its slice and the attention (LLaMA's pattern).
    RopeOnK,
    /// The graph also reads the v slice (a reader outside attention).
    VReadElsewhere,
    /// k and v swapped: the slices do not lie in q, k, v order.
    Swapped,
}

const ATTN: AttnParams = AttnParams {
    heads: 2,
    kv_heads: 1,
    causal: true,
    scale: 0.5,
    window: None,
    softcap: None,
    key_mask: false,
};

/// x `[2, 4, 16]` (2 q heads, 1 kv head, head dim 4) sliced into q, k, v, attention with its
/// three backward ops from `dout`, and the concat of their gradients.
fn graph(variant: Variant) -> Graph {
    let origin = |phase| Origin {
        span: Span::default(),
        scope: String::new(),
        phase,
    };
    let (fwd, bwd) = (origin(Phase::Forward), origin(Phase::Backward));
    let mut g = Graph::new();
    let input = |g: &mut Graph, name: &str, width| {
        let ty = TensorType::new(DType::F32, vec![2, 4, width]);
        let op = Op::Input {
            name: name.to_string(),
            ty,
        };
        g.add(op, vec![], &fwd).expect("input")
    };
    let x = input(&mut g, "x", 16);
    let dout = input(&mut g, "dout", 8);
    let slice = |g: &mut Graph, start, end| {
        let op = Op::Slice {
            axis: 2,
            start,
            end,
        };
        g.add(op, vec![x], &fwd).expect("slice")
    };
    let (q, k, v) = (
        slice(&mut g, 0, 8),
        slice(&mut g, 8, 12),
        slice(&mut g, 12, 16),
    );
    let k = match variant {
        Variant::RopeOnK => {
            let rope = Op::Rope {
                heads: 1,
                base: 10000.0,
                inverse: false,
            };
            g.add(rope, vec![k], &fwd).expect("rope")
        }
        _ => k,
    };
    let operands = if variant == Variant::Swapped {
        vec![q, v, k]
    } else {
        vec![q, k, v]
    };
    let out = g
        .add(Op::Attention(ATTN), operands.clone(), &fwd)
        .expect("attention");
    let mut backward = operands;
    backward.push(dout);
    let grads: Vec<ValueId> = [AttnInput::Q, AttnInput::K, AttnInput::V]
        .into_iter()
        .map(|which| {
            let op = Op::AttentionBackward { attn: ATTN, which };
            g.add(op, backward.clone(), &bwd).expect("backward")
        })
        .collect();
    let dx = g.add(Op::Concat { axis: 2 }, grads, &bwd).expect("concat");
    g.outputs = vec![("out".into(), out), ("dx".into(), dx)];
    if variant == Variant::VReadElsewhere {
        let relu = g
            .add(Op::Unary(UnaryFn::Relu), vec![v], &fwd)
            .expect("relu");
        g.outputs.push(("v".into(), relu));
    }
    g
}

/// How many nodes of `g` have an op of each name.
fn count(g: &Graph, name: &str) -> usize {
    g.values().filter(|&v| g.node(v).op.name() == name).count()
}

#[test]
fn gpt2s_slices_and_concat_become_the_packed_ops() {
    let old = graph(Variant::Gpt2);
    let (g, map) = fold(&old).expect("fold");
    for (name, n) in [
        ("packed_attention", 1),
        ("packed_attention_backward", 1),
        ("slice", 0),
        ("concat", 0),
        ("attention", 0),
        ("attention_backward", 0),
    ] {
        assert_eq!(count(&g, name), n, "{name}");
    }
    let dx = map[old.outputs[1].1.index()].expect("dx");
    let x = g.values().next().expect("x");
    assert_eq!(g.node(dx).ty, old.node(x).ty);
    assert_eq!(g.node(dx).inputs[0], x);
}

#[test]
fn attention_over_anything_but_plain_ordered_slices_is_left_alone() {
    for variant in [Variant::RopeOnK, Variant::VReadElsewhere, Variant::Swapped] {
        let old = graph(variant);
        let (g, _) = fold(&old).expect("fold");
        assert_eq!(g.len(), old.len());
        assert_eq!(count(&g, "packed_attention"), 0);
        assert_eq!(count(&g, "attention"), 1);
        assert_eq!(count(&g, "concat"), 1);
    }
}
