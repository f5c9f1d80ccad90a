//! The verifier's check of views: each sits at its root's bytes (a member at its place in
//! them) within the root's lifetime, comes from a reshape (or a tensor-parallel entry) of
//! the same storage or a member of its elements, and no step writes shared bytes in place.

use super::{at, Checker};
use crate::plan::BufferId;

impl Checker<'_> {
    /// Every view sits at its root's bytes within the root's lifetime, comes from a reshape
    /// of the same storage or a member at its place, and no step writes the shared bytes in
    /// place.
    pub(super) fn views(&mut self) {
        let plan = self.plan;
        let root_of = |b: BufferId| {
            plan.buffers
                .get(b.index())
                .and_then(|x| x.view_of)
                .unwrap_or(b)
        };
        for v in plan.buffers.iter().filter(|b| b.view_of.is_some()) {
            let r = root_of(v.id);
            let Some(root) = self.buffer(r) else {
                self.error(format!(
                    "view {} `{}` names missing buffer {r}",
                    v.id, v.name
                ));
                continue;
            };
            let inside = root.first <= v.first && v.last <= root.last;
            let at = root.offset.checked_add(v.view_offset) == Some(v.offset);
            let within = (v.view_offset.checked_add(v.bytes)).is_some_and(|end| end <= root.bytes);
            if root.view_of.is_some() || !at || !within || !inside {
                self.error(format!(
                    "view {} `{}` does not sit at the bytes of its root {r} `{}` within its lifetime",
                    v.id, v.name, root.name
                ));
            }
        }
        let mut viewed = vec![false; plan.buffers.len()];
        for root in plan.buffers.iter().filter_map(|x| x.view_of) {
            if let Some(flag) = viewed.get_mut(root.index()) {
                *flag = true;
            }
        }
        let shared = |b: &BufferId| {
            plan.buffers
                .get(b.index())
                .is_some_and(|x| x.view_of.is_some())
                || viewed.get(b.index()).copied().unwrap_or(false)
        };
        for (s, step) in plan.steps.iter().enumerate() {
            if !plan.launches(step) {
                let same = match (step.inputs.first(), step.output) {
                    (Some(&i), Some(o)) => root_of(i) == root_of(o),
                    _ => false,
                };
                use crate::ir::Op;
                let same_bytes = match &step.op {
                    Op::Reshape { .. } | Op::TensorCopy { .. } => true,
                    Op::Member { offset, .. } => {
                        let buffer =
                            |b: Option<BufferId>| b.and_then(|b| plan.buffers.get(b.index()));
                        match (buffer(step.inputs.first().copied()), buffer(step.output)) {
                            (Some(input), Some(output)) => {
                                let bytes = (*offset as u64).checked_mul(input.ty.dtype.size());
                                bytes.and_then(|b| input.view_offset.checked_add(b))
                                    == Some(output.view_offset)
                            }
                            _ => false,
                        }
                    }
                    _ => false,
                };
                if !same_bytes || !same {
                    self.error(format!(
                        "{} outputs a view but is not a reshape or member of its root",
                        at(s, step)
                    ));
                }
            }
            for &i in step.op.mutated_inputs() {
                if step.inputs.get(i).is_some_and(shared) {
                    self.error(format!(
                        "{} writes in place a buffer that views share",
                        at(s, step)
                    ));
                }
            }
        }
    }
}
