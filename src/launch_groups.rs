//! Launch groupings that hold values longer, kept only where the step's peak of live bytes
//! does not rise: parameter casts as cast groups, a scope's AdamW steps as one group, the
//! fused loss head's two backward ops as one, a norm's gradients as one, a residual add and
//! the norm of its sum as one, a weight gradient and its bias gradient as one, a recomputed
//! activation beside its gradient, and the loss head's forward in as few chunks as the room
//! under the peak allows, chosen after checkpointing for the plan being built
//! (`crate::budget::plan_with`).

use crate::front::train::TrainSpec;
use crate::ir::{Graph, Op, Phase, ValueId};
use crate::passes::liveness::Interval;
use crate::passes::StageError;
use crate::plan::{self, BuildOptions, Target};

/// `graph` with launches grouped where that does not raise the peak of live bytes: on
/// CUDA, where a launch costs time (the CPU backend runs every step alike) and the longer
/// lives may cost the layout bytes beyond the peak, each scope's parameter casts of one
/// phase one `cast_group` (`passes::cast_groups`), joined with the scopes' before it in
/// that phase where that holds too (not where the step copies to the host or pages: GPT-2
/// small bf16 at 3 GiB unified would fault 1,149 pages a step instead of 1,086), and with
/// the optimizer in backward each
/// scope's AdamW steps one group, large weights' too (`passes::group_updates`; updates on
/// the host are left alone, as the first grouping leaves them). A parallel rank's step is
/// left as it is: its stages and collectives are weighed by their own rules.
/// Each group is weighed on the live bytes of one schedule, the values it holds longer
/// added where they would be held, and kept where the peak stays; the groups kept are made
/// at once and the peak checked again on the grouped step (none kept if it rose).
/// `clones` follow their values. Forward groups join only where `allowed` says; the bool
/// says whether any did.
pub(crate) fn grouped_if_no_higher(
    graph: Graph,
    clones: Vec<(ValueId, ValueId)>,
    (target, train): (Target, Option<&TrainSpec>),
    (options, allowed): (&BuildOptions, Costly),
) -> Result<(Cloned, bool), StageError> {
    let join_forward = allowed.forward_joins;
    use crate::passes::{cast_groups, group_updates};
    let settings = train.map(|t| &t.settings);
    let apart = settings.is_none_or(|s| {
        s.offload.is_some_and(crate::settings::Offload::optimizer) || s.parallel.is_some()
    });
    let parallel = settings.is_some_and(|s| s.parallel.is_some());
    // Joined cast groups hold weight copies across layers: no longer where the step
    // copies to the host or pages (more to copy and fault, less compute to hide it).
    let moves = settings.is_some_and(|s| s.offload.is_some() || s.unified);
    let (graph, clones) = match target {
        Target::Cuda { .. } if !parallel && !moves => params_first(graph, clones)?,
        _ => (graph, clones),
    };
    let casts = match target {
        Target::Cuda { .. } if !parallel => cast_groups::keys(&graph),
        _ => Vec::new(),
    };
    let scopes = match !apart && options.optimizer_in_backward {
        true => group_updates::single_scopes(&graph),
        false => Vec::new(),
    };
    if casts.is_empty() && scopes.is_empty() {
        return Ok(((graph, clones), false));
    }
    let profile = plan::live_profile(&graph, options)?;
    let mut live = Held::new(profile.bytes.clone());
    let life = |v: ValueId| profile.lives[v.index()];
    let bytes = |v: ValueId| graph.node(v).ty.bytes();
    let casts: Vec<_> = (casts.into_iter())
        .filter(|key| live.hold_together(&cast_groups::members(&graph, key), life, bytes))
        .collect();
    let scopes: Vec<_> = (scopes.into_iter())
        .filter(|scope| {
            let members = group_updates::members_of(&graph, scope);
            let at = |v: ValueId| profile.position[v.index()];
            let Some(group) = members.iter().filter_map(|(u, _)| at(*u)).max() else {
                return false;
            };
            live.hold(members.iter().flat_map(|(_, grads)| {
                let ends = grads
                    .iter()
                    .filter_map(|&g| Some((bytes(g), life(g)?.last + 1)));
                ends.map(move |(b, end)| (b, end, group + 1))
                    .collect::<Vec<_>>()
            }))
        })
        .collect();
    let build = |casts: &[cast_groups::Key]| -> Result<_, StageError> {
        let (cast_graph, cast_map) = cast_groups::run(&graph, casts)?;
        let (grouped, update_map) = group_updates::run_scopes(&cast_graph, &scopes)?;
        Ok((grouped, cast_map, update_map))
    };
    // Cast groups joined last, with what the update groups leave (LLaMA-7B's updates would
    // lose 49 groups to joined casts weighed first), and kept only if the peak with each
    // step's workspace stays too (ResNet-18 bf16's backward casts joined in one group
    // would raise it by 102,656 bytes).
    let joined = match moves {
        true => casts.clone(),
        false => {
            let joins = (&graph, join_forward);
            cast_groups_joined(joins, casts.clone(), &mut live, life, bytes)
        }
    };
    let mut built = build(&casts)?;
    let mut forward_joined = false;
    if joined != casts {
        let with_joins = build(&joined)?;
        let peak = |g: &Graph| plan::live_peak_with_workspace(g, options, target);
        if peak(&with_joins.0)? <= peak(&built.0)? {
            built = with_joins;
            forward_joined =
                (joined.iter()).any(|k| k.phase == Phase::Forward && k.scopes.len() > 1);
        }
    }
    let (grouped, cast_map, update_map) = built;
    if plan::live_peak(&grouped, options)? > live.peak {
        return Ok(((graph, clones), false));
    }
    let moved = |v: ValueId| {
        let new = cast_map[v.index()].and_then(|c| update_map[c.index()]);
        new.ok_or_else(|| StageError::internal("grouping", "a clone grouped"))
    };
    let clones = clones_moved(&clones, moved)?;
    Ok(((grouped, clones), forward_joined))
}

/// `graph` with backward's pairs of launches merged where that does not raise the step's
/// peak of bytes in use, each step's workspace counted: on CUDA only, where a merge saves
/// launches and a pass over its operands (the CPU backend keeps the pairs apart, each op
/// giving the merged op's bits). First the fused loss head's two backward ops, one op that
/// computes each tile's logits once (`passes::lce_merge`; a pair whose weight gradient is
/// itself a parameter's gradient is left apart: that buffer is the update's); then, but not
/// where the step copies to the host or pages (`offload`, `unified`), each layer or RMS
/// norm's gradients, one `norm_backward` (`passes::norm_backward_merge`), each fp32
/// residual add with the layer or RMS norm of its sum, one `add_norm` (`passes::add_norm`;
/// forward's, and backward's recomputed ones), each weight
/// gradient with the bias gradient of the same `dy`, one cuBLASLt call
/// (`passes::bias_grad_epilogue`; with them GPT-2 small bf16 at 2 GiB under `--offload
/// optimizer` fitted another plan, 3 ms slower by the estimate), and each
/// activation backward recomputes beside its gradient, one `unary_pair`
/// (`passes::unary_pairs`): their longer lives leave the copies less compute to hide behind
/// and the pages more to fault (GPT-2 small bf16: 3.5 ms more on the H100 estimate with the
/// activations offloaded, 64 more faults a step at 3 GiB unified for the pairs, 17 for the
/// norms, whose input gradients live on to the update that reads their bias gradients).
/// Each is weighed on the graph the one before left, the norms and the adds group by group;
/// the adds only where `allowed` says, the bool saying whether any merged. `clones` follow
/// their values.
pub(crate) fn pairs_merged_if_no_higher(
    graph: Graph,
    clones: Vec<(ValueId, ValueId)>,
    (target, train): (Target, Option<&TrainSpec>),
    (options, allowed): (&BuildOptions, Costly),
) -> Result<(Cloned, bool), StageError> {
    use crate::passes::{bias_grad_epilogue, lce_merge, unary_pairs};
    if !matches!(target, Target::Cuda { .. }) {
        return Ok(((graph, clones), false));
    }
    let heads = |g: &Graph| {
        let pairs = lce_merge::pairs(g, &plan::param_gradients(g));
        found_merged(g, &pairs, lce_merge::run)
    };
    let (graph, clones, peak) = merged_if_no_higher((graph, clones, None), target, options, heads)?;
    let moves = train.is_some_and(|t| t.settings.offload.is_some() || t.settings.unified);
    if moves {
        return Ok(((graph, clones), false));
    }
    use crate::passes::{add_norm, norm_backward_merge as norms};
    let peaked = (graph, clones, peak);
    let at = (target, options);
    let peaked = held_merged(
        peaked,
        at,
        norms::groups,
        norms::NormGrads::members,
        norms::run,
    )?;
    let pair = |&(add, norm): &(ValueId, ValueId)| vec![add, norm];
    let (graph, clones, peak) = match allowed.add_norms {
        true => held_merged(peaked, at, add_norm::pairs, pair, add_norm::run)?,
        false => peaked,
    };
    let add_normed = (graph.values()).any(|v| matches!(graph.node(v).op, Op::AddNorm { .. }));
    let biases =
        |g: &Graph| found_merged(g, &bias_grad_epilogue::pairs(g), bias_grad_epilogue::run);
    let (graph, clones, peak) =
        merged_if_no_higher((graph, clones, peak), target, options, biases)?;
    let activations = |g: &Graph| found_merged(g, &unary_pairs::pairs(g), unary_pairs::run);
    let peaked = merged_if_no_higher((graph, clones, peak), target, options, activations)?;
    let (graph, clones, _) = head_chunks_widened(peaked, (target, options))?;
    Ok(((graph, clones), add_normed))
}

/// Which of the groupings whose longer lives can leave the layout above its lower bound
/// a plan is built with (`crate::budget::plan_with` plans a step again without them where
/// its layout misses the bound): forward cast groups joined across scopes, and residual
/// adds merged with the norms of their sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Costly {
    /// Forward cast groups may join across scopes.
    pub forward_joins: bool,
    /// Residual adds may merge with the norms of their sums.
    pub add_norms: bool,
}

impl Costly {
    /// Every grouping allowed.
    pub const ALL: Costly = Costly {
        forward_joins: true,
        add_norms: true,
    };
}

/// The step `planned` with every costly grouping allowed, or, where its layout misses its
/// lower bound, planned again without the groupings it made that may cost the layout bytes:
/// forward cast groups joined across scopes (LLaMA-7B bf16: 1.0052x the bound with them),
/// then residual adds merged with their norms (Llama-70B's shapes on 8 data-parallel ranks:
/// 64 MiB more); the smallest arena is kept, the first of equals. `planned` gives the graph,
/// its plan and the groupings it made.
pub(crate) fn smallest_of(
    planned: impl Fn(Costly) -> Result<(Graph, plan::Plan, Costly), StageError>,
) -> Result<(Graph, plan::Plan), StageError> {
    let (mut graph, mut best, made) = planned(Costly::ALL)?;
    let mut allowed = Costly::ALL;
    let fallbacks = [
        Costly {
            forward_joins: false,
            ..Costly::ALL
        },
        Costly {
            forward_joins: false,
            add_norms: false,
        },
    ];
    for next in fallbacks {
        let drops = |k: fn(&Costly) -> bool| k(&allowed) && !k(&next) && k(&made);
        let changes = drops(|c| c.forward_joins) || drops(|c| c.add_norms);
        if best.report.layout_optimal || !changes {
            continue;
        }
        allowed = next;
        let (g, p, _) = planned(next)?;
        if p.arena_bytes < best.arena_bytes {
            (graph, best) = (g, p);
        }
    }
    Ok((graph, best))
}

/// The rows a loss-head chunk's widening tries at a time (a tile of the logits' GEMM).
const CHUNK_ROWS: usize = 128;

/// `graph` with each fused loss head's forward chunk widened to fewer chunks, as few as the
/// room under the step's peak of bytes in use (each step's workspace counted) leaves for
/// their logits where it runs, of equal rows but the last (a few rows fewer, so it fills
/// the GPU as the others do): each chunk costs a GEMM and a kernel launch. The backward
/// ops keep their chunks (the peak is usually theirs: GPT-2 small's forward head runs 10
/// chunks of 820 rows, its backward the tiles of 16 chunks of 512). Kept only where the
/// peak does not rise.
fn head_chunks_widened(
    peaked: Peaked,
    (target, options): (Target, &BuildOptions),
) -> Result<Peaked, StageError> {
    use crate::ir::{LinearCe, TensorType};
    use crate::passes::rewrite::{rebuild, Edit};
    let widen = |g: &Graph| {
        let profile = plan::live_profile_with_workspace(g, options, target)?;
        let peak = profile.bytes.iter().copied().max().unwrap_or(0);
        let mut widened = std::collections::BTreeMap::new();
        for v in g.values() {
            let node = g.node(v);
            let (&Op::LinearCrossEntropy(lce), Some(at)) = (&node.op, profile.position[v.index()])
            else {
                continue;
            };
            let inputs: Vec<&TensorType> = node.inputs.iter().map(|&i| &g.node(i).ty).collect();
            let rows = inputs.get(2).map_or(0, |t| t.numel() as usize);
            let op = |chunk| Op::LinearCrossEntropy(LinearCe { chunk, ..lce });
            let workspace = |chunk| target.workspace_bytes(&op(chunk), &inputs, &node.ty);
            let room = peak.saturating_sub(profile.bytes[at]) + workspace(lce.chunk);
            let mut widest = lce.chunk;
            let mut next = (lce.chunk / CHUNK_ROWS + 1) * CHUNK_ROWS;
            while widest < rows && workspace(next.min(rows)) <= room {
                widest = next.min(rows);
                next += CHUNK_ROWS;
            }
            let chunk = rows.div_ceil(rows.div_ceil(widest.max(1)));
            if chunk > lce.chunk {
                widened.insert(v, op(chunk));
            }
        }
        if widened.is_empty() {
            return Ok(None);
        }
        let edit = |v: ValueId| match widened.get(&v) {
            Some(op) => Edit::Rebuild(op.clone(), g.node(v).inputs.clone()),
            None => Edit::Keep,
        };
        rebuild(g, "head_chunks", edit).map(Some)
    };
    merged_if_no_higher(peaked, target, options, widen)
}

/// `graph` with each group `found` (each of whose `members` its merge holds together) merged
/// by `run` where its members held together do not raise the peak of bytes in use with each
/// step's workspace (group by group: fp32 GPT-2's final norm's two gradients, 6,144 bytes,
/// would), then only if the whole graph's peak does not rise either: a layer or RMS norm's
/// gradients as one `norm_backward` (`passes::norm_backward_merge`), an fp32 residual add
/// and the norm of its sum as one `add_norm` (`passes::add_norm`).
fn held_merged<T>(
    (graph, clones, peak): Peaked,
    (target, options): (Target, &BuildOptions),
    found: impl Fn(&Graph) -> Vec<T>,
    members: impl Fn(&T) -> Vec<ValueId>,
    run: impl Fn(&Graph, &[T]) -> Result<(Graph, Vec<Option<ValueId>>), StageError>,
) -> Result<Peaked, StageError> {
    let merge = |g: &Graph| {
        let groups = found(g);
        if groups.is_empty() {
            return Ok(None);
        }
        let profile = plan::live_profile_with_workspace(g, options, target)?;
        let mut live = Held::new(profile.bytes.clone());
        let life = |v: ValueId| profile.lives[v.index()];
        let bytes = |v: ValueId| g.node(v).ty.bytes();
        let kept: Vec<T> = (groups.into_iter())
            .filter(|group| live.hold_together(&members(group), life, bytes))
            .collect();
        found_merged(g, &kept, &run)
    };
    merged_if_no_higher((graph, clones, peak), target, options, merge)
}

/// A rebuilt graph with each old value's new one, or `None` where there was nothing to merge
/// (no graph is rebuilt then).
type Merge = Option<(Graph, Vec<Option<ValueId>>)>;

/// `run` over what a merge `found` in `g`, or `None` where it found nothing.
fn found_merged<T>(
    g: &Graph,
    found: &[T],
    run: impl Fn(&Graph, &[T]) -> Result<(Graph, Vec<Option<ValueId>>), StageError>,
) -> Result<Merge, StageError> {
    match found.is_empty() {
        true => Ok(None),
        false => run(g, found).map(Some),
    }
}

/// A graph, its clone pairs and, when known, its peak of bytes in use with each step's
/// workspace.
type Peaked = (Graph, Vec<(ValueId, ValueId)>, Option<u64>);

/// `graph` as `merge` rebuilds it, where that does not raise the peak of bytes in use with
/// each step's workspace (`known`, when given, is the graph's: it is not computed again);
/// `clones` follow their values. Gives the peak of the graph it keeps when it computed or
/// knew it.
fn merged_if_no_higher(
    (graph, clones, known): Peaked,
    target: Target,
    options: &BuildOptions,
    merge: impl Fn(&Graph) -> Result<Merge, StageError>,
) -> Result<Peaked, StageError> {
    let Some((merged, map)) = merge(&graph)? else {
        return Ok((graph, clones, known));
    };
    let peak = |g: &Graph| plan::live_peak_with_workspace(g, options, target);
    let before = match known {
        Some(p) => p,
        None => peak(&graph)?,
    };
    let after = peak(&merged)?;
    if after > before {
        return Ok((graph, clones, Some(before)));
    }
    let moved = |v: ValueId| {
        map[v.index()].ok_or_else(|| StageError::internal("merge", "a clone merged away"))
    };
    let clones = clones_moved(&clones, moved)?;
    Ok((merged, clones, Some(after)))
}

/// `graph` with its parameters made first (`passes::cast_groups::params_first`); `clones`
/// follow their values.
fn params_first(graph: Graph, clones: Vec<(ValueId, ValueId)>) -> Result<Cloned, StageError> {
    let (hoisted, map) = crate::passes::cast_groups::params_first(&graph)?;
    let moved = |v: ValueId| {
        map[v.index()].ok_or_else(|| StageError::internal("cast_groups", "a clone left out"))
    };
    let clones = clones_moved(&clones, moved)?;
    Ok((hoisted, clones))
}

/// `clones` with each value replaced by its new one, `moved` gives.
fn clones_moved(
    clones: &[(ValueId, ValueId)],
    moved: impl Fn(ValueId) -> Result<ValueId, StageError>,
) -> Result<Vec<(ValueId, ValueId)>, StageError> {
    (clones.iter())
        .map(|&(v, c)| Ok((moved(v)?, moved(c)?)))
        .collect()
}

/// A graph and its clone pairs.
type Cloned = (Graph, Vec<(ValueId, ValueId)>);

/// `kept` (cast groups held in `live`, in order) with each joined to the group before it
/// where they cast in one phase between the same types (the forward only with
/// `join_forward`), the joined group takes every cast of both, and `live` holds the bytes
/// their members would then hold longer.
fn cast_groups_joined(
    (graph, join_forward): (&Graph, bool),
    kept: Vec<crate::passes::cast_groups::Key>,
    live: &mut Held,
    life: impl Fn(ValueId) -> Option<Interval>,
    bytes: impl Fn(ValueId) -> u64,
) -> Vec<crate::passes::cast_groups::Key> {
    use crate::passes::cast_groups::{members, Key};
    // Each group's members with their lifetimes, and the steps the group holds them over.
    let held = |key: &Key| {
        let lives: Vec<(ValueId, Interval)> = (members(graph, key).into_iter())
            .filter_map(|m| Some((m, life(m)?)))
            .collect();
        let first = lives.iter().map(|(_, l)| l.first).min();
        let last = lives.iter().map(|(_, l)| l.last).max();
        Some((lives, first?, last?))
    };
    let mut out: Vec<Key> = Vec::new();
    for key in kept {
        let Some(open) = out.last_mut() else {
            out.push(key);
            continue;
        };
        let both = members(graph, open).len() + members(graph, &key).len();
        let joined = (open.joined(&key))
            .filter(|j| members(graph, j).len() == both)
            .filter(|j| join_forward || j.phase != Phase::Forward);
        let (Some(joined), Some(a), Some(b)) = (joined, held(open), held(&key)) else {
            out.push(key);
            continue;
        };
        let (first, last) = (a.1.min(b.1), a.2.max(b.2));
        let longer = [a, b].into_iter().flat_map(|(lives, from, to)| {
            let bytes = &bytes;
            (lives.into_iter())
                .flat_map(move |(m, _)| [(bytes(m), first, from), (bytes(m), to + 1, last + 1)])
        });
        match live.hold(longer.collect::<Vec<_>>()) {
            true => *open = joined,
            false => out.push(key),
        }
    }
    out
}

/// Live bytes per step with the values groups hold longer added, against the peak before.
struct Held {
    bytes: Vec<u64>,
    peak: u64,
}

impl Held {
    fn new(bytes: Vec<u64>) -> Held {
        let peak = bytes.iter().copied().max().unwrap_or(0);
        Held { bytes, peak }
    }

    /// Holds `members` (of lifetimes `life`, sizes `bytes`) together, each from the first
    /// one's start to the last one's end, as one buffer holding them all would, if no step
    /// then holds more than the peak; false (the profile as it was) otherwise, or when none
    /// of them has a lifetime.
    fn hold_together(
        &mut self,
        members: &[ValueId],
        life: impl Fn(ValueId) -> Option<Interval>,
        bytes: impl Fn(ValueId) -> u64,
    ) -> bool {
        let lives: Vec<_> = (members.iter())
            .filter_map(|&m| Some((m, life(m)?)))
            .collect();
        let (Some(first), Some(last)) = (
            lives.iter().map(|(_, l)| l.first).min(),
            lives.iter().map(|(_, l)| l.last).max(),
        ) else {
            return false;
        };
        self.hold(
            lives
                .iter()
                .flat_map(|&(m, l)| [(bytes(m), first, l.first), (bytes(m), l.last + 1, last + 1)]),
        )
    }

    /// Adds `(bytes, from, to)` (steps `from..to`) and keeps them if no step then holds more
    /// than the peak; otherwise leaves the profile as it was and says no.
    fn hold(&mut self, spans: impl IntoIterator<Item = (u64, usize, usize)>) -> bool {
        let mut with = self.bytes.clone();
        for (b, from, to) in spans {
            let to = to.min(with.len());
            for x in with.get_mut(from.min(to)..to).into_iter().flatten() {
                *x += b;
            }
        }
        let fits = with.iter().all(|&x| x <= self.peak);
        if fits {
            self.bytes = with;
        }
        fits
    }
}
