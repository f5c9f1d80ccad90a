//! `memc fit --ranks`: the fewest ranks, and at that count the lowest ZeRO stage, then the
//! fewest tensor-parallel ranks, whose per-rank plan fits a budget per device: when one
//! device cannot hold a step's weights, gradients and optimizer state, how many of them
//! can, and split how.

use crate::parallel::Parallel;
use crate::plan::VerifiedPlan;
use crate::{compile, CompileError, Options};

/// One layout tried: `data` replicas of `tensor` ranks at ZeRO stage `zero`, and the
/// per-device bytes its plan is held to (`Report::budgeted_bytes`) when it fits, or why it
/// does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankProbe {
    /// Data-parallel ranks.
    pub data: u32,
    /// Tensor-parallel ranks per replica.
    pub tensor: u32,
    /// ZeRO stage.
    pub zero: u8,
    /// The plan's budgeted bytes (arena, plus the CUDA context and NCCL on a GPU) when it
    /// fits.
    pub bytes: Option<u64>,
    /// The diagnostic's message when it does not.
    pub refusal: Option<String>,
}

/// The answer: the layout that fits with the fewest ranks, its plan, and every layout
/// tried on the way, in order.
#[derive(Debug, Clone)]
pub struct RanksFit {
    /// The layout (one rank: `data = 1`, compiled as the plain step).
    pub parallel: Parallel,
    /// Its per-rank plan, within the budget.
    pub plan: VerifiedPlan,
    /// Every layout tried, the answer last.
    pub probes: Vec<RankProbe>,
}

/// Why no layout was found.
#[derive(Debug, Clone)]
pub enum RanksFitError {
    /// Up to `max_ranks` ranks, no stage fits; every layout tried, in order.
    Infeasible {
        max_ranks: u32,
        probes: Vec<RankProbe>,
    },
    /// A compile failed for a reason other than the budget (a broken invariant).
    Internal(Vec<String>),
}

/// The most tensor-parallel ranks a layout is tried with: the GPUs of one node, whose
/// links carry the per-layer sums.
pub const MAX_TENSOR: u32 = 8;

/// Tries 1, 2, 4, ... ranks up to `max_ranks` (at most [`crate::parallel::MAX_RANKS`]); at
/// each count ZeRO stages 0 to 3 and, at each stage, `tensor` = 1, 2, 4, 8 ranks per replica
/// (up to [`MAX_TENSOR`] and the count; the rest data-parallel; stages above 0 only with
/// more than one replica, as sharding over one changes nothing), compiling `source` with
/// `options` under `budget` per device, and returns the first that fits: the fewest ranks,
/// then the lowest stage, then the fewest tensor ranks (the least communication).
/// `options.parallel` gives the batch mode (each replica's batch as written unless it says
/// `batch = global`). A layout the compiler refuses for any user error (the budget, a batch
/// the replicas do not divide, heads the tensor ranks do not divide, a setting a stage does
/// not combine with) is a probe that does not fit.
pub fn fewest_ranks(
    source: &str,
    options: &Options,
    budget: u64,
    max_ranks: u32,
) -> Result<RanksFit, RanksFitError> {
    let global_batch = options.parallel.is_some_and(|p| p.global_batch);
    let mut probes = Vec::new();
    let counts = std::iter::successors(Some(1u32), |&n| n.checked_mul(2))
        .take_while(|&n| n <= max_ranks.clamp(1, crate::parallel::MAX_RANKS));
    let mut layouts = Vec::new();
    for n in counts {
        for zero in 0..=3u8 {
            let tensors = std::iter::successors(Some(1u32), |&t| t.checked_mul(2));
            for tensor in tensors.take_while(|&t| t <= n.min(MAX_TENSOR)) {
                if n / tensor > 1 || zero == 0 {
                    layouts.push((n / tensor, tensor, zero));
                }
            }
        }
    }
    for (data, tensor, zero) in layouts {
        let parallel = Parallel {
            data,
            zero,
            global_batch,
            tensor,
            ..Parallel::default()
        };
        let attempt = Options {
            // One rank is the plain step: no collectives.
            parallel: (data * tensor > 1).then_some(parallel),
            budget: Some(budget),
            ..options.clone()
        };
        let probe = |bytes, refusal| RankProbe {
            data,
            tensor,
            zero,
            bytes,
            refusal,
        };
        match compile(source, &attempt) {
            Ok(c) => {
                probes.push(probe(Some(c.plan.plan().report.budgeted_bytes()), None));
                return Ok(RanksFit {
                    parallel,
                    plan: c.plan,
                    probes,
                });
            }
            Err(CompileError::User(e)) => probes.push(probe(None, Some(e.message))),
            Err(CompileError::Internal(errs)) => return Err(RanksFitError::Internal(errs)),
        }
    }
    Err(RanksFitError::Infeasible { max_ranks, probes })
}
