//! The plan verifier: every step well-typed for its buffers, buffers live when read, read
//! only after they are written, written only when they start, never overlapping a live
//! neighbour or another operand of the same step, in-place writers in phase order, offsets
//! aligned for the plan's target and inside the arena. Backends take only a [`VerifiedPlan`],
//! so a plan loaded from JSON runs only if it computes what a built plan would.

use super::{Buffer, BufferId, Plan, Step};
use crate::ir::{Phase, TensorType};
use crate::passes::arena::LayoutViolation;
use std::fmt;

mod views;

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

    /// Every pipeline stage's plan, this one (stage 0's) first: [`verify`] checked each
    /// with it. Just this plan without a pipeline.
    pub fn stage_plans(&self) -> Vec<VerifiedPlan> {
        let rest = self.0.stages.iter().map(|s| {
            VerifiedPlan(Plan {
                stages: Vec::new(),
                ..s.clone()
            })
        });
        let first = Plan {
            stages: Vec::new(),
            ..self.0.clone()
        };
        std::iter::once(VerifiedPlan(first)).chain(rest).collect()
    }
}

/// Checks every invariant and returns all violations:
///
/// - each buffer sits at its own index, has the bytes of its type and a lifetime
///   `first..=last`;
/// - every binding (parameter, gradient, optimizer state, input, output) names a buffer;
///   buffers bound at load (parameters, optimizer state, inputs) are bound once and live from
///   step 0, persistent ones and outputs to the last step;
/// - every step names existing buffers, live at that step, and is well-typed for them
///   (`ir::infer::infer`); its output is written by it alone, at the output's first step,
///   and is never a buffer bound at load; its workspace lives for that step alone and is as
///   large as the target needs;
/// - every buffer a step reads is bound at load or written by an earlier step; with several
///   micro-batches, no forward or backward step reads what an update-phase step writes;
/// - a step's output, workspace and in-place inputs (`Op::mutated_inputs`) share no byte
///   with each other or with its other inputs;
/// - every in-place step runs after every other reader, in the same or an earlier phase, of
///   what it overwrites, and before every reader in a later phase (the schedule invariant),
///   except that a reader of it after its writers ([`crate::ir::Op::reads_after_writers`])
///   runs after them;
/// - offsets are multiples of the plan target's alignment ([`super::Target::alignment`]),
///   which the plan's `alignment` field must state, buffers end inside their tier's arena
///   (`arena_bytes`, or `host_bytes` for the host tier), and buffers of one tier live at
///   the same step never share bytes;
/// - every step's buffers lie in one tier, but copies between tiers, which read a device
///   buffer into a host one or a host buffer into a device one;
/// - a view ([`Buffer::view_of`]) sits at its root's offset plus its
///   [`Buffer::view_offset`], its bytes inside the root's, inside the root's lifetime, is
///   output by a reshape or member of its root (or of another view of it) that launches
///   nothing, and neither it nor its root is written in place;
/// - every later pipeline stage's plan ([`Plan::stages`]) passes all of the above.
pub fn verify(plan: Plan) -> Result<VerifiedPlan, Vec<PlanError>> {
    let mut check = Checker::new(&plan);
    check.buffers();
    check.bindings();
    for (s, step) in plan.steps.iter().enumerate() {
        check.step(s, step);
    }
    check.views();
    check.in_place_order();
    check.micro_batches();
    check.layout();
    for (s, stage) in plan.stages.iter().enumerate() {
        if let Err(errors) = verify(stage.clone()) {
            let named = errors
                .into_iter()
                .map(|e| PlanError(format!("stage {}: {e}", s + 1)));
            check.errors.extend(named);
        }
    }
    if check.errors.is_empty() {
        Ok(VerifiedPlan(plan))
    } else {
        Err(check.errors)
    }
}

/// The verifier's view of one plan and the violations found so far.
struct Checker<'p> {
    plan: &'p Plan,
    /// Whether each buffer is written at load (parameter, optimizer state or input).
    loaded: Vec<bool>,
    /// The first step whose output each buffer is.
    writer: Vec<Option<usize>>,
    errors: Vec<PlanError>,
}

/// How a step uses one of its buffers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Input(usize),
    Output,
    Workspace,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::Input(i) => write!(f, "input {i}"),
            Role::Output => f.write_str("output"),
            Role::Workspace => f.write_str("workspace"),
        }
    }
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Forward => "forward",
        Phase::Backward => "backward",
        Phase::Update => "update",
    }
}

/// `step 3 (matmul)`.
fn at(s: usize, step: &Step) -> String {
    format!("step {s} ({})", step.op.name())
}

/// The arena bytes `offset..offset+bytes` of a buffer, widened so no sum overflows.
fn bytes_of(b: &Buffer) -> (u128, u128) {
    let lo = u128::from(b.offset);
    (lo, lo + u128::from(b.bytes))
}

impl<'p> Checker<'p> {
    fn new(plan: &'p Plan) -> Checker<'p> {
        let mut writer = vec![None; plan.buffers.len()];
        for (s, step) in plan.steps.iter().enumerate() {
            if let Some(slot) = step.output.and_then(|o| writer.get_mut(o.index())) {
                slot.get_or_insert(s);
            }
        }
        Checker {
            plan,
            loaded: vec![false; plan.buffers.len()],
            writer,
            errors: Vec::new(),
        }
    }

    fn error(&mut self, message: String) {
        self.errors.push(PlanError(message));
    }

    /// `b3 `name``, or None when the plan has no such buffer.
    fn name(&self, b: BufferId) -> Option<String> {
        self.buffer(b).map(|x| format!("{b} `{}`", x.name))
    }

    fn buffer(&self, b: BufferId) -> Option<&'p Buffer> {
        self.plan.buffers.get(b.index())
    }

    /// The index of the last step (0 for a plan without steps).
    fn end(&self) -> usize {
        self.plan.steps.len().saturating_sub(1)
    }

    fn buffers(&mut self) {
        for (i, b) in self.plan.buffers.iter().enumerate() {
            if b.id.index() != i {
                self.error(format!("buffer {} is listed at position {i}", b.id));
            }
            if b.bytes != b.ty.bytes() {
                self.error(format!(
                    "buffer {} `{}` has {} bytes but its type {} needs {}",
                    b.id,
                    b.name,
                    b.bytes,
                    b.ty,
                    b.ty.bytes()
                ));
            }
            if b.first > b.last {
                self.error(format!(
                    "buffer {} `{}` ends before it starts",
                    b.id, b.name
                ));
            }
        }
    }

    /// Checks what the executors bind by name and records which buffers are written at load.
    fn bindings(&mut self) {
        let plan = self.plan;
        let end = self.end();
        let params = plan
            .params
            .iter()
            .map(|p| (format!("parameter `{}`", p.name), p.buffer, true));
        let state = plan
            .optim_state
            .iter()
            .map(|s| ("optimizer state".to_string(), s.buffer, true));
        let inputs = plan
            .inputs
            .iter()
            .map(|i| (format!("input `{}`", i.name), i.buffer, false));
        for (what, b, persistent) in params.chain(state).chain(inputs) {
            let Some(name) = self.name(b) else {
                self.error(format!("{what} names missing buffer {b}"));
                continue;
            };
            if std::mem::replace(&mut self.loaded[b.index()], true) {
                self.error(format!("{what}: {name} is bound at load more than once"));
            }
            let buf = &plan.buffers[b.index()];
            if buf.first != 0 {
                self.error(format!(
                    "{what}: {name} is written at load but starts at step {}",
                    buf.first
                ));
            }
            if persistent && buf.last < end {
                self.error(format!(
                    "{what}: {name} is persistent but ends at step {}, before the last step {end}",
                    buf.last
                ));
            }
        }
        for p in &plan.params {
            if let Some(g) = p.grad.filter(|g| self.buffer(*g).is_none()) {
                self.error(format!(
                    "the gradient of parameter `{}` names missing buffer {g}",
                    p.name
                ));
            }
        }
        for (what, b) in &plan.outputs {
            match self.buffer(*b) {
                None => self.error(format!("output `{what}` names missing buffer {b}")),
                Some(buf) if buf.last < end => self.error(format!(
                    "output `{what}`: {b} `{}` ends at step {}, before the last step {end}",
                    buf.name, buf.last
                )),
                Some(_) => {}
            }
        }
    }

    /// Every check of one step.
    fn step(&mut self, s: usize, step: &Step) {
        let roles = step
            .inputs
            .iter()
            .enumerate()
            .map(|(i, &b)| (Role::Input(i), b))
            .chain(step.output.map(|b| (Role::Output, b)))
            .chain(step.workspace.map(|b| (Role::Workspace, b)));
        let mut all_present = true;
        for (role, b) in roles {
            match self.buffer(b) {
                None => {
                    all_present = false;
                    self.error(format!(
                        "{} names missing buffer {b} as its {role}",
                        at(s, step)
                    ));
                }
                Some(buf) if buf.first > s || buf.last < s => self.error(format!(
                    "{} uses {b} `{}` outside its lifetime {}..={}",
                    at(s, step),
                    buf.name,
                    buf.first,
                    buf.last
                )),
                Some(_) => {}
            }
        }
        if !all_present {
            return;
        }
        self.types(s, step);
        self.writes(s, step);
        self.reads(s, step);
        self.aliasing(s, step);
    }

    /// The step is well-typed for its buffers, and its workspace is as large as the target
    /// needs.
    fn types(&mut self, s: usize, step: &Step) {
        let plan = self.plan;
        let types: Vec<&TensorType> = step
            .inputs
            .iter()
            .map(|b| &plan.buffers[b.index()].ty)
            .collect();
        let want = step.output.map(|o| &plan.buffers[o.index()].ty);
        let ty = match crate::ir::infer::infer(&step.op, &types) {
            Ok(ty) => ty,
            Err(e) => {
                return self.error(format!("{} is ill-typed: {}", at(s, step), e.message));
            }
        };
        let fits = match want {
            Some(w) => *w == ty,
            None => ty.bytes() == 0,
        };
        if !fits {
            self.error(format!(
                "{} produces {ty}, but its output buffer is {:?}",
                at(s, step),
                want.map(ToString::to_string)
            ));
        }
        let need = plan.target.workspace_bytes(&step.op, &types, &ty);
        let have = step.workspace.map_or(0, |w| plan.buffers[w.index()].bytes);
        if have < need {
            self.error(format!(
                "{} needs {need} bytes of workspace on {}, but has {have}",
                at(s, step),
                plan.target
            ));
        }
    }

    /// The output is written by this step alone, at its first step, and is not bound at
    /// load; the workspace is this step's alone.
    fn writes(&mut self, s: usize, step: &Step) {
        for (role, b) in [
            (Role::Output, step.output),
            (Role::Workspace, step.workspace),
        ] {
            let Some(b) = b else { continue };
            let buf = &self.plan.buffers[b.index()];
            if self.loaded[b.index()] {
                self.error(format!(
                    "{} writes {b} `{}`, which is bound at load, as its {role}",
                    at(s, step),
                    buf.name
                ));
            }
            if buf.first != s {
                self.error(format!(
                    "{} writes {b} `{}` as its {role}, but that buffer starts at step {}",
                    at(s, step),
                    buf.name,
                    buf.first
                ));
            }
            if role == Role::Workspace && buf.last != s {
                self.error(format!(
                    "{} uses {b} `{}` as scratch, but that buffer lives until step {}",
                    at(s, step),
                    buf.name,
                    buf.last
                ));
            }
        }
    }

    /// Every input is bound at load or written by an earlier step.
    fn reads(&mut self, s: usize, step: &Step) {
        for &b in &step.inputs {
            let written = self.loaded[b.index()] || self.writer[b.index()].is_some_and(|w| w < s);
            if !written {
                let name = self.name(b).unwrap_or_default();
                self.error(format!(
                    "{} reads {name} before any step writes it",
                    at(s, step)
                ));
            }
        }
    }

    /// What the step writes (output, workspace, in-place inputs) shares no byte with any
    /// other operand of the step; a step that launches nothing (a view) writes nothing.
    fn aliasing(&mut self, s: usize, step: &Step) {
        if !self.plan.launches(step) {
            return;
        }
        let mutated = step.op.mutated_inputs();
        let operands: Vec<(Role, BufferId, bool)> = step
            .inputs
            .iter()
            .enumerate()
            .map(|(i, &b)| (Role::Input(i), b, mutated.contains(&i)))
            .chain(step.output.map(|b| (Role::Output, b, true)))
            .chain(step.workspace.map(|b| (Role::Workspace, b, true)))
            .collect();
        for (k, &(ra, a, wa)) in operands.iter().enumerate() {
            for &(rb, b, wb) in &operands[k + 1..] {
                let (alo, ahi) = bytes_of(&self.plan.buffers[a.index()]);
                let (blo, bhi) = bytes_of(&self.plan.buffers[b.index()]);
                let same_tier =
                    self.plan.buffers[a.index()].tier == self.plan.buffers[b.index()].tier;
                let overlap = same_tier && alo < ahi && blo < bhi && alo < bhi && blo < ahi;
                if !(wa || wb) || !overlap {
                    continue;
                }
                let (na, nb) = (
                    self.name(a).unwrap_or_default(),
                    self.name(b).unwrap_or_default(),
                );
                let message = match (ra, rb) {
                    (Role::Input(i), Role::Output) if a == b => {
                        format!("{} reads its own output {na} as input {i}", at(s, step))
                    }
                    _ if a == b => format!("{} uses {na} as its {ra} and its {rb}", at(s, step)),
                    _ => format!(
                        "{}: its {ra} {na} and its {rb} {nb} share arena bytes",
                        at(s, step)
                    ),
                };
                self.error(message);
            }
        }
    }

    /// Every in-place step runs after every other reader, in the same or an earlier phase,
    /// of what it overwrites, and before every reader in a later phase.
    fn in_place_order(&mut self) {
        let steps = &self.plan.steps;
        let mut readers: Vec<Vec<usize>> = vec![Vec::new(); self.plan.buffers.len()];
        for (s, step) in steps.iter().enumerate() {
            for b in &step.inputs {
                if let Some(r) = readers.get_mut(b.index()) {
                    if r.last() != Some(&s) {
                        r.push(s);
                    }
                }
            }
        }
        for (w, writer) in steps.iter().enumerate() {
            let mut written: Vec<BufferId> = writer
                .op
                .mutated_inputs()
                .iter()
                .filter_map(|&i| writer.inputs.get(i).copied())
                .filter(|b| b.index() < readers.len())
                .collect();
            written.sort();
            written.dedup();
            for b in written {
                let name = self.name(b).unwrap_or_default();
                for &r in readers[b.index()].iter().filter(|&&r| r != w) {
                    let reader = &steps[r];
                    let after = reader.phase == writer.phase
                        && (reader.op.reads_after_writers().iter())
                            .any(|&i| reader.inputs.get(i) == Some(&b));
                    let earlier = reader.phase <= writer.phase && !after;
                    if earlier && r > w {
                        self.error(format!(
                            "{} overwrites {name} in place before {}, which reads it in the {} phase",
                            at(w, writer),
                            at(r, reader),
                            phase_name(reader.phase)
                        ));
                    } else if !earlier && r < w {
                        self.error(format!(
                            "{} reads {name} in the {} phase before {} overwrites it in place in the {} phase",
                            at(r, reader),
                            phase_name(reader.phase),
                            at(w, writer),
                            phase_name(writer.phase)
                        ));
                    }
                }
            }
        }
    }

    /// With several micro-batches the update-phase steps run only after the last one, so no
    /// forward or backward step may read what an update-phase step outputs.
    fn micro_batches(&mut self) {
        if self.plan.micro_steps() <= 1 {
            return;
        }
        let steps = &self.plan.steps;
        for (s, step) in steps.iter().enumerate() {
            if step.phase == Phase::Update {
                continue;
            }
            for &b in &step.inputs {
                let Some(w) = self.writer.get(b.index()).copied().flatten() else {
                    continue;
                };
                if steps[w].phase == Phase::Update {
                    let name = self.name(b).unwrap_or_default();
                    self.error(format!(
                        "{} reads {name}, which update-phase {} writes only after the last micro-batch",
                        at(s, step),
                        at(w, &steps[w])
                    ));
                }
            }
        }
    }

    /// Offsets aligned for the plan's target, inside the arena, never shared by buffers live
    /// at the same step.
    fn layout(&mut self) {
        let plan = self.plan;
        let alignment = plan.target.alignment();
        if plan.alignment != alignment {
            self.error(format!(
                "the plan states alignment {} but its target {} aligns buffers to {alignment} bytes",
                plan.alignment, plan.target
            ));
        }
        for v in super::tier::violations(plan, alignment) {
            let message = self.layout_message(&v, alignment);
            self.error(message);
        }
        for message in super::tier::misplaced(plan) {
            self.error(message);
        }
    }

    /// A layout violation naming its buffers.
    fn layout_message(&self, v: &LayoutViolation, alignment: u64) -> String {
        let name = |i: usize| {
            self.plan.buffers.get(i).map_or_else(
                || format!("buffer {i}"),
                |b| format!("{} `{}`", b.id, b.name),
            )
        };
        match *v {
            LayoutViolation::Misaligned { buffer, offset } => format!(
                "layout: {} at offset {offset} is not a multiple of the alignment {alignment} of target {}",
                name(buffer),
                self.plan.target
            ),
            LayoutViolation::Overlap { a, b } => format!(
                "layout: {} and {} are live at the same step and share arena bytes",
                name(a),
                name(b)
            ),
            LayoutViolation::OutOfArena { buffer, end, arena } => format!(
                "layout: {} ends at byte {end}, past the arena size {arena}",
                name(buffer)
            ),
            LayoutViolation::WrongCount { .. } => format!("layout: {v}"),
        }
    }
}
