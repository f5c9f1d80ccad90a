//! A training run's resumable state as one safetensors file: every parameter under its name
//! and every optimizer-state buffer (moments, the fp16 loss scale) as `optimizer_state.K`, in
//! f32 (exact for bf16 and f16 buffers and for 8-bit AdamW's u8 codes), with the number of
//! the next step, the seed and a fingerprint of the plan's persistent buffers in its
//! metadata. Restoring it into a fresh executor of the same plan continues the run bitwise:
//! the step number keys AdamW's bias correction, the dropout masks and stochastic rounding,
//! the seed the synthetic inputs.

use super::io::write_safetensors;
use crate::codegen::build::fnv1a;
use crate::ir::DType;
use crate::plan::{BufferId, Plan};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;

/// A run's state read back for a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Resume {
    /// Every persistent buffer's values: parameters, then optimizer state.
    pub values: Vec<(BufferId, Vec<f32>)>,
    /// The 1-based number of the step the run continues with.
    pub next_step: u64,
    /// The seed the run was started with.
    pub seed: u64,
}

const STEP: &str = "memc.next_step";
const SEED: &str = "memc.seed";
const FINGERPRINT: &str = "memc.persistent_buffers";

/// The persistent buffers of `plan` (name, buffer): parameters by name, then optimizer
/// state in plan order. Quantized weights are left out: they are frozen, so they never
/// change from what the seed or `--params` gave them.
fn persistent(plan: &Plan) -> Vec<(String, BufferId)> {
    let params = (plan.params.iter())
        .filter(|p| p.quant.is_none())
        .map(|p| (p.name.clone(), p.buffer));
    let state = (plan.optim_state.iter().enumerate())
        .map(|(k, s)| (format!("optimizer_state.{k}"), s.buffer));
    params.chain(state).collect()
}

/// A hash of the names, types and order of `plan`'s persistent buffers: equal for plans
/// whose state can be exchanged.
fn fingerprint(plan: &Plan) -> String {
    let described: String = persistent(plan)
        .iter()
        .map(|(name, b)| format!("{name}:{};", plan.buffers[b.index()].ty))
        .collect();
    format!("{:016x}", fnv1a(&described))
}

/// Encodes the state of a run of `plan` whose next step is `next_step`, reading each
/// persistent buffer's values (as f32) through `read`.
pub fn encode(
    plan: &Plan,
    seed: u64,
    next_step: u64,
    read: impl Fn(BufferId) -> Result<Vec<f32>, String>,
) -> Result<Vec<u8>, String> {
    let tensors = persistent(plan)
        .into_iter()
        .map(|(name, b)| Ok((name, plan.buffers[b.index()].ty.shape.clone(), read(b)?)))
        .collect::<Result<Vec<_>, String>>()?;
    let metadata = HashMap::from([
        (STEP.to_string(), next_step.to_string()),
        (SEED.to_string(), seed.to_string()),
        (FINGERPRINT.to_string(), fingerprint(plan)),
    ]);
    write_safetensors(&tensors, Some(metadata))
}

/// Reads a state written by [`encode`] for `plan`. Fails, saying why, on a file that is not
/// one, or one written for a plan with other persistent buffers (another model, precision,
/// optimizer or master-weights setting).
pub fn decode(plan: &Plan, bytes: &[u8]) -> Result<Resume, String> {
    let (_, header) =
        SafeTensors::read_metadata(bytes).map_err(|e| format!("not a safetensors file: {e}"))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let field = |key: &str| -> Result<u64, String> {
        meta.get(key)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no `{key}` in its metadata: not a state saved by --save-state"))
    };
    let (next_step, seed) = (field(STEP)?, field(SEED)?);
    let theirs = meta.get(FINGERPRINT).map(String::as_str).unwrap_or("");
    if theirs != fingerprint(plan) {
        return Err(
            "it was saved from a plan with other parameters or optimizer state \
             (another model, precision, optimizer or --master-weights)"
                .into(),
        );
    }
    let st = SafeTensors::deserialize(bytes).map_err(|e| format!("not a safetensors file: {e}"))?;
    let values = persistent(plan)
        .into_iter()
        .map(|(name, b)| {
            let view = st
                .tensor(&name)
                .map_err(|_| format!("no tensor `{name}`"))?;
            if view.dtype() != Dtype::F32 || view.shape() != plan.buffers[b.index()].ty.shape {
                return Err(format!(
                    "`{name}` is not the plan's {}",
                    plan.buffers[b.index()].ty
                ));
            }
            Ok((b, super::lowp::from_bytes(DType::F32, view.data())))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Resume {
        values,
        next_step,
        seed,
    })
}
