//! `memc run` of a data-parallel plan: every rank on the CPU in one process
//! ([`memc::exec::ranks::Ranks`]), printing the step's loss as one rank with the whole batch
//! would.

use super::{plain, show_loss, RunArgs};
use crate::cli::Failure;
use indicatif::ProgressBar;
use memc::exec::ranks::Ranks;
use memc::plan::VerifiedPlan;

/// Runs `args.steps` steps of `plan` on all its ranks from seeded parameters and synthetic
/// inputs; the options that read or write one rank's buffers are refused.
pub(super) fn run(
    args: &RunArgs,
    plan: &VerifiedPlan,
    bar: Option<&ProgressBar>,
) -> Result<(), Failure> {
    let refused = [
        (args.params.is_some(), "--params"),
        (!args.inputs.is_empty(), "--input"),
        (args.save_params.is_some(), "--save-params"),
        (args.save_state.is_some(), "--save-state"),
        (args.load_state.is_some(), "--load-state"),
        (args.dump.is_some(), "--dump"),
        (args.profile, "--profile"),
    ];
    if let Some((_, flag)) = refused.iter().find(|(asked, _)| *asked) {
        return Err(Failure::Plain(format!(
            "{flag} reads or writes one device's buffers, and this plan runs on several \
             ranks: drop {flag}, or run without --parallel"
        )));
    }
    let mut ranks = Ranks::new(plan).map_err(plain)?;
    ranks.start(args.seed).map_err(plain)?;
    for step in 1..=args.steps {
        let loss = ranks
            .run_step()
            .map_err(|e| Failure::Plain(format!("step {step}: {e}")))?;
        if let Some(loss) = loss {
            show_loss(bar, step, loss)?;
        }
    }
    Ok(())
}
