//! The plan verifier: every step well-typed for its buffers, buffers live when read,
//! written when they start, never overlapping a live neighbour, aligned and inside the arena.
//! Backends take only a [`VerifiedPlan`].

use super::Plan;
use crate::passes::arena::{validate, BufferRequest};
use std::fmt;

/// One broken plan invariant, naming the step or buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanError(pub String);

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A plan that passed [`verify`]; the only form backends accept.
#[derive(Debug, Clone)]
pub struct VerifiedPlan(Plan);

impl VerifiedPlan {
    /// The verified plan.
    pub fn plan(&self) -> &Plan {
        &self.0
    }
}

/// Checks every invariant and returns all violations.
pub fn verify(plan: Plan) -> Result<VerifiedPlan, Vec<PlanError>> {
    let mut errors = Vec::new();
    let n = plan.buffers.len();
    for (i, b) in plan.buffers.iter().enumerate() {
        if b.id.index() != i {
            errors.push(PlanError(format!(
                "buffer {} is listed at position {i}",
                b.id
            )));
        }
        if b.bytes != b.ty.bytes() {
            errors.push(PlanError(format!(
                "buffer {} `{}` has {} bytes but its type {} needs {}",
                b.id,
                b.name,
                b.bytes,
                b.ty,
                b.ty.bytes()
            )));
        }
        if b.first > b.last {
            errors.push(PlanError(format!(
                "buffer {} `{}` ends before it starts",
                b.id, b.name
            )));
        }
    }
    for (s, step) in plan.steps.iter().enumerate() {
        let ids = step
            .inputs
            .iter()
            .chain(step.output.iter())
            .chain(step.workspace.iter());
        for &b in ids {
            match plan.buffers.get(b.index()) {
                None => errors.push(PlanError(format!("step {s} names missing buffer {b}"))),
                Some(buf) if buf.first > s || buf.last < s => {
                    errors.push(PlanError(format!(
                        "step {s} ({}) uses {} `{}` outside its lifetime {}..={}",
                        step.op.name(),
                        b,
                        buf.name,
                        buf.first,
                        buf.last
                    )));
                }
                Some(_) => {}
            }
        }
        let types: Option<Vec<&crate::ir::TensorType>> = step
            .inputs
            .iter()
            .map(|b| plan.buffers.get(b.index()).map(|x| &x.ty))
            .collect();
        if let Some(types) = types {
            let want = step
                .output
                .and_then(|o| plan.buffers.get(o.index()))
                .map(|b| &b.ty);
            match crate::ir::infer::infer(&step.op, &types) {
                Ok(ty) if want.is_none_or(|w| *w == ty) && (want.is_some() || ty.bytes() == 0) => {}
                Ok(ty) => errors.push(PlanError(format!(
                    "step {s} ({}) produces {ty}, but its output buffer is {:?}",
                    step.op.name(),
                    want.map(|w| w.to_string())
                ))),
                Err(e) => errors.push(PlanError(format!(
                    "step {s} ({}) is ill-typed: {}",
                    step.op.name(),
                    e.message
                ))),
            }
        }
        if let Some(buf) = step.output.and_then(|o| plan.buffers.get(o.index())) {
            if buf.first != s && !buf.class.is_persistent() {
                errors.push(PlanError(format!(
                    "step {s} writes {} `{}` which starts at step {}",
                    buf.id, buf.name, buf.first
                )));
            }
        }
    }
    let requests: Vec<BufferRequest> = plan.buffers.iter().map(super::Buffer::request).collect();
    let offsets: Vec<u64> = plan.buffers.iter().map(|b| b.offset).collect();
    if let Err(violations) = validate(&requests, &offsets, plan.arena_bytes, plan.alignment.max(1))
    {
        errors.extend(
            violations
                .into_iter()
                .map(|v| PlanError(format!("layout: {v}"))),
        );
    }
    if errors.is_empty() && n == plan.buffers.len() {
        Ok(VerifiedPlan(plan))
    } else {
        Err(errors)
    }
}
