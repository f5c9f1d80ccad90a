//! Every rank of a parallel plan in one process: one CPU executor per rank, each on its own
//! thread, meeting at the plan's collectives through in-process [`Group`]s: the data
//! collectives among the ranks holding the same tensor slice of the same stage, the
//! tensor-parallel sums among a replica's tensor ranks, and a pipeline's sends and receives
//! through each replica's [`Mailbox`]. The ranks start from the parameters one rank would
//! (sharded ones sliced, split ones cut, each stage's its own) and draw the synthetic
//! inputs of the whole batch, each replica taking its rows, so the ranks run the step one
//! rank runs on the whole batch.

use super::cpu::CpuExecutor;
use super::group::Group;
use super::mailbox::Mailbox;
use super::ExecError;
use crate::plan::VerifiedPlan;
use std::sync::Arc;

/// The executors of all ranks of one parallel plan.
pub struct Ranks {
    executors: Vec<CpuExecutor>,
    groups: Vec<Arc<Group>>,
    mailboxes: Vec<Arc<Mailbox>>,
    tensor: usize,
    /// Ranks per pipeline stage (all of them without a pipeline).
    per_stage: usize,
}

impl Ranks {
    /// One executor per rank of `plan` (as many as `report.parallel` names; one for a plan
    /// without it): rank `r` is rank `r % per_stage` of stage `r / per_stage` (one stage
    /// without a pipeline), within it tensor rank `% tensor` of replica `/ tensor`, a member
    /// of its stage's tensor slice's data group, of its stage's replica's tensor group and,
    /// with a pipeline, of the mailbox of its replica's tensor rank on every stage.
    pub fn new(plan: &VerifiedPlan) -> Result<Ranks, ExecError> {
        let layout = plan.plan().report.parallel.as_ref();
        let data = layout.map_or(1, |p| p.data) as usize;
        let tensor = layout.map_or(1, |p| p.tensor) as usize;
        if plan.plan().micro_steps() > 1 {
            return Err(ExecError::Unsupported(
                "a data-parallel plan with gradient accumulation".into(),
            ));
        }
        let stages = plan.stage_plans();
        let per_stage = data * tensor;
        let data_groups: Vec<Arc<Group>> = (0..tensor * stages.len())
            .map(|_| Arc::new(Group::new(data)))
            .collect();
        let tensor_groups: Vec<Arc<Group>> = (0..data * stages.len())
            .map(|_| Arc::new(Group::new(tensor)))
            .collect();
        // A replica's tensor rank exchanges with the same tensor rank of its other stages.
        let mailboxes: Vec<Arc<Mailbox>> = match stages.len() {
            1 => Vec::new(),
            _ => (0..per_stage).map(|_| Arc::new(Mailbox::new())).collect(),
        };
        let mut executors = Vec::with_capacity(per_stage * stages.len());
        for (stage, stage_plan) in stages.iter().enumerate() {
            for rank in 0..per_stage {
                let (replica, slice) = (rank / tensor, rank % tensor);
                let mut ex = CpuExecutor::new(stage_plan)?;
                ex.join(replica, Arc::clone(&data_groups[stage * tensor + slice]));
                if tensor > 1 {
                    let group = &tensor_groups[stage * data + replica];
                    ex.join_tensor(slice, Arc::clone(group));
                }
                if let Some(mailbox) = mailboxes.get(rank) {
                    ex.join_pipeline(stage as u32, Arc::clone(mailbox));
                }
                executors.push(ex);
            }
        }
        let groups = data_groups.into_iter().chain(tensor_groups).collect();
        Ok(Ranks {
            executors,
            groups,
            mailboxes,
            tensor,
            per_stage,
        })
    }

    /// The executors, in rank order.
    pub fn executors(&self) -> &[CpuExecutor] {
        &self.executors
    }

    /// Initializes every rank's parameters and state from `seed` (each sharded or split
    /// parameter from its slice of the full values, each stage's parameters as the whole
    /// model's), keys the dropout masks of replica `d` by `seed + d` (a replica's tensor
    /// ranks draw the same masks of the values they all hold), and binds synthetic inputs:
    /// the whole batch's, drawn as one rank with the whole batch draws them, each replica
    /// taking its rows.
    pub fn start(&mut self, seed: u64) -> Result<(), ExecError> {
        let (tensor, per_stage) = (self.tensor, self.per_stage);
        let replicas = per_stage / tensor;
        for (rank, ex) in self.executors.iter_mut().enumerate() {
            ex.init_params(seed)?;
            ex.set_seed(seed.wrapping_add((rank % per_stage / tensor) as u64));
        }
        for stage in self.executors.chunks_mut(per_stage.max(1)) {
            let Some(first) = stage.first() else {
                continue;
            };
            let plan = first.plan().clone();
            for (k, input) in plan.inputs.iter().enumerate() {
                let ty = &plan.buffers[input.buffer.index()].ty;
                let n = ty.numel() as usize;
                let drawn = (plan.pipeline.as_ref()).map_or(k, |p| p.input_index(&input.name, k));
                let all =
                    crate::init::synthetic_values(input, ty, (n * replicas) as u64, (drawn, seed));
                for (rank, ex) in stage.iter_mut().enumerate() {
                    let rows = all.chunks(n.max(1)).nth(rank / tensor).unwrap_or_default();
                    ex.bind_input(input.buffer, rows.to_vec())?;
                }
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
    /// step's loss: the mean of the replicas' losses (each replica's tensor rank 0's, on
    /// the last stage),
    /// summed in replica order (None for a plan without a loss). A rank that fails aborts
    /// every group, and the first failure in rank order is returned.
    pub fn run_step(&mut self) -> Result<Option<f32>, ExecError> {
        let (groups, mailboxes) = (&self.groups, &self.mailboxes);
        let results: Vec<Result<(), ExecError>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .executors
                .iter_mut()
                .map(|ex| {
                    s.spawn(move || {
                        let result = ex.run_step(None);
                        if result.is_err() {
                            groups.iter().for_each(|g| g.abort());
                            mailboxes.iter().for_each(|m| m.abort());
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
        let last_stage = self.executors.len().saturating_sub(self.per_stage);
        let losses: Option<Vec<f32>> = (self.executors[last_stage..].iter())
            .step_by(self.tensor)
            .map(|ex| ex.output("loss").and_then(|l| l.first().copied()))
            .collect();
        Ok(losses.map(|l| l.iter().sum::<f32>() / l.len().max(1) as f32))
    }
}
