//! Reading a Hugging Face `config.json`: typed fields with defaults, and diagnostics that
//! point at the key they are about.

use crate::diagnostic::UserError;
use crate::ir::Span;
use serde_json::Value;

/// A parsed `config.json` with its text, for spans.
pub struct Config<'a> {
    text: &'a str,
    json: serde_json::Map<String, Value>,
}

type R<T> = Result<T, UserError>;

impl<'a> Config<'a> {
    /// Parses `text` as a JSON object; anything else is a diagnostic at the offending byte.
    pub fn parse(text: &'a str) -> R<Config<'a>> {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(json)) => Ok(Config { text, json }),
            Ok(_) => Err(UserError::at(
                Span::new(0, text.len().min(1)),
                "a Hugging Face config is a JSON object",
                "not an object",
                "pass the model's config.json",
            )),
            Err(e) => {
                let at = offset_of(text, e.line(), e.column());
                Err(UserError::at(
                    Span::new(at, (at + 1).min(text.len())),
                    format!("not valid JSON: {e}"),
                    "the JSON stops making sense here",
                    "pass the model's config.json as downloaded",
                ))
            }
        }
    }

    /// The span of `"key"` in the text (the first occurrence), or of the first byte.
    pub fn span(&self, key: &str) -> Span {
        let quoted = format!("\"{key}\"");
        match self.text.find(&quoted) {
            Some(at) => Span::new(at, at + quoted.len()),
            None => Span::new(0, self.text.len().min(1)),
        }
    }

    /// A diagnostic at `key`.
    pub fn error(
        &self,
        key: &str,
        message: impl Into<String>,
        help: impl Into<String>,
    ) -> UserError {
        UserError::at(self.span(key), message, "this key", help)
    }

    /// The value of `key`, `None` when absent or null.
    fn get(&self, key: &str) -> Option<&Value> {
        self.json.get(key).filter(|v| !v.is_null())
    }

    /// Whether `key` is present and not null.
    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// A required positive integer.
    pub fn count(&self, key: &str) -> R<usize> {
        match self.get(key) {
            None => Err(UserError::general(
                format!("the config has no `{key}`"),
                "pass the complete config.json of the model",
            )),
            Some(v) => self.as_count(key, v),
        }
    }

    /// An optional positive integer with its default.
    pub fn count_or(&self, key: &str, default: usize) -> R<usize> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => self.as_count(key, v),
        }
    }

    /// The `, padding_idx = N` argument of `embed` for a table of `vocab` rows whose padding
    /// row is `pad_token_id` (or the class's `default` when the config leaves it out): empty
    /// without one; a diagnostic when it is not a row of the table.
    pub fn padding_idx(&self, vocab: usize, default: Option<usize>) -> R<String> {
        let key = "pad_token_id";
        let id = match self.get(key) {
            None => default,
            Some(v) => Some(
                // Negative ids count from the end, as nn.Embedding reads them.
                v.as_i64()
                    .map(|n| if n < 0 { n + vocab as i64 } else { n })
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|&n| n < vocab)
                    .ok_or_else(|| {
                        self.error(
                            key,
                            format!("`{key}` {v} is not a row of the {vocab}-token vocabulary"),
                            format!(
                                "give the padding token's id, from -{vocab} to {}",
                                vocab - 1
                            ),
                        )
                    })?,
            ),
        };
        Ok(id
            .filter(|&n| n < vocab)
            .map(|n| format!(", padding_idx = {n}"))
            .unwrap_or_default())
    }

    fn as_count(&self, key: &str, v: &Value) -> R<usize> {
        v.as_u64()
            .filter(|&n| n > 0)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| {
                self.error(
                    key,
                    format!("`{key}` must be a positive integer, got {v}"),
                    format!("`{key}` is a count: write it as a whole number above 0"),
                )
            })
    }

    /// An optional number with its default.
    pub fn number_or(&self, key: &str, default: f64) -> R<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_f64().filter(|x| x.is_finite()).ok_or_else(|| {
                self.error(
                    key,
                    format!("`{key}` must be a number, got {v}"),
                    format!("write `{key}` as a JSON number (or remove it for its default)"),
                )
            }),
        }
    }

    /// An optional positive number that a config may turn off with null: `default` when the
    /// key is absent, `None` when it is null, the number when it is a positive one.
    pub fn positive_or_null(&self, key: &str, default: Option<f64>) -> R<Option<f64>> {
        match self.json.get(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(v) => match v.as_f64().filter(|x| x.is_finite() && *x > 0.0) {
                Some(x) => Ok(Some(x)),
                None => Err(self.error(
                    key,
                    format!("`{key}` must be a positive number or null, got {v}"),
                    format!("write `{key}` as a positive JSON number, or null for none"),
                )),
            },
        }
    }

    /// An optional boolean with its default.
    pub fn flag_or(&self, key: &str, default: bool) -> R<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| {
                self.error(
                    key,
                    format!("`{key}` must be true or false, got {v}"),
                    format!("write `{key}` as true or false (or remove it for its default)"),
                )
            }),
        }
    }

    /// An optional string, `None` when absent or null.
    pub fn text(&self, key: &str) -> R<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.error(
                key,
                format!("`{key}` must be a string, got {v}"),
                format!("write `{key}` as a JSON string, as transformers saves it"),
            )),
        }
    }

    /// An optional list of strings (Gemma 2's `layer_types`), `None` when absent or null.
    pub fn texts(&self, key: &str) -> R<Option<Vec<&str>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.as_array()
            .and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
            .map(Some)
            .ok_or_else(|| {
                self.error(
                    key,
                    format!("`{key}` must be a list of strings, got {v}"),
                    format!("write `{key}` as a JSON list of strings, as transformers saves it"),
                )
            })
    }

    /// The number of entries of the object `key` (`id2label`), when it is one.
    pub fn entries(&self, key: &str) -> Option<usize> {
        self.get(key).and_then(Value::as_object).map(|o| o.len())
    }

    /// Refuses a config where `key` is set (present, not null, not false): memc does not
    /// model what it asks for, `what`.
    pub fn refuse(&self, key: &str, what: &str) -> R<()> {
        match self.get(key) {
            None | Some(Value::Bool(false)) => Ok(()),
            Some(v) => Err(self.error(
                key,
                format!("`{key}` = {v} is not supported: memc does not model {what}"),
                format!("remove `{key}` (or set it to null) to plan the model without it, knowing the plan then differs from the checkpoint's model"),
            )),
        }
    }
}

/// The byte offset of 1-based `line` and `column` in `text`.
fn offset_of(text: &str, line: usize, column: usize) -> usize {
    let start: usize = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum();
    (start + column.saturating_sub(1)).min(text.len().saturating_sub(1))
}
