//! Grouped parameter casts: in a mixed-precision step each linear's fp32 weight and bias are
//! cast to bf16/fp16 before its matmul (and the weights again where backward recomputes
//! them), one launch a cast. The casts of a scope's parameters in one phase, from one type
//! to one type, become one `cast_group` launch writing one flat buffer, each cast's value a
//! `member` view of its range ([`crate::plan::views`]). The group runs where the first of
//! them ran, so the others' values live from there: the planner keeps a group only where it
//! does not raise the step's peak of live bytes (`crate::budget::plan_with`), which also
//! joins consecutive scopes' groups of one phase into one where that holds. Every member
//! but the last takes a multiple of [`MEMBER_ALIGN`] bytes, so each starts where a buffer
//! of its own could (cuBLASLt reads them as operands).

use super::rewrite::{rebuild_each, rebuild_in_order};
use super::StageError;
use crate::ir::{DType, Graph, Op, Phase, ValueId};
use std::collections::BTreeMap;

/// The alignment, in bytes, of each member's start in its group's buffer (the CUDA
/// backend's buffer alignment).
pub const MEMBER_ALIGN: u64 = 256;

/// What the casts of one group share: their scope (or one of a run of scopes), phase, and
/// the types cast from and to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    /// The scopes whose casts the group takes, in the order of their first casts.
    pub scopes: Vec<String>,
    /// The phase the casts run in.
    pub phase: Phase,
    /// The parameters' type.
    pub from: DType,
    /// The type they are cast to.
    pub to: DType,
}

impl Key {
    /// The key of one scope's casts.
    pub fn of_scope(scope: &str, phase: Phase, from: DType, to: DType) -> Key {
        Key {
            scopes: vec![scope.to_string()],
            phase,
            from,
            to,
        }
    }

    /// This group and `next` as one group, when they cast in the same phase between the
    /// same types.
    pub fn joined(&self, next: &Key) -> Option<Key> {
        let same = (self.phase, self.from, self.to) == (next.phase, next.from, next.to);
        same.then(|| Key {
            scopes: [&self.scopes[..], &next.scopes[..]].concat(),
            ..self.clone()
        })
    }

    /// Whether the one-scope key of a cast falls in this group.
    fn takes(&self, cast: &Key) -> bool {
        (self.phase, self.from, self.to) == (cast.phase, cast.from, cast.to)
            && cast.scopes.iter().all(|s| self.scopes.contains(s))
    }
}

/// The one-scope group key of a cast of a parameter.
fn key_of(graph: &Graph, v: ValueId) -> Option<Key> {
    let node = graph.node(v);
    let Op::Cast { to } = node.op else {
        return None;
    };
    let input = graph.node(*node.inputs.first()?);
    matches!(input.op, Op::Param { .. })
        .then(|| Key::of_scope(&node.scope, node.phase, input.ty.dtype, to))
}

/// The casts of `key`, in creation order, that one group takes: of those whose parameter
/// exists where the first of them runs, each up to the first whose bytes would leave the
/// next member unaligned, that one included.
pub fn members(graph: &Graph, key: &Key) -> Vec<ValueId> {
    let mut out: Vec<ValueId> = Vec::new();
    let mut casts = graph
        .values()
        .filter(|&v| key_of(graph, v).is_some_and(|k| key.takes(&k)));
    let Some(first) = casts.next() else {
        return out;
    };
    let present = |v: &ValueId| graph.node(*v).inputs[0] < first;
    for v in std::iter::once(first).chain(casts.filter(present)) {
        out.push(v);
        if !graph.node(v).ty.bytes().is_multiple_of(MEMBER_ALIGN) {
            break;
        }
    }
    out
}

/// The one-scope keys with at least two casts a group would take, in order of their first
/// cast.
pub fn keys(graph: &Graph) -> Vec<Key> {
    let mut out: Vec<Key> = Vec::new();
    for v in graph.values() {
        if let Some(k) = key_of(graph, v).filter(|k| !out.contains(k)) {
            if members(graph, &k).len() > 1 {
                out.push(k);
            }
        }
    }
    out
}

/// `graph` with every parameter made first, in their order, and each old value's new one.
/// A parameter lives over the whole step wherever it is made and the plan lists the
/// parameters in this order, so only the value ids change: every cast of a key then finds
/// its parameter where the group runs, and the forward's groups of consecutive scopes may
/// join (their later scopes' parameters were made after the first group).
pub fn params_first(graph: &Graph) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let is_param = |v: &ValueId| matches!(graph.node(*v).op, Op::Param { .. });
    let (params, rest): (Vec<ValueId>, Vec<ValueId>) = graph.values().partition(is_param);
    rebuild_in_order(graph, "cast_groups", &[params, rest].concat(), |b, v| {
        b.copy(v)
    })
}

/// `graph` with the casts of each of `keys` one group (see the module doc), placed at the
/// first of them, every other node copied in creation order; also each old value's new one
/// (a grouped cast's is its member view).
pub fn run(graph: &Graph, keys: &[Key]) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let mut group_of: BTreeMap<ValueId, usize> = BTreeMap::new();
    for (k, key) in keys.iter().enumerate() {
        let members = members(graph, key);
        if members.len() > 1 {
            group_of.extend(members.into_iter().map(|m| (m, k)));
        }
    }
    // Each key's group and the elements of its members so far.
    let mut groups: Vec<Option<(ValueId, usize)>> = vec![None; keys.len()];
    rebuild_each(graph, "cast_groups", |b, v| {
        let Some(&k) = group_of.get(&v) else {
            return b.copy(v);
        };
        let (flat, offset) = match groups[k] {
            Some(g) => g,
            None => {
                let grouped: Vec<ValueId> = (group_of.iter())
                    .filter(|(_, &g)| g == k)
                    .map(|(&m, _)| m)
                    .collect();
                let sources = (grouped.iter())
                    .map(|&m| b.new_of(graph.node(m).inputs[0]))
                    .collect::<Result<Vec<_>, _>>()?;
                let op = Op::CastGroup {
                    to: keys[k].to,
                    tensors: grouped.len() as u32,
                };
                (b.add(v, op, sources)?, 0)
            }
        };
        let node = graph.node(v);
        let shape = node.ty.shape.clone();
        let member = b.add(v, Op::member(offset, shape), vec![flat])?;
        groups[k] = Some((flat, offset + node.ty.numel() as usize));
        Ok(member)
    })
}

#[cfg(test)]
mod tests {
    use super::{keys, members, params_first, run, Key};
    use crate::ir::{DType, Graph, Init, Op, Origin, Phase, Span, TensorType};

    #[test]
    fn a_group_takes_aligned_casts_of_present_parameters_up_to_an_unaligned_one() {
        let origin = Origin {
            span: Span::default(),
            scope: "layer.0".to_string(),
            phase: Phase::Forward,
        };
        let mut g = Graph::new();
        let param = |g: &mut Graph, name: &str, n: usize| {
            let op = Op::Param {
                name: name.to_string(),
                ty: TensorType::new(DType::F32, vec![n]),
                init: Init::Zeros,
                frozen: false,
                buffer: false,
            };
            g.add(op, vec![], &origin).expect("param")
        };
        let cast = |g: &mut Graph, p| {
            let op = Op::Cast { to: DType::BF16 };
            g.add(op, vec![p], &origin).expect("cast")
        };
        let [w, b, u] = [("w", 256), ("b", 3), ("u", 128)].map(|(n, k)| param(&mut g, n, k));
        let casts = [w, b, u].map(|p| cast(&mut g, p));
        let late = param(&mut g, "late", 128);
        let late_cast = cast(&mut g, late);
        g.outputs = (casts.iter().chain([&late_cast]))
            .map(|&c| (format!("{c}"), c))
            .collect();
        let key = Key::of_scope("layer.0", Phase::Forward, DType::F32, DType::BF16);
        assert_eq!(keys(&g), vec![key.clone()]);
        let (out, map) = run(&g, &[key]).expect("grouped");
        let group = (out.values()).find(|&v| matches!(out.node(v).op, Op::CastGroup { .. }));
        let group = group.expect("a group");
        assert_eq!(
            out.node(group).inputs,
            vec![w, b],
            "w fills 512 bytes, b leaves 6"
        );
        assert_eq!(out.node(group).ty, TensorType::new(DType::BF16, vec![259]));
        for (cast, offset) in [(casts[0], 0), (casts[1], 256)] {
            let member = map[cast.index()].expect("a member");
            let shape = g.node(cast).ty.shape.clone();
            assert_eq!(out.node(member).op, Op::member(offset, shape));
        }
        for cast in [casts[2], late_cast] {
            let kept = map[cast.index()].expect("kept");
            assert_eq!(out.node(kept).op, Op::Cast { to: DType::BF16 });
        }
    }

    #[test]
    fn parameters_made_first_let_a_group_take_a_later_parameters_cast() {
        let origin = crate::passes::test_graphs::origin(Phase::Forward);
        let mut g = Graph::new();
        let cast_of_new_param = |g: &mut Graph, name: &str| {
            let op = Op::Param {
                name: name.to_string(),
                ty: TensorType::new(DType::F32, vec![128]),
                init: Init::Zeros,
                frozen: false,
                buffer: false,
            };
            let p = g.add(op, vec![], &origin).expect("param");
            (g.add(Op::Cast { to: DType::BF16 }, vec![p], &origin)).expect("cast")
        };
        let early = cast_of_new_param(&mut g, "early");
        let late = cast_of_new_param(&mut g, "late");
        g.outputs = vec![("a".into(), early), ("b".into(), late)];
        let key = Key::of_scope("", Phase::Forward, DType::F32, DType::BF16);
        assert_eq!(
            members(&g, &key),
            vec![early],
            "`late` is made after the first cast"
        );
        let (hoisted, map) = params_first(&g).expect("hoisted");
        let new = |v: crate::ir::ValueId| map[v.index()].expect("kept");
        assert_eq!(members(&hoisted, &key), vec![new(early), new(late)]);
        let params = |g: &Graph| -> Vec<Op> {
            (g.params().into_iter())
                .map(|p| g.node(p).op.clone())
                .collect()
        };
        assert_eq!(
            params(&hoisted),
            params(&g),
            "the parameters keep their order"
        );
    }
}
