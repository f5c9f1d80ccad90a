//! Offload as one more knob of the planner: where a budget is in force (on either target:
//! both backends run offloaded plans) and neither `--offload` nor `train { offload }`
//! says what lives in host memory, the step is planned with everything on the device and
//! with each of [`OFFLOAD_KNOBS`] in host memory, each with checkpointing fitted to the
//! budget, and the plan that fits with the least estimated step time on the `--gpu` (the
//! H100 without one) is taken. Checkpointing usually wins (recomputing costs less than the
//! link); offload wins where recomputation cannot reach the budget, or costs more time
//! than the copies.

use crate::settings::Offload;
use crate::{compile, CompileError, Compiled, Options};

/// The offload settings the planner weighs against keeping everything on the device.
pub const OFFLOAD_KNOBS: [Offload; 3] = [Offload::Activations, Offload::Optimizer, Offload::All];

/// Whether the `train { }` of `source` sets any of `keys` itself (true as well when the
/// source does not parse, so that nothing is tried beside the failing compile).
fn file_sets(source: &str, keys: &[&str]) -> bool {
    let Ok(ast) = crate::front::parse(source) else {
        return true;
    };
    ast.items.iter().any(|item| match item {
        crate::front::ast::Item::Train(settings, _) => settings
            .iter()
            .any(|(k, _)| keys.contains(&k.name.as_str())),
        _ => false,
    })
}

/// Whether the plan's budget shaped it: it has a budget and recomputes something (a plan
/// that recomputes nothing is the fastest there is: offload only adds time).
fn shaped_by_budget(c: &Compiled) -> bool {
    let plan = c.plan.plan();
    plan.train.as_ref().is_some_and(|t| t.budget.is_some()) && plan.report.recompute_percent() > 0.0
}

/// [`compile`] with offload weighed as one more knob (module docs): the plan with the least
/// estimated step time among those that fit, with the offload it takes (None: everything
/// on the device). Offload is tried only where the plain compile fails for the user's
/// reasons (no plan fits) or its budget made it recompute; when nothing compiles, the plain
/// compile's failure. Unified memory pages by itself and parallel plans do not offload yet,
/// so neither gets one this way.
pub fn compile_or_offload(
    source: &str,
    options: &Options,
) -> Result<(Compiled, Option<Offload>), CompileError> {
    let plain = compile(source, options);
    let weighed = options.offload.is_none()
        && options.unified != Some(true)
        && match &plain {
            Ok(c) => shaped_by_budget(c),
            Err(e) => matches!(e, CompileError::User(_)),
        }
        && options.parallel.is_none()
        && !file_sets(source, &["offload", "unified", "parallel"]);
    if !weighed {
        return plain.map(|c| (c, None));
    }
    let gpu = options.gpu.unwrap_or_default();
    let seconds = |c: &Compiled| crate::cost::estimate(c.plan.plan(), gpu).seconds;
    let mut best = plain.as_ref().ok().map(|c| (seconds(c), None));
    let mut chosen = None;
    for knob in OFFLOAD_KNOBS {
        let o = Options {
            offload: Some(knob),
            ..options.clone()
        };
        let Ok(c) = compile(source, &o) else {
            continue;
        };
        let t = seconds(&c);
        if best.is_none_or(|(b, _)| t < b) {
            best = Some((t, Some(knob)));
            chosen = Some(c);
        }
    }
    match (chosen, best) {
        (Some(c), Some((_, knob))) => Ok((c, knob)),
        _ => plain.map(|c| (c, None)),
    }
}
