//! User-facing errors: a message, the source span it concerns, and a help line, rendered by
//! miette against the source text.

use crate::ir::Span;
use miette::{Diagnostic, NamedSource, SourceSpan};
use thiserror::Error;

/// An error in the user's input found by some stage, not yet attached to its source text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserError {
    pub message: String,
    pub span: Option<Span>,
    pub label: String,
    pub help: String,
}

impl UserError {
    /// An error pointing at `span`, labelled `label`, with a help line.
    pub fn at(
        span: Span,
        message: impl Into<String>,
        label: impl Into<String>,
        help: impl Into<String>,
    ) -> UserError {
        UserError {
            message: message.into(),
            span: Some(span),
            label: label.into(),
            help: help.into(),
        }
    }

    /// An error about the input as a whole (no span), with a help line.
    pub fn general(message: impl Into<String>, help: impl Into<String>) -> UserError {
        UserError {
            message: message.into(),
            span: None,
            label: String::new(),
            help: help.into(),
        }
    }

    /// Attaches the source so miette can render the span.
    pub fn with_source(self, name: &str, text: &str) -> Report {
        Report {
            message: self.message,
            span: self
                .span
                .map(|s| SourceSpan::from(s.start..s.end.max(s.start))),
            label: self.label,
            help: self.help,
            src: NamedSource::new(name, text.to_string()),
        }
    }
}

/// A [`UserError`] with its source text: what the CLI prints (exit code 2).
#[derive(Debug, Error, Diagnostic)]
#[error("{message}")]
#[diagnostic(code(memc::error))]
pub struct Report {
    message: String,
    #[label("{label}")]
    span: Option<SourceSpan>,
    label: String,
    #[help]
    help: String,
    #[source_code]
    src: NamedSource<String>,
}
