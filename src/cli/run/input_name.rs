//! Which input a `memc run --input NAME=...` names: the `.mdl` name or the ONNX graph
//! input's name that `memc import` turned into it.

/// The input a `--input` name means: the input of that name, or else the one input whose
/// name the given one becomes as `memc import` writes an ONNX graph input's name (characters
/// outside `[A-Za-z0-9_]` as `_`, a `prefix/` every name shares dropped: `gpu_0/data_0` is
/// `data_0`); None when no input, or more than one, matches.
pub(super) fn input_named(plan: &memc::plan::Plan, name: &str) -> Option<memc::plan::InputBinding> {
    if let Some(exact) = plan.inputs.iter().find(|i| i.name == name) {
        return Some(exact.clone());
    }
    let written: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    // The character before a shared prefix's remainder is its `/` (names are ASCII in the
    // model, so character and byte counts agree there).
    let after_prefix = |i: &&memc::plan::InputBinding| {
        written.ends_with(&i.name) && name.chars().rev().nth(i.name.len()) == Some('/')
    };
    let mut matching = plan
        .inputs
        .iter()
        .filter(|i| written == i.name || after_prefix(i));
    match (matching.next(), matching.next()) {
        (Some(one), None) => Some(one.clone()),
        _ => None,
    }
}
