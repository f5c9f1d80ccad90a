//! A residual add and the layer or RMS norm that reads its sum, as one op: in a pre-norm
//! block the fp32 residual stream's sum `x + branch` is normalized next (forward, and again
//! where backward recomputes it); one [`Op::AddNorm`] stores the sum and the norm of it in one
//! pass over the rows, both read through [`Op::Member`] views of its flat fp32 output (the
//! norm's in its own, narrower type). The pair's values then live together: a sum saved
//! for backward keeps its own op, and the planner makes a pair only where that does not
//! raise the step's peak (`crate::launch_groups`).

use super::rewrite::{rebuild_each, written_in_place};
use super::StageError;
use crate::ir::{BinaryFn, DType, Graph, NormKind, Op, ValueId};
use crate::ops::norm::add_norm_at;
use std::collections::{BTreeMap, BTreeSet};

/// The pairs `(add, norm)` one [`Op::AddNorm`] computes: an fp32 add of two operands of its
/// shape, read only in its own phase (a sum saved for backward would hold the norm's output
/// there too), and a layer or RMS norm of its sum in that phase, whose weight and bias exist
/// where the add runs; neither a graph output nor written in place, each in one pair.
pub fn pairs(graph: &Graph) -> Vec<(ValueId, ValueId)> {
    let outputs: BTreeSet<ValueId> = graph.outputs.iter().map(|(_, v)| *v).collect();
    let written = written_in_place(graph);
    let free = |v: &ValueId| !outputs.contains(v) && !written.contains(v);
    let mut out = Vec::new();
    for add in graph.values().filter(free) {
        let node = graph.node(add);
        let same = |&i: &ValueId| graph.node(i).ty.shape == node.ty.shape;
        let fp32_add = node.op == Op::Binary(BinaryFn::Add)
            && node.ty.dtype == DType::F32
            && node.inputs.iter().all(same)
            && (graph.users(add).iter()).all(|&u| graph.node(u).phase == node.phase);
        if !fp32_add {
            continue;
        }
        let norm = graph.users(add).into_iter().find(|&n| {
            let reader = graph.node(n);
            let layer_or_rms = matches!(
                reader.op,
                Op::Norm {
                    kind: NormKind::Layer | NormKind::Rms,
                    ..
                }
            );
            layer_or_rms
                && reader.inputs[0] == add
                && reader.phase == node.phase
                && reader.inputs[1..].iter().all(|&p| p < add)
                && free(&n)
        });
        if let Some(norm) = norm {
            out.push((add, norm));
        }
    }
    out
}

/// `graph` with each of `pairs` one [`Op::AddNorm`] at its add, the sum and the norm member
/// views of its output; also each old value's new one.
pub fn run(
    graph: &Graph,
    pairs: &[(ValueId, ValueId)],
) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let pair_of: BTreeMap<ValueId, (ValueId, ValueId)> = (pairs.iter())
        .flat_map(|&(add, norm)| [(add, (add, norm)), (norm, (add, norm))])
        .collect();
    let mut roots: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    rebuild_each(graph, "add_norm", |b, v| {
        let Some(&(add, norm)) = pair_of.get(&v) else {
            return b.copy(v);
        };
        let Op::Norm { kind, eps, store } = graph.node(norm).op else {
            return Err(StageError::internal("add_norm", "a pair without its norm"));
        };
        let root = match roots.get(&add) {
            Some(&root) => root,
            None => {
                let operands = graph.node(add).inputs.iter();
                let params = graph.node(norm).inputs[1..].iter();
                let inputs = (operands.chain(params))
                    .map(|&i| b.new_of(i))
                    .collect::<Result<Vec<_>, _>>()?;
                let root = b.add(add, Op::AddNorm { kind, eps, store }, inputs)?;
                roots.insert(add, root);
                root
            }
        };
        let node = graph.node(v);
        let (offset, dtype) = match v == add {
            true => (0, None),
            false => {
                let t = node.ty.dtype;
                let at = add_norm_at(node.ty.numel(), t.size()).0;
                (at as usize, (t != DType::F32).then_some(t))
            }
        };
        let shape = node.ty.shape.clone();
        let member = Op::Member {
            offset,
            shape,
            dtype,
        };
        b.add(v, member, vec![root])
    })
}

#[cfg(test)]
mod tests {
    use super::{pairs, run};
    use crate::ir::{BinaryFn, DType, Graph, NormKind, Op, Phase};
    use crate::passes::test_graphs;

    #[test]
    fn an_fp32_residual_add_and_the_norm_of_its_sum_become_one_op() {
        let origin = test_graphs::origin(Phase::Forward);
        let mut g = Graph::new();
        let mut input = |name: &str, (t, shape): (DType, &[usize])| {
            test_graphs::input(&mut g, &origin, name, (t, shape))
        };
        let (x, branch) = (
            input("x", (DType::F32, &[4, 64])),
            input("y", (DType::BF16, &[4, 64])),
        );
        let (w, bias) = (
            input("w", (DType::F32, &[64])),
            input("b", (DType::F32, &[64])),
        );
        let add = (g.add(Op::Binary(BinaryFn::Add), vec![x, branch], &origin)).expect("add");
        let norm = Op::Norm {
            kind: NormKind::Layer,
            eps: 1e-5,
            store: Some(DType::BF16),
        };
        let normed = g.add(norm, vec![add, w, bias], &origin).expect("norm");
        let flat = (g.add(Op::Reshape { shape: vec![256] }, vec![normed], &origin)).expect("flat");
        g.outputs = vec![("n".into(), flat)];
        // A sum or a norm that is itself an output is not a member: the pair stays apart.
        for output in [add, normed] {
            let mut kept = g.clone();
            kept.outputs.push(("o".into(), output));
            assert!(pairs(&kept).is_empty());
        }
        // A sum backward reads (saved for it) stays apart too.
        let mut saved = g.clone();
        let later = test_graphs::origin(Phase::Backward);
        let read = (saved.add(Op::Reshape { shape: vec![256] }, vec![add], &later)).expect("read");
        saved.outputs.push(("r".into(), read));
        assert!(pairs(&saved).is_empty());
        // The norm's sum read by another op too: the pair still merges.
        let other = (g.add(Op::Binary(BinaryFn::Mul), vec![add, add], &origin)).expect("mul");
        g.outputs.push(("m".into(), other));
        assert_eq!(pairs(&g), vec![(add, normed)]);
        let (out, map) = run(&g, &pairs(&g)).expect("merged");
        let new = |v: crate::ir::ValueId| map[v.index()].expect("kept");
        let root = out.node(new(add)).inputs[0];
        let merged = Op::AddNorm {
            kind: NormKind::Layer,
            eps: 1e-5,
            store: Some(DType::BF16),
        };
        assert_eq!(out.node(root).op, merged);
        assert_eq!(out.node(root).inputs, vec![x, branch, w, bias]);
        // 256 fp32 sums, then 256 bf16 outputs in 128 fp32 elements.
        assert_eq!(out.node(root).ty.shape, vec![256 + 128]);
        let member = |offset, dtype| Op::Member {
            offset,
            shape: vec![4, 64],
            dtype,
        };
        assert_eq!(out.node(new(add)).op, member(0, None));
        assert_eq!(out.node(new(normed)).op, member(256, Some(DType::BF16)));
        assert_eq!(out.node(new(other)).inputs, vec![new(add), new(add)]);
    }
}
