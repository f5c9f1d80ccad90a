//! `--freeze PATTERN`: parameters whose names match a pattern (`*` stands for any run of
//! characters, e.g. `layer.*.attn.*` or `wte`) are frozen: read, never trained, so they get
//! no gradient and no optimizer state, and backward work only they would need is not built.

use crate::diagnostic::UserError;
use crate::ir::{Graph, Op};

/// Whether `name` matches `pattern`, where `*` matches any run of characters (dots too).
pub fn matches(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // reach[j]: the pattern so far matches name[..j].
    let mut reach = vec![false; n.len() + 1];
    reach[0] = true;
    for &c in &p {
        if c == '*' {
            for j in 1..=n.len() {
                reach[j] = reach[j] || reach[j - 1];
            }
        } else {
            for j in (1..=n.len()).rev() {
                reach[j] = reach[j - 1] && n[j - 1] == c;
            }
            reach[0] = false;
        }
    }
    reach[n.len()]
}

/// Freezes every parameter of `graph` whose name matches one of `patterns`. A pattern that
/// matches no parameter is a user error naming a few of the parameters.
pub fn run(graph: &mut Graph, patterns: &[String]) -> Result<(), UserError> {
    let names: Vec<String> = graph
        .params()
        .into_iter()
        .filter_map(|p| match &graph.node(p).op {
            Op::Param { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect();
    for pattern in patterns {
        if !names.iter().any(|n| matches(pattern, n)) {
            let some: Vec<&str> = names.iter().take(6).map(String::as_str).collect();
            return Err(UserError::general(
                format!("`--freeze {pattern}` matches no parameter"),
                format!(
                    "parameters are named as declared, dotted inside blocks (e.g. {}); `*` matches any run of characters",
                    some.join(", ")
                ),
            ));
        }
    }
    graph.freeze_params(|name| patterns.iter().any(|p| matches(p, name)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn stars_match_any_run() {
        assert!(matches("wte", "wte"));
        assert!(!matches("wte", "wte.x"));
        assert!(matches("layer.*.attn.*", "layer.3.attn.qkv.weight"));
        assert!(!matches("layer.*.attn.*", "layer.3.mlp.fc.weight"));
        assert!(matches("*", ""));
        assert!(matches("*bias", "layer.0.ln1.bias"));
        assert!(!matches("a*b", "acb.c"));
    }
}
