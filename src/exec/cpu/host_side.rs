//! The host side of an offloaded plan on the CUDA backend: the host arena alone (the device
//! arena lives on the GPU), and the CPU kernels that run the plan's host steps on it, the
//! same kernels and the same bytes as the CPU backend's.

use super::CpuExecutor;
use crate::exec::ExecError;
use crate::plan::{BufferId, Placement, Plan, Tier};

impl CpuExecutor {
    /// An executor holding only `plan`'s host arena (zeroed; no device arena): it runs the
    /// plan's host steps ([`CpuExecutor::run_host_step`]) and reads and writes host buffers.
    pub(crate) fn host_side(plan: &Plan) -> CpuExecutor {
        CpuExecutor::with_arenas(plan.clone(), false)
    }

    /// Runs plan step `s`, a host step, as step `number` of a run seeded with `seed`, in
    /// micro-step `micro`; refuses a step that is not on the host (its device buffers are
    /// not here).
    pub(crate) fn run_host_step(
        &mut self,
        s: usize,
        (number, seed, micro): (u64, u64, u32),
    ) -> Result<(), ExecError> {
        let step = self.plan.steps[s].clone();
        if self.plan.placement(&step) != Placement::Host {
            return Err(ExecError::Unsupported(format!(
                "step {s} ({}) is not a host step",
                step.op.name()
            )));
        }
        (self.step, self.seed, self.micro) = (number, seed, micro);
        let views = self.views(&step);
        self.execute(&step, &views)?;
        views.write_back();
        Ok(())
    }

    /// The host arena's start and length in bytes, for pinning it and copying into it. The
    /// allocation never moves while the executor lives.
    pub(crate) fn host_arena(&mut self) -> (*mut u8, usize) {
        let bytes = self.host.len() * std::mem::size_of::<f32>();
        (self.host.as_mut_ptr().cast(), bytes)
    }

    /// The host arena's bytes of host buffer `b` (an error for a buffer not there).
    pub(crate) fn host_bytes(&self, b: BufferId) -> Result<&[u8], ExecError> {
        let range = self.host_range(b)?;
        // SAFETY: the arena's f32 words are plain bytes, read for the arena's length.
        let all = unsafe {
            std::slice::from_raw_parts(self.host.as_ptr().cast::<u8>(), self.host.len() * 4)
        };
        Ok(&all[range])
    }

    /// [`CpuExecutor::host_bytes`], writable.
    pub(crate) fn host_bytes_mut(&mut self, b: BufferId) -> Result<&mut [u8], ExecError> {
        let range = self.host_range(b)?;
        // SAFETY: as in `host_bytes`; every bit pattern is a valid f32.
        let all = unsafe {
            std::slice::from_raw_parts_mut(self.host.as_mut_ptr().cast::<u8>(), self.host.len() * 4)
        };
        Ok(&mut all[range])
    }

    /// The byte range of host buffer `b` in the host arena.
    fn host_range(&self, b: BufferId) -> Result<std::ops::Range<usize>, ExecError> {
        let buf = (self.plan.buffers.get(b.index()))
            .filter(|x| x.tier == Tier::Host)
            .ok_or_else(|| {
                ExecError::Unsupported(format!("buffer {} is not a host buffer", b.0))
            })?;
        let range = buf.offset as usize..(buf.offset + buf.bytes) as usize;
        match range.end <= self.host.len() * 4 {
            true => Ok(range),
            false => Err(ExecError::Shape(format!(
                "`{}` ends past the host arena",
                buf.name
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offloaded_gpt() -> crate::plan::VerifiedPlan {
        let source =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/gpt2.mdl"))
                .expect("the example exists");
        let mut options = crate::Options::default();
        for (k, v) in [("B", 2), ("T", 8), ("D", 16), ("H", 2), ("L", 1), ("V", 32)] {
            options.overrides.push((k.to_string(), v));
        }
        options.precision = Some(crate::settings::Precision::Bf16);
        options.offload = Some(crate::settings::Offload::All);
        crate::compile(&source, &options)
            .expect("the small GPT-2 compiles")
            .plan
    }

    /// An executor holding the host arena alone runs each host step to the same bytes as
    /// the whole executor does, from the same host arena, for two training steps (the step
    /// number keys the update's bias correction); it refuses a device step.
    #[test]
    fn the_host_side_runs_host_steps_as_the_whole_executor_does() {
        let verified = offloaded_gpt();
        let plan = verified.plan().clone();
        let mut whole = CpuExecutor::new(&verified).expect("allocates");
        whole.init_params(3).expect("initializes");
        whole.synthetic_inputs(3).expect("binds");
        let mut host = CpuExecutor::host_side(&plan);
        assert!(host.arena.is_empty());
        let mut ran = 0;
        for number in 1..=2u64 {
            whole.step = number;
            whole.rebind(0).expect("rebinds");
            for (s, step) in plan.steps.iter().enumerate() {
                let on_host = plan.placement(step) == Placement::Host;
                if on_host {
                    host.host.copy_from_slice(&whole.host);
                    host.run_host_step(s, (number, 0, 0)).expect("runs");
                    ran += 1;
                }
                whole
                    .run_steps(std::iter::once(step), &mut None)
                    .expect("runs");
                if on_host {
                    let same = (host.host.iter().zip(&whole.host))
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "step {s} ({}) differs", step.op.name());
                }
            }
        }
        assert!(ran > 0, "the plan has host steps");
        let device = (plan.steps.iter())
            .position(|s| plan.placement(s) == Placement::Device && plan.launches(s))
            .expect("a device step");
        assert!(host.run_host_step(device, (1, 0, 0)).is_err());
    }
}
