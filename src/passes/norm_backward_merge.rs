//! A layer or RMS norm's gradients as one op: the input gradient, the weight gradient and a
//! `sum_to` of the same `dy` onto the channels (a layer norm's bias gradient) each read the
//! norm's `x` and `dy`, and the weight gradient recomputes the row statistics the input
//! gradient computes too; in a pre-norm block the input gradient is also the gradient of
//! the residual branch below, whose linear layer's bias gradient sums it over the rows once
//! cast to the matmuls' type. Merged ([`Op::NormBackward`]) one pass over the rows stores
//! the input gradient and keeps per-channel partials of the others: two launches where there
//! were five (the cast stays, for the matmuls). The merged op writes the gradients into one
//! flat buffer, each read through an [`Op::Member`] view, so their values live together: the
//! planner merges only where that does not raise the step's peak (`crate::launch_groups`).

use super::rewrite::rebuild_each;
use super::StageError;
use crate::ir::{DType, Graph, NormKind, Op, ValueId};
use crate::ops::norm::{merged_backward_fills, GradsLayout};
use std::collections::{BTreeMap, BTreeSet};

/// One norm's gradients that merge: the input gradient, the weight gradient and, when there
/// is one, the sum of `dy` onto the channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NormGrads {
    /// The input gradient (`norm_backward_input`), whose inputs the merged op takes.
    pub input: ValueId,
    /// The weight gradient (`norm_backward_weight`) of the same `x` and `dy`.
    pub weight: ValueId,
    /// A `sum_to` of that `dy` onto the channels, when there is one.
    pub bias: Option<ValueId>,
    /// A `sum_to` onto the channels of the input gradient or of a cast of it (the bias
    /// gradient of the linear layer whose output's gradient it is), and the type it sums.
    pub sum: Option<(ValueId, DType)>,
    /// A cast of the input gradient to a narrower type that ops besides the sum read (the
    /// matmuls below), and that type (the sum's, when both are there).
    pub copy: Option<(ValueId, DType)>,
}

impl NormGrads {
    /// The values the merged op computes: input, weight, bias (if any) and sum (if any).
    pub fn members(&self) -> Vec<ValueId> {
        [
            Some(self.input),
            Some(self.weight),
            self.bias,
            self.sum.map(|s| s.0),
            self.copy.map(|c| c.0),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// The kind and epsilon of `v` when it is a layer or RMS norm's input gradient.
fn input_gradient(graph: &Graph, v: ValueId) -> Option<(NormKind, f32)> {
    match graph.node(v).op {
        Op::NormBackwardInput {
            kind: kind @ (NormKind::Layer | NormKind::Rms),
            eps,
        } => Some((kind, eps)),
        _ => None,
    }
}

/// Every norm's gradients that one op can compute and launch over as many blocks as its
/// input gradient would ([`merged_backward_fills`]): an input gradient, the weight gradient
/// of the same kind, `x` and `dy`, a `sum_to` of that `dy` onto the channels if any, and a
/// `sum_to` onto the channels of the input gradient or of a cast of it if any, all of one
/// dtype and phase, none a graph output or written in place, and the input gradient's inputs
/// (the merged op's) made before the first of them (where the merged op is placed).
pub fn groups(graph: &Graph) -> Vec<NormGrads> {
    let outputs: BTreeSet<ValueId> = graph.outputs.iter().map(|(_, v)| *v).collect();
    // A value some step writes in place cannot be a view of the merged output.
    let written = super::rewrite::written_in_place(graph);
    let mut taken: BTreeSet<ValueId> = BTreeSet::new();
    let mut out = Vec::new();
    for dx in graph.values() {
        let Some((kind, eps)) = input_gradient(graph, dx) else {
            continue;
        };
        let node = graph.node(dx);
        let (x, w, dy) = (node.inputs[0], node.inputs[1], node.inputs[2]);
        let free = |v: ValueId| {
            graph.node(v).phase == node.phase
                && !outputs.contains(&v)
                && !written.contains(&v)
                && !taken.contains(&v)
        };
        let like = |v: ValueId| graph.node(v).ty.dtype == node.ty.dtype && free(v);
        let channels = graph.node(w).ty.shape.clone();
        let ch = graph.node(w).ty.numel();
        if !merged_backward_fills(node.ty.numel() / ch.max(1), ch) {
            continue;
        }
        let users = graph.users(dy);
        let Some(weight) = users.iter().copied().find(|&u| {
            graph.node(u).op == Op::NormBackwardWeight { kind, eps }
                && graph.node(u).inputs == [x, dy]
                && like(u)
        }) else {
            continue;
        };
        let bias = users.iter().copied().find(|&u| {
            matches!(&graph.node(u).op, Op::SumTo { shape, .. } if *shape == channels)
                && graph.node(u).inputs == [dy]
                && like(u)
        });
        let onto_channels = |u: ValueId| {
            matches!(&graph.node(u).op, Op::SumTo { shape, .. } if *shape == channels) && like(u)
        };
        // The sum of the input gradient itself (rounded to its own type: unchanged), or of a
        // cast of it.
        let sum_of = |user: ValueId| match graph.node(user).op {
            Op::SumTo { .. } => onto_channels(user).then_some((user, node.ty.dtype)),
            Op::Cast { to } => (graph.users(user).into_iter())
                .find(|&u| onto_channels(u))
                .map(|sum| (sum, to)),
            _ => None,
        };
        let sum = graph.users(dx).into_iter().find_map(sum_of);
        // A narrower cast read by more than the sum, in the sum's type if there is one.
        let copy_of = |cast: ValueId| match graph.node(cast).op {
            Op::Cast { to } if to.is_float() && to.size() < node.ty.dtype.size() => {
                let read = (graph.users(cast).into_iter()).any(|u| Some(u) != sum.map(|s| s.0));
                let same = sum.is_none_or(|s| s.1 == to);
                (read && same && free(cast)).then_some((cast, to))
            }
            _ => None,
        };
        let copy = graph.users(dx).into_iter().find_map(copy_of);
        let group = NormGrads {
            input: dx,
            weight,
            bias,
            sum,
            copy,
        };
        // The merged op reads the input gradient's inputs (the others read some of them).
        let first = group.members().into_iter().min().unwrap_or(dx);
        let inputs_before = node.inputs.iter().all(|&i| i < first);
        if like(dx) && inputs_before {
            taken.extend(group.members());
            out.push(group);
        }
    }
    out
}

/// `graph` with each of `groups` one [`Op::NormBackward`] at the first of its values, those
/// values member views of its output; also each old value's new one.
pub fn run(
    graph: &Graph,
    groups: &[NormGrads],
) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let group_of: BTreeMap<ValueId, usize> = (groups.iter().enumerate())
        .flat_map(|(i, g)| g.members().into_iter().map(move |m| (m, i)))
        .collect();
    let mut roots: Vec<Option<ValueId>> = vec![None; groups.len()];
    rebuild_each(graph, "norm_backward_merge", |b, v| {
        let Some(&i) = group_of.get(&v) else {
            return b.copy(v);
        };
        let group = groups[i];
        let dx = graph.node(group.input);
        let Some((kind, eps)) = input_gradient(graph, group.input) else {
            return Err(StageError::internal(
                "norm_backward_merge",
                "a merged group without its input gradient",
            ));
        };
        let root = match roots[i] {
            Some(root) => root,
            None => {
                let op = Op::NormBackward {
                    kind,
                    eps,
                    bias: group.bias.is_some(),
                    sum: group.sum.map(|s| s.1),
                    copy: group.copy.map(|c| c.1),
                };
                let inputs = (dx.inputs.iter())
                    .map(|&i| b.new_of(i))
                    .collect::<Result<Vec<_>, _>>()?;
                let root = b.add(v, op, inputs)?;
                roots[i] = Some(root);
                root
            }
        };
        let ch = graph.node(dx.inputs[1]).ty.numel();
        let (bias, sum) = (group.bias.is_some(), group.sum.is_some());
        let dims = (dx.ty.numel() / ch.max(1), ch, dx.ty.dtype.size());
        let at = GradsLayout::new(dims, bias, sum, group.copy.map(|c| c.1.size()));
        let (offset, dtype) = match v {
            _ if v == group.input => (0, None),
            _ if v == group.weight => (at.weight, None),
            _ if Some(v) == group.bias => (at.bias, None),
            _ if Some(v) == group.copy.map(|c| c.0) => (at.copy, group.copy.map(|c| c.1)),
            _ => (at.sum, None),
        };
        let shape = graph.node(v).ty.shape.clone();
        b.add(
            v,
            Op::Member {
                offset: offset as usize,
                shape,
                dtype,
            },
            vec![root],
        )
    })
}

#[cfg(test)]
mod tests {
    use super::{groups, run, NormGrads};
    use crate::ir::{DType, Graph, NormKind, Op, Phase, ValueId};
    use crate::ops::norm::merged_backward_fills;
    use crate::passes::test_graphs;

    /// A backward graph with a layer norm's weight, bias and input gradients over 8 x 8 and
    /// the sum of the input gradient, cast to `cast` first when given (summed in fp32), the
    /// bias gradient a graph output when `bias_out`: the graph and (dx, dw, db, the sum).
    fn layer_norm_grads(bias_out: bool, cast: Option<DType>) -> (Graph, [ValueId; 4]) {
        let origin = test_graphs::origin(Phase::Backward);
        let mut g = Graph::new();
        let mut input = |name: &str, shape: &[usize]| {
            test_graphs::input(&mut g, &origin, name, (DType::F32, shape))
        };
        let (x, w, dy) = (input("x", &[8, 8]), input("w", &[8]), input("dy", &[8, 8]));
        let (kind, eps) = (NormKind::Layer, 1e-5);
        let dw = (g.add(Op::NormBackwardWeight { kind, eps }, vec![x, dy], &origin)).expect("dw");
        let db = g.add(Op::sum_to(vec![8]), vec![dy], &origin).expect("db");
        let dx = (g.add(Op::NormBackwardInput { kind, eps }, vec![x, w, dy], &origin)).expect("dx");
        let summed = match cast {
            Some(to) => (g.add(Op::Cast { to }, vec![dx], &origin)).expect("cast"),
            None => dx,
        };
        let sum = Op::SumTo {
            shape: vec![8],
            f32_out: true,
        };
        let ds = g.add(sum, vec![summed], &origin).expect("sum");
        if bias_out {
            g.outputs.push(("db".into(), db));
        }
        (g, [dx, dw, db, ds])
    }

    /// The group of (dx, dw, db, the bf16 sum), without a copy.
    fn all_of([dx, dw, db, ds]: [ValueId; 4]) -> NormGrads {
        NormGrads {
            input: dx,
            weight: dw,
            bias: Some(db),
            sum: Some((ds, DType::BF16)),
            copy: None,
        }
    }

    #[test]
    fn a_layer_norms_three_gradients_merge_into_views_of_one_output() {
        let (g, values) = layer_norm_grads(false, Some(DType::BF16));
        let [dx, dw, db, ds] = values;
        let found = groups(&g);
        assert_eq!(found, vec![all_of(values)]);
        let (out, map) = run(&g, &found).expect("merge");
        let new = |v: ValueId| map[v.index()].expect("kept");
        let root = out.node(new(dw)).inputs[0];
        let merged = Op::NormBackward {
            kind: NormKind::Layer,
            eps: 1e-5,
            bias: true,
            sum: Some(DType::BF16),
            copy: None,
        };
        assert_eq!(
            (&out.node(root).op, &out.node(root).inputs),
            (&merged, &g.node(dx).inputs)
        );
        // The weight gradient 256 bytes (64 elements) after the input gradient's start, the
        // bias's 256 bytes after the weight's, the sum's 256 after the bias's.
        assert_eq!(out.node(root).ty.shape, vec![64 + 64 + 64 + 8]);
        for (v, offset) in [(dx, 0), (dw, 64), (db, 128), (ds, 192)] {
            let shape = g.node(v).ty.shape.clone();
            assert_eq!(out.node(new(v)).op, Op::member(offset, shape));
            assert_eq!(out.node(new(v)).inputs, vec![root]);
        }
    }

    #[test]
    fn a_cast_of_the_input_gradient_read_beyond_the_sum_becomes_its_narrow_copy() {
        let (mut g, [dx, dw, db, ds]) = layer_norm_grads(false, Some(DType::BF16));
        let cast = g.node(ds).inputs[0];
        let origin = test_graphs::origin(Phase::Backward);
        let read = Op::Reshape { shape: vec![64] };
        let reader = g.add(read, vec![cast], &origin).expect("reader");
        g.outputs.push(("r".into(), reader));
        let found = groups(&g);
        let group = NormGrads {
            copy: Some((cast, DType::BF16)),
            ..all_of([dx, dw, db, ds])
        };
        assert_eq!(found, vec![group]);
        let (out, map) = run(&g, &found).expect("merge");
        let new = |v: ValueId| map[v.index()].expect("kept");
        let root = out.node(new(dw)).inputs[0];
        // The copy's 64 bf16 elements take 32 fp32 elements 256 bytes after the sum's start.
        assert_eq!(out.node(root).ty.shape, vec![64 * 4 + 32]);
        let copy = Op::Member {
            offset: 256,
            shape: vec![8, 8],
            dtype: Some(DType::BF16),
        };
        assert_eq!(out.node(new(cast)).op, copy);
        assert_eq!(out.node(new(cast)).ty.dtype, DType::BF16);
        assert_eq!(out.node(new(reader)).inputs, vec![new(cast)]);
        // A copy as wide as the input gradient is no copy.
        let (mut g, _) = layer_norm_grads(false, None);
        let wide = g
            .add(Op::Cast { to: DType::F32 }, vec![dx], &origin)
            .expect("cast");
        g.outputs.push(("w".into(), wide));
        assert_eq!(groups(&g)[0].copy, None);
    }

    #[test]
    fn a_graph_output_or_rows_the_input_gradient_would_slice_stay_apart() {
        // A bias gradient that is a graph output stays its own op; the others merge.
        let (g, [dx, dw, _, ds]) = layer_norm_grads(true, Some(DType::BF16));
        let expected = NormGrads {
            input: dx,
            weight: dw,
            bias: None,
            sum: Some((ds, DType::BF16)),
            copy: None,
        };
        assert_eq!(groups(&g), vec![expected]);
        // 100 rows of 2,048 channels: the input gradient alone splits its rows into slices
        // to fill an H100, which the merged op's whole rows would not; GPT-2's 8 x 1024 rows
        // of 768 and a small tensor fill as they are.
        assert!(!merged_backward_fills(100, 2048));
        assert!(merged_backward_fills(8 * 1024, 768));
        assert!(merged_backward_fills(100, 8));
    }

    #[test]
    fn an_fp32_sum_of_the_input_gradient_itself_merges_in_its_own_type() {
        let (g, [dx, dw, db, ds]) = layer_norm_grads(false, None);
        let group = NormGrads {
            input: dx,
            weight: dw,
            bias: Some(db),
            sum: Some((ds, DType::F32)),
            copy: None,
        };
        assert_eq!(groups(&g), vec![group]);
    }
}
