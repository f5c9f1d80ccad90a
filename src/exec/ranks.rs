//! Every rank of a data-parallel plan in one process: one CPU executor per rank, each on its
//! own thread, meeting at the plan's collectives through one in-process [`Group`]. The
//! ranks start from the parameters one rank would (sharded ones sliced) and draw the
//! synthetic inputs of the whole batch, each taking its rows, so N ranks run the step one
//! rank runs on the whole batch.

use super::cpu::CpuExecutor;
use super::group::Group;
use super::ExecError;
use crate::plan::VerifiedPlan;
use std::sync::Arc;

/// The executors of all ranks of one data-parallel plan.
pub struct Ranks {
    executors: Vec<CpuExecutor>,
    group: Arc<Group>,
}

impl Ranks {
    /// One executor per rank of `plan` (as many as `report.parallel` names; one for a plan
    /// without it), all members of one group.
    pub fn new(plan: &VerifiedPlan) -> Result<Ranks, ExecError> {
        let ranks = plan.plan().report.parallel.as_ref().map_or(1, |p| p.data) as usize;
        if plan.plan().micro_steps() > 1 {
            return Err(ExecError::Unsupported(
                "a data-parallel plan with gradient accumulation".into(),
            ));
        }
        let group = Arc::new(Group::new(ranks));
        let mut executors = Vec::with_capacity(ranks);
        for rank in 0..ranks {
            let mut ex = CpuExecutor::new(plan)?;
            ex.join(rank, Arc::clone(&group));
            executors.push(ex);
        }
        Ok(Ranks { executors, group })
    }

    /// The executors, in rank order.
    pub fn executors(&self) -> &[CpuExecutor] {
        &self.executors
    }

    /// Initializes every rank's parameters and state from `seed` (each sharded parameter
    /// from its slice of the full values), keys the dropout masks of rank `r` by
    /// `seed + r`, and binds synthetic inputs: the whole batch's, drawn as one rank with the
    /// whole batch draws them, each rank taking its rows.
    pub fn start(&mut self, seed: u64) -> Result<(), ExecError> {
        let ranks = self.executors.len();
        for (rank, ex) in self.executors.iter_mut().enumerate() {
            ex.init_params(seed)?;
            ex.set_seed(seed.wrapping_add(rank as u64));
        }
        let Some(first) = self.executors.first() else {
            return Ok(());
        };
        let plan = first.plan().clone();
        for (k, input) in plan.inputs.iter().enumerate() {
            let ty = &plan.buffers[input.buffer.index()].ty;
            let n = ty.numel() as usize;
            let all = crate::init::synthetic_values(input, ty, (n * ranks) as u64, (k, seed));
            for (ex, rows) in self.executors.iter_mut().zip(all.chunks(n.max(1))) {
                ex.bind_input(input.buffer, rows.to_vec())?;
            }
        }
        Ok(())
    }

    /// Sets the 1-based number of the next step on every rank.
    pub fn set_step_number(&mut self, t: u64) {
        for ex in &mut self.executors {
            ex.set_step_number(t);
        }
    }

    /// Runs one training step on every rank at once, one thread each, and returns the
    /// step's loss: the mean of the ranks' losses, summed in rank order (None for a plan
    /// without a loss). A rank that fails aborts the group, and the first failure in rank
    /// order is returned.
    pub fn run_step(&mut self) -> Result<Option<f32>, ExecError> {
        let group = &self.group;
        let results: Vec<Result<(), ExecError>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .executors
                .iter_mut()
                .map(|ex| {
                    s.spawn(move || {
                        let result = ex.run_step(None);
                        if result.is_err() {
                            group.abort();
                        }
                        result
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(ExecError::Device("a rank's thread panicked".into()))
                    })
                })
                .collect()
        });
        let failures: Vec<ExecError> = results.into_iter().filter_map(Result::err).collect();
        // A rank released by another's failure reports only that; the failure itself wins.
        let cause = failures
            .iter()
            .position(|e| !super::group::is_abort(e))
            .unwrap_or(0);
        if let Some(e) = failures.into_iter().nth(cause) {
            return Err(e);
        }
        let losses: Option<Vec<f32>> = self
            .executors
            .iter()
            .map(|ex| ex.output("loss").and_then(|l| l.first().copied()))
            .collect();
        Ok(losses.map(|l| l.iter().sum::<f32>() / l.len().max(1) as f32))
    }
}
