//! Per-block choices by knapsack: each top-level block instance is recomputed in one of three
//! ways (pointwise, selective, the whole instance from its input), and the choices that remove
//! a given number of saved bytes for the fewest recomputed FLOPs are taken, instance by
//! instance, greedily by bytes removed per FLOP (the multiple-choice knapsack's greedy over
//! each instance's lower convex hull, as torch.compile's activation-memory-budget knapsack
//! orders its candidates by memory per runtime). Blocks that hold more activations for less
//! compute (a UNet's high-resolution blocks, a transformer's attention scores) go first,
//! rather than the first or every k-th block.

use super::{block_values, instance, instance_order, min_cut, needed, selective};
use crate::ir::cost::flops;
use crate::ir::*;
use std::collections::{BTreeMap, BTreeSet};

/// How one block instance is recomputed, in order of growing recomputation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Way {
    /// Pointwise ops and norms recomputed from values saved anyway.
    Pointwise,
    /// Cheap ops recomputed, heavy ops' outputs kept.
    Selective,
    /// Everything but the values other instances read, recomputed from the instance's input.
    Whole,
}

/// Each way's recomputed values, and what it saves and recomputes in each instance.
struct Menu {
    /// The values each way recomputes (over the whole graph).
    sets: [BTreeSet<ValueId>; 3],
    /// Per instance (in creation order), per way: (saved bytes, recomputed FLOPs).
    costs: Vec<[(u64, u64); 3]>,
    /// Instance names in creation order.
    names: Vec<String>,
}

impl Menu {
    fn of(graph: &Graph) -> Menu {
        let sets = [
            min_cut(graph, None, true),
            selective(graph),
            block_values(graph, |_| true, |_| true),
        ];
        let order = instance_order(graph);
        let mut names: Vec<(usize, String)> =
            order.iter().map(|(n, &i)| (i, n.to_string())).collect();
        names.sort();
        let mut costs = vec![[(0, 0); 3]; names.len()];
        for (way, set) in sets.iter().enumerate() {
            for v in saved(graph, set) {
                if let Some(&i) = order.get(instance(&graph.node(v).scope)) {
                    costs[i][way].0 += graph.node(v).ty.bytes();
                }
            }
            for &v in set {
                if let Some(&i) = order.get(instance(&graph.node(v).scope)) {
                    costs[i][way].1 += value_flops(graph, v);
                }
            }
        }
        Menu {
            sets,
            costs,
            names: names.into_iter().map(|(_, n)| n).collect(),
        }
    }

    /// The steps from pointwise towards whole-instance recomputation, over all instances,
    /// in the order the greedy takes them: (instance, way, bytes removed).
    fn steps(&self) -> Vec<(usize, Way, u64)> {
        let mut steps: Vec<(f64, usize, Way, u64)> = Vec::new();
        for (i, cost) in self.costs.iter().enumerate() {
            let mut at = Way::Pointwise;
            // The lower convex hull: from `at`, the way with the most bytes removed per
            // added FLOP; ways that remove nothing more are skipped.
            while let Some((ratio, way, removed)) = [Way::Selective, Way::Whole]
                .into_iter()
                .filter(|&w| w > at)
                .filter_map(|w| {
                    let (from, to) = (cost[at as usize], cost[w as usize]);
                    let removed = from.0.checked_sub(to.0).filter(|&r| r > 0)?;
                    let added = to.1.saturating_sub(from.1).max(1);
                    Some((removed as f64 / added as f64, w, removed))
                })
                .max_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)))
            {
                steps.push((ratio, i, way, removed));
                at = way;
            }
        }
        // Hull ratios fall within an instance, so a stable sort by falling ratio keeps each
        // instance's steps in order.
        steps.sort_by(|a, b| b.0.total_cmp(&a.0));
        steps.into_iter().map(|(_, i, w, r)| (i, w, r)).collect()
    }

    /// The bytes removed after each step of the greedy, rising.
    fn cumulative(&self) -> Vec<u64> {
        self.steps()
            .iter()
            .scan(0u64, |sum, step| {
                *sum += step.2;
                Some(*sum)
            })
            .collect()
    }
}

/// Forward values the rewrite keeps for backward when `recompute` is recomputed: those
/// backward reads, and the inputs of recomputed values, found through recomputed values.
fn saved(graph: &Graph, recompute: &BTreeSet<ValueId>) -> BTreeSet<ValueId> {
    let mut kept = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut stack: Vec<ValueId> = needed(graph).into_iter().collect();
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        if recompute.contains(&v) {
            stack.extend(graph.node(v).inputs.iter().copied());
        } else if graph.node(v).phase == Phase::Forward
            && graph.node(v).op.class() != OpClass::Source
        {
            kept.insert(v);
        }
    }
    kept
}

fn value_flops(graph: &Graph, v: ValueId) -> u64 {
    let node = graph.node(v);
    let types: Vec<&TensorType> = node.inputs.iter().map(|&i| &graph.node(i).ty).collect();
    flops(&node.op, &types, &node.ty)
}

/// The values to recompute so that at least `saving` bytes of saved activations go beyond
/// what pointwise recomputation saves, for the fewest recomputed FLOPs by the greedy above:
/// each instance's values of the way chosen for it, pointwise recomputation outside blocks
/// and in the instances left as they are. A `saving` past what is possible recomputes every
/// instance whole.
pub(super) fn choose(graph: &Graph, saving: u64) -> BTreeSet<ValueId> {
    let menu = Menu::of(graph);
    let mut ways = vec![Way::Pointwise; menu.names.len()];
    let mut removed = 0u64;
    for (i, way, bytes) in menu.steps() {
        if removed >= saving {
            break;
        }
        ways[i] = way;
        removed += bytes;
    }
    let order: BTreeMap<&str, usize> = menu
        .names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let way_of = |v: &ValueId| {
        order
            .get(instance(&graph.node(*v).scope))
            .map_or(Way::Pointwise, |&i| ways[i])
    };
    menu.sets
        .iter()
        .enumerate()
        .flat_map(|(way, set)| {
            set.iter()
                .filter(move |v| way_of(v) as usize == way)
                .copied()
        })
        .collect()
}

/// At most `count` savings, each what a prefix of the greedy removes (so each gives a
/// different plan), spread evenly over its steps up to every instance recomputed whole: the
/// knapsack policies of the frontier between pointwise and per-block recomputation.
pub fn savings(graph: &Graph, count: usize) -> Vec<u64> {
    let cumulative = Menu::of(graph).cumulative();
    let steps = cumulative.len();
    let mut picked: Vec<u64> = (1..=count.min(steps))
        .map(|k| cumulative[(k * steps).div_ceil(count.min(steps)) - 1])
        .collect();
    picked.dedup();
    picked
}
