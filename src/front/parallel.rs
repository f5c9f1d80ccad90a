//! `train { parallel = (...) }` in a model: reading the setting, refusing what data
//! parallelism cannot plan yet, and the batch dim each rank runs `1/N` of.

use super::ast::{Expr, ExprKind, Item, Model};
use super::train::TrainSpec;
use crate::diagnostic::UserError;
use crate::ir::{Graph, Op};
use crate::parallel::{Pair, Parallel, Setting};
use crate::settings::Precision;

/// `parallel = (data = N, zero = K, ...)`: the record's pairs read by
/// [`Parallel::from_pairs`]; anything but a record of named settings is refused.
pub(super) fn parallel(e: &Expr) -> Result<Parallel, UserError> {
    let ExprKind::Record(fields) = &e.kind else {
        return Err(UserError::at(
            e.span,
            "`parallel` takes named settings",
            "not `(key = value, ...)`",
            "write e.g. `parallel = (data = 8, zero = 1)`",
        ));
    };
    let pairs = fields.iter().filter_map(|f| {
        let name = f.name.as_ref()?;
        Some(Pair {
            key: name.name.as_str(),
            key_span: name.span,
            value: match super::train::number(&f.value) {
                Some(n) => Setting::Number(n),
                None => super::train::word(&f.value).map_or(Setting::Other, Setting::Word),
            },
            value_span: f.value.span,
        })
    });
    Parallel::from_pairs(pairs).map_err(|err| match err.span {
        Some(_) => err,
        None => UserError::at(e.span, err.message, "here", err.help),
    })
}

/// Refuses the settings of `t` that data parallelism with `p` does not plan: gradient
/// accumulation and offloading with any stage, and under ZeRO-2 and 3 (each rank holds only
/// its shard of every gradient) global-norm clipping and fp16 loss scaling, whose global
/// norm and overflow check would need every gradient on every rank.
pub fn check(t: &TrainSpec, p: Parallel) -> Result<(), UserError> {
    let refuse = |what: &str, help: &str| {
        Err(UserError::at(
            t.span,
            format!(
                "data parallelism (data = {}, zero = {}) {what}",
                p.data, p.zero
            ),
            "this train section",
            help,
        ))
    };
    if t.settings.accumulate > 1 {
        return refuse(
            "does not combine with gradient accumulation yet",
            "drop `accumulate` (each rank's batch is already 1/N of the step's), or drop `parallel`",
        );
    }
    if t.settings
        .offload
        .is_some_and(crate::settings::Offload::any)
    {
        return refuse(
            "does not combine with offloading yet",
            "shard the optimizer state with `zero = 1` instead of offloading it",
        );
    }
    if p.zero >= 2 && t.settings.clip_grad_norm.is_some() {
        return refuse(
            "shards the gradients, and global-norm clipping needs all of them on every rank",
            "use `zero = 1` (the optimizer state sharded, gradients whole) or drop `clip_grad_norm`",
        );
    }
    if p.zero >= 2 && t.settings.precision == Precision::Fp16 {
        return refuse(
            "shards the gradients, and fp16's overflow check needs all of them on every rank",
            "use `precision = bf16` (no loss scaling) or `zero = 1`",
        );
    }
    check_tensor(t, p)?;
    check_pipeline(t, p)
}

/// Refuses the settings of `t` that a pipeline over `p.pipeline` stages does not plan:
/// global-norm clipping and fp16 loss scaling, whose global norm and overflow check would
/// see only the stage's gradients.
fn check_pipeline(t: &TrainSpec, p: Parallel) -> Result<(), UserError> {
    if p.pipeline == 1 {
        return Ok(());
    }
    let gradients = "keeps each stage's gradients on its stage, and";
    first_refusal(
        t,
        format!("pipeline parallelism (pipeline = {})", p.pipeline),
        &[
            (
                t.settings.clip_grad_norm.is_some(),
                &format!("{gradients} global-norm clipping needs all of them"),
                "drop `clip_grad_norm`, or plan data parallelism without a pipeline",
            ),
            (
                t.settings.precision == Precision::Fp16,
                &format!("{gradients} fp16's overflow check needs all of them"),
                "use `precision = bf16` (no loss scaling)",
            ),
        ],
    )
}

/// Refuses the settings of `t` that tensor parallelism over `p.tensor` ranks does not plan:
/// LoRA (its adapters would be split with their weights), and global-norm clipping and fp16
/// loss scaling, whose global norm and overflow check would see only the rank's slice of
/// each split gradient.
fn check_tensor(t: &TrainSpec, p: Parallel) -> Result<(), UserError> {
    if p.tensor == 1 {
        return Ok(());
    }
    first_refusal(
        t,
        format!("tensor parallelism (tensor = {})", p.tensor),
        &[
            (
                t.settings.lora.is_some(),
                "does not combine with LoRA yet",
                "drop `tensor` (LoRA's adapters are small enough to replicate) or drop `lora`",
            ),
            (
                t.settings.clip_grad_norm.is_some(),
                "splits gradients, and global-norm clipping needs all of them on every rank",
                "drop `clip_grad_norm`, or plan data parallelism at `zero = 0` or 1",
            ),
            (
                t.settings.precision == Precision::Fp16,
                "splits gradients, and fp16's overflow check needs all of them on every rank",
                "use `precision = bf16` (no loss scaling)",
            ),
        ],
    )
}

/// The first of `refusals` (`(refused, what, help)`) that holds, as a diagnostic at the
/// train section of `t` saying that `layout` does `what`; Ok when none holds.
fn first_refusal(
    t: &TrainSpec,
    layout: String,
    refusals: &[(bool, &str, &str)],
) -> Result<(), UserError> {
    match refusals.iter().find(|r| r.0) {
        Some(&(_, what, help)) => Err(UserError::at(
            t.span,
            format!("{layout} {what}"),
            "this train section",
            help,
        )),
        None => Ok(()),
    }
}

/// The dim overrides under which `model` runs one micro-batch of one rank's share of the
/// batch: `overrides` with the batch dim (the dim every input's first axis names) divided
/// by `data` times `micro`. Refused when an input's first axis is not a plain dim name,
/// when the inputs disagree, or when `data` times `micro` does not divide the batch;
/// `graph` (lowered with `overrides`) gives its value.
pub fn rank_overrides(
    model: &Model,
    graph: &Graph,
    overrides: &[(String, i64)],
    (data, micro): (u32, u32),
) -> Result<Vec<(String, i64)>, UserError> {
    let parts = data.saturating_mul(micro);
    let mut batch: Option<(String, usize)> = None;
    for item in &model.items {
        let Item::Input(name, ty) = item else {
            continue;
        };
        let first = ty.dims.first();
        let dim = first.and_then(|d| match &d.kind {
            ExprKind::Path(p) if p.len() == 1 => Some(p[0].name.clone()),
            _ => None,
        });
        let span = first.map_or(ty.span, |d| d.span);
        let Some(dim) = dim else {
            return Err(UserError::at(
                span,
                format!(
                    "input `{}` has no batch dim for data parallelism to split",
                    name.name
                ),
                "not a dim name",
                "make every input's first axis the batch dim, e.g. `input x: [B, D]`",
            ));
        };
        match &batch {
            Some((b, _)) if *b != dim => {
                return Err(UserError::at(
                    span,
                    format!("inputs disagree on the batch dim: `{b}` and `{dim}`"),
                    "another first axis",
                    "data parallelism splits the first axis, which every input must share",
                ))
            }
            Some(_) => {}
            None => {
                let value = graph.values().find_map(|v| match &graph.node(v).op {
                    Op::Input { name: n, ty } if *n == name.name => ty.shape.first().copied(),
                    _ => None,
                });
                let value = value.unwrap_or(0);
                if value % parts as usize != 0 || value == 0 {
                    let split = match (data, micro) {
                        (_, 1) => format!("over data = {data} ranks"),
                        (1, _) => format!("into microbatches = {micro}"),
                        _ => format!("over data = {data} ranks, microbatches = {micro} each"),
                    };
                    return Err(UserError::at(
                        span,
                        format!("the batch {dim} = {value} does not split {split}"),
                        "the batch dim",
                        format!(
                            "choose a batch that {parts} divides, e.g. --set {dim}={}",
                            (value.max(1)).div_ceil(parts as usize) * parts as usize
                        ),
                    ));
                }
                batch = Some((dim, value));
            }
        }
    }
    let Some((dim, value)) = batch else {
        return Err(UserError::general(
            "data parallelism splits the batch, and this model has no input",
            "declare the batch's inputs, e.g. `input x: [B, D]`",
        ));
    };
    let mut out = overrides.to_vec();
    out.push((dim, (value / parts as usize) as i64));
    Ok(out)
}
