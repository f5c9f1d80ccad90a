//! The `.mdl` text of an imported model and its weights: unique readable names, parameter
//! declarations placed just before their first use, one `let` per computed value.

use super::blocks::{self, Line};
use super::proto::{GraphProto, ValueInfoProto};
use super::tensor::{dtype_name, is_integer, Const, BOOL, FLOAT};
use super::Dyn;
use crate::diagnostic::UserError;
use std::collections::{HashMap, HashSet};

const KEYWORDS: &[&str] = &[
    "model", "dim", "input", "output", "param", "block", "train", "let", "return", "repeat",
    "true", "false",
];

/// Weights by `.mdl` parameter name, with shapes.
pub type Weights = Vec<(String, Vec<usize>, Vec<f32>)>;

/// Collects the model's lines and weights while nodes are mapped.
pub(super) struct Writer {
    prefix: String,
    used: HashSet<String>,
    dims: Vec<(String, String)>,
    inputs: Vec<String>,
    input_names: Vec<String>,
    body: Vec<Line>,
    outputs: Vec<String>,
    output_values: Vec<String>,
    output_names: HashSet<String>,
    weights: Weights,
    params: HashMap<String, Dyn>,
    ints: HashSet<String>,
    masks: HashSet<String>,
    declared: HashMap<String, Vec<usize>>,
}

/// The static shapes the graph declares for its outputs and annotated values (every dim a
/// positive size), by value name.
fn declared_shapes(graph: &GraphProto) -> HashMap<String, Vec<usize>> {
    graph
        .output
        .iter()
        .chain(&graph.value_info)
        .filter_map(|vi| {
            let shape = vi.r#type.as_ref()?.tensor_type.as_ref()?.shape.as_ref()?;
            let dims = shape
                .dim
                .iter()
                .map(|d| {
                    d.dim_value
                        .and_then(|v| usize::try_from(v).ok())
                        .filter(|&v| v > 0)
                })
                .collect::<Option<Vec<usize>>>()?;
            Some((vi.name.clone(), dims))
        })
        .collect()
}

/// The longest prefix ending in `/` shared by every value name (`gpu_0/`), dropped from names.
fn common_prefix(graph: &GraphProto) -> String {
    let mut names = graph
        .node
        .iter()
        .flat_map(|n| n.output.iter())
        .chain(graph.input.iter().map(|i| &i.name));
    let Some(first) = names.next() else {
        return String::new();
    };
    let mut prefix = first.as_str();
    for n in names {
        while !n.starts_with(prefix) {
            prefix = &prefix[..prefix.len() - 1];
        }
    }
    match prefix.rfind('/') {
        Some(i) => prefix[..=i].to_string(),
        None => String::new(),
    }
}

/// `base`, or `base_2`, `base_3`, ... : the first not in `used`, which then holds it.
fn fresh(base: String, used: &mut HashSet<String>) -> String {
    let mut s = base.clone();
    let mut n = 2;
    while !used.insert(s.clone()) {
        s = format!("{base}_{n}");
        n += 1;
    }
    s
}

/// `name` as an `.mdl` identifier: other characters become `_`, never a keyword or a number.
fn sanitize(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, 'v');
    }
    if KEYWORDS.contains(&s.as_str()) {
        s.push('_');
    }
    s
}

/// A shape as `.mdl` text, with dim names where known.
pub(super) fn shape_text(shape: &[usize], syms: &[Option<String>]) -> String {
    let items: Vec<String> = shape
        .iter()
        .enumerate()
        .map(|(i, d)| match syms.get(i) {
            Some(Some(name)) => name.clone(),
            _ => d.to_string(),
        })
        .collect();
    items.join(", ")
}

/// An f32 as an `.mdl` number literal (shortest round-trip form).
pub(super) fn number(x: f32) -> String {
    let s = format!("{x:?}");
    s.strip_suffix(".0").map_or(s.clone(), str::to_string)
}

impl Writer {
    /// A writer for `graph`.
    pub(super) fn new(graph: &GraphProto) -> Writer {
        Writer {
            prefix: common_prefix(graph),
            used: HashSet::new(),
            dims: Vec::new(),
            inputs: Vec::new(),
            input_names: Vec::new(),
            body: Vec::new(),
            outputs: Vec::new(),
            output_values: Vec::new(),
            output_names: HashSet::new(),
            weights: Vec::new(),
            params: HashMap::new(),
            ints: HashSet::new(),
            masks: HashSet::new(),
            declared: declared_shapes(graph),
        }
    }

    /// The static shape the graph declares for value `name`, if it declares one.
    pub(super) fn declared_shape(&self, name: &str) -> Option<&[usize]> {
        self.declared.get(name).map(Vec::as_slice)
    }

    /// A fresh identifier derived from the ONNX name `name`.
    fn ident(&mut self, name: &str) -> String {
        let base = sanitize(name.strip_prefix(&self.prefix).unwrap_or(name));
        fresh(base, &mut self.used)
    }

    /// Declares a graph input; symbolic dims become `dim` declarations (default 1); a
    /// boolean input becomes a float input of 0/1 that reads as a mask.
    pub(super) fn input(&mut self, vi: &ValueInfoProto) -> Result<Dyn, UserError> {
        let t = vi.r#type.as_ref().and_then(|t| t.tensor_type.as_ref());
        let Some(t) = t else {
            return Err(UserError::general(
                format!("graph input `{}` is not a tensor", vi.name),
                "memc imports models whose inputs are tensors",
            ));
        };
        // A boolean input is a float input holding 0/1: a mask, as comparisons give.
        let dtype = match t.elem_type {
            FLOAT | BOOL => "",
            code if is_integer(code) => "i32",
            code => {
                return Err(UserError::general(
                    format!(
                        "graph input `{}` has element type {}",
                        vi.name,
                        dtype_name(code)
                    ),
                    "memc imports float inputs (and integer ids)",
                ))
            }
        };
        let dims = t.shape.as_ref().map(|s| s.dim.clone()).unwrap_or_default();
        let mut shape = Vec::new();
        let mut syms = Vec::new();
        for (i, d) in dims.iter().enumerate() {
            match d.dim_value {
                Some(v) if v > 0 => {
                    shape.push(v as usize);
                    syms.push(None);
                    continue;
                }
                Some(v) => {
                    return Err(UserError::general(
                        format!("graph input `{}` has dim {i} of size {v}", vi.name),
                        "memc plans tensors with at least one element in every dim; \
                         give the dim a positive size or a name (`dim_param`)",
                    ))
                }
                None => {}
            }
            let param = if d.dim_param.is_empty() {
                format!("{}_dim{i}", vi.name)
            } else {
                d.dim_param.clone()
            };
            let name = match self.dims.iter().find(|(p, _)| *p == param) {
                Some((_, n)) => n.clone(),
                None => {
                    let n = self.ident(&param);
                    self.dims.push((param, n.clone()));
                    n
                }
            };
            shape.push(1);
            syms.push(Some(name));
        }
        let name = self.ident(&vi.name);
        if !dtype.is_empty() {
            self.ints.insert(name.clone());
        }
        if t.elem_type == BOOL {
            self.masks.insert(name.clone());
        }
        self.input_names.push(name.clone());
        // The ONNX name beside a renamed input: `memc run --input` takes either.
        let onnx_name = if name == vi.name {
            String::new()
        } else {
            format!("  # ONNX input `{}`", vi.name)
        };
        self.inputs.push(format!(
            "input {name}: {dtype}[{}]{onnx_name}",
            shape_text(&shape, &syms)
        ));
        Ok(Dyn {
            expr: name,
            shape,
            syms,
        })
    }

    /// True when `d` holds integers (an integer graph input passed on unchanged).
    pub(super) fn is_integer(&self, d: &Dyn) -> bool {
        self.ints.contains(&d.expr)
    }

    /// Records that `d` holds a boolean ONNX value as a 0/1 float mask (a comparison's
    /// result).
    pub(super) fn mark_mask(&mut self, d: &Dyn) {
        self.masks.insert(d.expr.clone());
    }

    /// True when `d` is a boolean ONNX value held as a 0/1 float mask.
    pub(super) fn is_mask(&self, d: &Dyn) -> bool {
        self.masks.contains(&d.expr)
    }

    /// `let <name> = expr`, the value named after ONNX value `name`.
    pub(super) fn bind(
        &mut self,
        name: &str,
        expr: String,
        shape: Vec<usize>,
        syms: Vec<Option<String>>,
    ) -> Dyn {
        let id = self.ident(name);
        self.body.push(Line {
            text: format!("let {id} = {expr}"),
            defines: id.clone(),
            param: false,
        });
        Dyn {
            expr: id,
            shape,
            syms,
        }
    }

    /// A parameter holding the constant `c` (ONNX value `name`), declared once.
    pub(super) fn param(&mut self, name: &str, c: &Const) -> Dyn {
        self.declare(name, c, "")
    }

    /// A `frozen` parameter holding the constant `c`, declared once: a table the importer
    /// derives (indexes, folding matrices) that training must not move.
    pub(super) fn constant(&mut self, name: &str, c: &Const) -> Dyn {
        self.declare(name, c, " frozen")
    }

    /// `param <name>: [shape]<suffix>` holding `c`, declared once per ONNX name.
    fn declare(&mut self, name: &str, c: &Const, suffix: &str) -> Dyn {
        if let Some(d) = self.params.get(name) {
            return d.clone();
        }
        let id = self.ident(name);
        self.body.push(Line {
            text: format!("param {id}: [{}]{suffix}", shape_text(&c.shape, &[])),
            defines: id.clone(),
            param: true,
        });
        self.weights.push((id.clone(), c.shape.clone(), c.floats()));
        let d = Dyn {
            expr: id,
            shape: c.shape.clone(),
            syms: vec![None; c.shape.len()],
        };
        self.params.insert(name.to_string(), d.clone());
        d
    }

    /// A parameter group `param <name>: ctor` whose tensors are `<name>.<suffix>`.
    pub(super) fn group(&mut self, name: &str, ctor: String, parts: Weights) -> String {
        let id = self.ident(name);
        self.body.push(Line {
            text: format!("param {id}: {ctor}"),
            defines: id.clone(),
            param: true,
        });
        for (suffix, shape, data) in parts {
            self.weights.push((format!("{id}.{suffix}"), shape, data));
        }
        id
    }

    /// `output <name> = value`, a boolean mask's line saying that it holds 1 for true and 0
    /// for false; returns the output's `.mdl` name.
    pub(super) fn output(&mut self, name: &str, d: &Dyn) -> String {
        let base = sanitize(name.strip_prefix(&self.prefix).unwrap_or(name));
        let s = fresh(base, &mut self.output_names);
        let note = if self.is_mask(d) {
            "  # an ONNX bool: 1 for true, 0 for false"
        } else {
            ""
        };
        self.outputs.push(format!("output {s} = {}{note}", d.expr));
        self.output_values.push(d.expr.clone());
        s
    }

    /// The `.mdl` text of model `name` and its weights.
    pub(super) fn finish(mut self, name: &str, opset: i64) -> (String, Weights) {
        let count: usize = self.weights.iter().map(|(_, _, d)| d.len()).sum();
        let mut out = format!(
            "# Imported from ONNX (opset {opset}) by `memc import`: {count} parameters in {} tensors.\n\
             # Run with the weights: memc run THIS.mdl --params WEIGHTS.safetensors --input NAME=X.npy\n\
             # To train: replace the output by a loss on the logits (`loss = cross_entropy(...)`) and add `train {{ }}`.\n",
            self.weights.len()
        );
        out += &format!("model {} {{\n", sanitize(name));
        if !self.dims.is_empty() {
            let dims: Vec<String> = self.dims.iter().map(|(_, n)| format!("{n} = 1")).collect();
            out += &format!("  dim {}\n", dims.join(", "));
        }
        let used = &mut self.used;
        let mut fresh = || {
            let mut k = 1;
            while !used.insert(format!("unit{k}")) {
                k += 1;
            }
            format!("unit{k}")
        };
        let body = blocks::fold(
            &self.body,
            &self.input_names,
            &self.output_values,
            &mut self.weights,
            &mut fresh,
        );
        for section in [&self.inputs, &body, &self.outputs] {
            if section.is_empty() {
                continue;
            }
            out.push('\n');
            for line in section {
                out += &format!("  {line}\n");
            }
        }
        out += "}\n";
        (out, self.weights)
    }
}
