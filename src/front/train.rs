//! The `train { ... }` section: optimizer, precision, budget and clipping settings.

use super::ast::{Expr, ExprKind, Ident};
use crate::diagnostic::UserError;
use crate::ir::{AdamWParams, SgdParams, Span};
use crate::ops::optimizer::{Rounding, StateFormat};
use crate::settings::{Offload, TrainSummary};
pub use crate::settings::{Optimizer, Precision};
use serde::{Deserialize, Serialize};

/// Everything `train { }` says, with defaults filled in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSpec {
    /// The settings themselves, as the plan records them.
    #[serde(flatten)]
    pub settings: TrainSummary,
    /// Where the section is, for budget diagnostics.
    pub span: Span,
    /// Where `precision` was set (the section when it was not).
    pub precision_span: Span,
    /// Where `stochastic_rounding = true` was set, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stochastic_rounding_span: Option<Span>,
    /// Where `clip_grad_norm` was set, if it was (the clip coefficient's source line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_grad_norm_span: Option<Span>,
    /// Where `budget` was set, if the budget in `settings` is the file's (None when it is
    /// unset or came from the command line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_span: Option<Span>,
    /// Where `unified = true` was set, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unified_span: Option<Span>,
}

/// `true` or `false` written as `value` of the boolean setting `name`, with the value's
/// span when true (where diagnostics about the setting point); anything else is a
/// diagnostic at the value with `help`.
fn boolean(value: &Expr, name: &str, help: &str) -> Result<(bool, Option<Span>), UserError> {
    match word(value) {
        Some("true") => Ok((true, Some(value.span))),
        Some("false") => Ok((false, None)),
        _ => Err(UserError::at(
            value.span,
            format!("`{name}` is `true` or `false`"),
            "not true/false",
            help,
        )),
    }
}

/// Refuses unified memory (`unified = true`, `--unified`) where it makes no sense: with
/// offloading (both put bytes in host memory, one by the driver's paging and one by planned
/// copies), with parallelism (not planned per rank yet), and on the CPU backend (`cuda`
/// false), which has no device memory to page into.
pub fn check_unified(t: &TrainSpec, cuda: bool) -> Result<(), UserError> {
    if !t.settings.unified {
        return Ok(());
    }
    let refusal = if t.settings.offload.is_some_and(Offload::any) {
        Some((
            "unified memory does not combine with offloading",
            "unified memory pages the arena to host memory by itself; drop `offload` or \
             --offload (planned copies), or `unified` or --unified (the driver's paging)",
        ))
    } else if t.settings.parallel.is_some() {
        Some((
            "unified memory does not combine with parallelism yet",
            "drop `parallel` or --parallel, or drop `unified` or --unified and fit each rank's \
             plan to the budget",
        ))
    } else if !cuda {
        Some((
            "unified memory is CUDA managed memory, and this plan is for the CPU backend",
            "compile with --device cuda: the report then says what of the arena is resident in \
             the --budget (or the --gpu's memory) and where page faults fall",
        ))
    } else {
        None
    };
    match refusal {
        Some((message, help)) => Err(match t.unified_span {
            Some(span) => UserError::at(span, message, "unified memory asked for here", help),
            None => UserError::at(
                t.span,
                message,
                "--unified applies to this train section",
                help,
            ),
        }),
        None => Ok(()),
    }
}

/// `name` of a path expression of one identifier, if `e` is one.
pub(super) fn word(e: &Expr) -> Option<&str> {
    match &e.kind {
        ExprKind::Path(p) if p.len() == 1 => Some(p[0].name.as_str()),
        _ => None,
    }
}

pub(super) fn number(e: &Expr) -> Option<f64> {
    match &e.kind {
        ExprKind::Number { value, .. } => Some(*value),
        ExprKind::Neg(inner) => number(inner).map(|v| -v),
        _ => None,
    }
}

fn expect_number(e: &Expr, what: &str) -> Result<f32, UserError> {
    number(e).map(|v| v as f32).ok_or_else(|| {
        UserError::at(
            e.span,
            format!("`{what}` must be a number"),
            "not a number",
            format!("write e.g. `{what} = 0.1`"),
        )
    })
}

/// The keyword arguments of a settings call (`adamw(...)`, `lora(...)`): each named, each
/// among `allowed`; `what` names the settings and `example` shows the form in the errors.
pub(super) fn kwargs<'a>(
    call: &'a super::ast::Call,
    allowed: &[&str],
    (what, example): (&str, &str),
) -> Result<Vec<(&'a str, &'a Expr)>, UserError> {
    let mut out = Vec::new();
    for arg in &call.args {
        let Some(name) = &arg.name else {
            return Err(UserError::at(
                arg.value.span,
                format!("{what} settings are keyword arguments"),
                "unnamed",
                example,
            ));
        };
        if !allowed.contains(&name.name.as_str()) {
            return Err(UserError::at(
                name.span,
                format!("unknown option `{}` for `{}`", name.name, call.name.name),
                "unknown",
                format!("accepted: {}", allowed.join(", ")),
            ));
        }
        out.push((name.name.as_str(), &arg.value));
    }
    Ok(out)
}

fn optimizer(e: &Expr) -> Result<Optimizer, UserError> {
    let ExprKind::Call(call) = &e.kind else {
        return Err(UserError::at(
            e.span,
            "`optimizer` must be `adamw(...)` or `sgd(...)`",
            "not an optimizer",
            "write e.g. `optimizer = adamw(lr = 3e-4)`",
        ));
    };
    match call.name.name.as_str() {
        "adamw" => {
            let mut p = AdamWParams::default();
            let allowed = ["lr", "betas", "eps", "weight_decay", "state"];
            for (k, v) in kwargs(call, &allowed, ("optimizer", "use `adamw(lr = 3e-4)`"))? {
                match k {
                    "lr" => p.lr = expect_number(v, k)?,
                    "eps" => p.eps = expect_number(v, k)?,
                    "weight_decay" => p.weight_decay = expect_number(v, k)?,
                    "state" => {
                        p.state = word(v).and_then(StateFormat::parse).ok_or_else(|| {
                            UserError::at(
                            v.span,
                            "unknown optimizer state format",
                            "not a state format",
                            "use `state = fp32` (two f32 moments, the default) or `state = int8` \
                                 (block-wise 8-bit moments: 2 bytes a parameter)",
                        )
                        })?
                    }
                    _ => match &v.kind {
                        ExprKind::Tuple(items) if items.len() == 2 => {
                            p.beta1 = expect_number(&items[0], "betas")?;
                            p.beta2 = expect_number(&items[1], "betas")?;
                        }
                        _ => {
                            return Err(UserError::at(
                                v.span,
                                "`betas` must be a pair",
                                "not a pair",
                                "write `betas = (0.9, 0.999)`",
                            ))
                        }
                    },
                }
            }
            Ok(Optimizer::AdamW(p))
        }
        "sgd" => {
            let mut p = SgdParams {
                lr: 1e-2,
                momentum: 0.0,
                weight_decay: 0.0,
                rounding: Rounding::Nearest,
            };
            let allowed = ["lr", "momentum", "weight_decay"];
            for (k, v) in kwargs(call, &allowed, ("optimizer", "use `sgd(lr = 3e-4)`"))? {
                let x = expect_number(v, k)?;
                match k {
                    "lr" => p.lr = x,
                    "momentum" => p.momentum = x,
                    _ => p.weight_decay = x,
                }
            }
            Ok(Optimizer::Sgd(p))
        }
        other => Err(UserError::at(
            call.name.span,
            format!("unknown optimizer `{other}`"),
            "unknown",
            "use `adamw(...)` or `sgd(...)`",
        )),
    }
}

/// Reads the settings of a `train` section.
pub fn train_spec(settings: &[(Ident, Expr)], span: Span) -> Result<TrainSpec, UserError> {
    let mut spec = TrainSpec {
        settings: TrainSummary {
            optimizer: Optimizer::AdamW(AdamWParams::default()),
            precision: Precision::Fp32,
            master_weights: true,
            accumulate: 1,
            budget: None,
            clip_grad_norm: None,
            stochastic_rounding: false,
            lora: None,
            quantize_frozen: None,
            offload: None,
            unified: false,
            parallel: None,
        },
        span,
        precision_span: span,
        stochastic_rounding_span: None,
        clip_grad_norm_span: None,
        budget_span: None,
        unified_span: None,
    };
    for (name, value) in settings {
        match name.name.as_str() {
            "optimizer" => spec.settings.optimizer = optimizer(value)?,
            "precision" => {
                spec.precision_span = value.span;
                spec.settings.precision = match &value.kind {
                    ExprKind::Path(p) if p.len() == 1 && p[0].name == "fp32" => Precision::Fp32,
                    ExprKind::Path(p) if p.len() == 1 && p[0].name == "bf16" => Precision::Bf16,
                    ExprKind::Path(p) if p.len() == 1 && p[0].name == "fp16" => Precision::Fp16,
                    _ => {
                        return Err(UserError::at(
                            value.span,
                            "unknown precision",
                            "not a precision",
                            "use fp32, bf16 or fp16",
                        ))
                    }
                }
            }
            "master_weights" => {
                spec.settings.master_weights = match &value.kind {
                    ExprKind::Path(p) if p.len() == 1 && p[0].name == "on" => true,
                    ExprKind::Path(p) if p.len() == 1 && p[0].name == "off" => false,
                    _ => {
                        return Err(UserError::at(
                            value.span,
                            "`master_weights` is `on` or `off`",
                            "not on/off",
                            "write `master_weights = off` to store bf16 parameters",
                        ))
                    }
                }
            }
            "stochastic_rounding" => {
                let help =
                    "write `stochastic_rounding = true` to round pure-bf16 updates stochastically";
                (spec.settings.stochastic_rounding, spec.stochastic_rounding_span) =
                    boolean(value, "stochastic_rounding", help)?;
            }
            "unified" => {
                let help = "write `unified = true` to plan the arena in CUDA unified memory";
                (spec.settings.unified, spec.unified_span) = boolean(value, "unified", help)?;
            }
            "accumulate" => {
                let n = number(value).unwrap_or(0.0);
                if !(n >= 1.0 && n.fract() == 0.0 && n <= f64::from(u32::MAX)) {
                    return Err(UserError::at(
                        value.span,
                        "`accumulate` must be a positive whole number of micro-batches",
                        "not a count",
                        "write e.g. `accumulate = 4`: four micro-batches per update",
                    ));
                }
                spec.settings.accumulate = n as u32;
            }
            "budget" => match &value.kind {
                ExprKind::Size(b) if *b > 0 => {
                    spec.settings.budget = Some(*b);
                    spec.budget_span = Some(value.span);
                }
                _ => {
                    return Err(UserError::at(
                        value.span,
                        "`budget` must be a positive size",
                        "not a size",
                        "write e.g. `budget = 16GiB` or `512MiB`",
                    ))
                }
            },
            "clip_grad_norm" => {
                let v = expect_number(value, "clip_grad_norm")?;
                if v <= 0.0 {
                    return Err(UserError::at(
                        value.span,
                        "`clip_grad_norm` must be positive",
                        "not positive",
                        "write e.g. `clip_grad_norm = 1.0`",
                    ));
                }
                spec.settings.clip_grad_norm = Some(v);
                spec.clip_grad_norm_span = Some(value.span);
            }
            "lora" => spec.settings.lora = Some(super::train_lora::lora(value)?),
            "quantize_frozen" => {
                spec.settings.quantize_frozen = Some(super::train_lora::scheme(value)?)
            }
            "offload" => {
                spec.settings.offload = Some(word(value).and_then(Offload::parse).ok_or_else(
                    || UserError::at(value.span, "unknown offload", "not offloadable", Offload::HELP),
                )?)
            }
            "parallel" => spec.settings.parallel = Some(super::parallel::parallel(value)?),
            other => {
                return Err(UserError::at(
                    name.span,
                    format!("unknown train option `{other}`"),
                    "unknown option",
                    "accepted: optimizer, precision, master_weights, stochastic_rounding, accumulate, budget, clip_grad_norm, lora, quantize_frozen, offload, unified, parallel",
                ))
            }
        }
    }
    Ok(spec)
}
