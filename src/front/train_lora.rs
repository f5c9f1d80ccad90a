//! The fine-tuning settings of a `train { }` section: `lora = lora(r = 16, alpha = 32,
//! targets = (q_proj, v_proj))`, as `--lora r=16,alpha=32,targets=q_proj+v_proj` says on
//! the command line, and `quantize_frozen = nf4` (or `int8`), as `--quantize-frozen`.

use super::ast::{Expr, ExprKind};
use crate::diagnostic::UserError;
use crate::ops::quant::Scheme;
use crate::passes::lora::LoraSpec;

const LORA_FORM: &str = "write e.g. `lora = lora(r = 16, alpha = 32, targets = (q_proj, v_proj))` (alpha defaults to r, targets to every linear layer of the blocks)";

/// `lora(r = R, alpha = A, targets = NAME | (NAME, ...))`: the adapters' rank (a positive
/// whole number), the scale numerator (positive; r when absent) and the weights they adapt
/// (names or dotted components, as `--lora targets=`; every linear layer of the blocks when
/// absent).
pub(super) fn lora(e: &Expr) -> Result<LoraSpec, UserError> {
    let call = match &e.kind {
        ExprKind::Call(call) if call.name.name == "lora" => call,
        _ => {
            return Err(UserError::at(
                e.span,
                "`lora` is set by `lora(...)`",
                "not lora(...)",
                LORA_FORM,
            ))
        }
    };
    let (mut rank, mut alpha, mut targets) = (None, None, Vec::new());
    let allowed = ["r", "alpha", "targets"];
    for (name, value) in super::train::kwargs(call, &allowed, ("lora", LORA_FORM))? {
        match name {
            "r" => rank = Some(positive(value, "r", true)? as usize),
            "alpha" => alpha = Some(positive(value, "alpha", false)? as f32),
            // `targets`, the one setting left in `allowed`.
            _ => targets = names(value)?,
        }
    }
    let Some(rank) = rank else {
        return Err(UserError::at(
            call.span,
            "`lora(...)` needs its rank `r`",
            "no r",
            LORA_FORM,
        ));
    };
    Ok(LoraSpec {
        rank,
        alpha: alpha.unwrap_or(rank as f32),
        targets,
    })
}

/// A positive number (a whole one when `whole`) for setting `what`.
fn positive(e: &Expr, what: &str, whole: bool) -> Result<f64, UserError> {
    match e.kind {
        ExprKind::Number { value, .. } if value > 0.0 && (!whole || value.fract() == 0.0) => {
            Ok(value)
        }
        _ => Err(UserError::at(
            e.span,
            format!(
                "`{what}` must be a positive {}",
                if whole { "whole number" } else { "number" }
            ),
            "not positive",
            LORA_FORM,
        )),
    }
}

/// The weight names of `targets = name` or `targets = (name, ...)`, dotted paths joined.
fn names(e: &Expr) -> Result<Vec<String>, UserError> {
    let items = match &e.kind {
        ExprKind::Tuple(items) => items.iter().collect(),
        _ => vec![e],
    };
    items
        .into_iter()
        .map(|item| match &item.kind {
            ExprKind::Path(path) => Ok(path
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(".")),
            _ => Err(UserError::at(
                item.span,
                "a lora target is a weight's name",
                "not a name",
                LORA_FORM,
            )),
        })
        .collect()
}

/// `nf4` or `int8`.
pub(super) fn scheme(e: &Expr) -> Result<Scheme, UserError> {
    let word = match &e.kind {
        ExprKind::Path(p) if p.len() == 1 => Scheme::parse(&p[0].name),
        _ => None,
    };
    word.ok_or_else(|| {
        UserError::at(
            e.span,
            "`quantize_frozen` is `nf4` or `int8`",
            "not a scheme",
            "write `quantize_frozen = nf4` (QLoRA's 4-bit NormalFloat) or `int8`",
        )
    })
}
