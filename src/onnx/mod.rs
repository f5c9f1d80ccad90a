//! ONNX import: decodes a model (`proto`), folds constant subgraphs (`fold`), maps every
//! other node to `.mdl` expressions (`map`) and writes a readable model with its weights
//! (`write`). Anything memc cannot express is a [`UserError`] naming the node, its op type
//! and opset. The mapped ops compute ONNX's formula up to float rounding.

mod blocks;
mod fold;
mod map;
pub mod proto;
mod shapes;
mod tensor;
mod write;

use crate::diagnostic::UserError;
use prost::Message;
use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::rc::Rc;
use tensor::Const;

pub use map::mapped_ops;

/// The default-domain opsets the importer understands.
pub const OPSETS: RangeInclusive<i64> = 7..=22;

/// The ops whose one definition dates from opset 1 and is unchanged in every later opset, so
/// that an older model using only these reads as it would at opset 7.
const UNCHANGED_SINCE_1: &[&str] = &["Not"];

/// Whether every default-domain op of `graph` is in [`UNCHANGED_SINCE_1`].
fn unchanged_since_1(graph: &proto::GraphProto) -> bool {
    !graph.node.is_empty()
        && graph
            .node
            .iter()
            .all(|n| UNCHANGED_SINCE_1.contains(&n.op_type.as_str()))
}

/// The element type a value's declaration states, if it does.
fn elem_type(vi: &proto::ValueInfoProto) -> Option<i32> {
    let t = vi.r#type.as_ref()?.tensor_type.as_ref()?;
    (t.elem_type != 0).then_some(t.elem_type)
}

/// Whether a value is declared with an integer or boolean element type.
fn declared_integer(vi: &proto::ValueInfoProto) -> bool {
    elem_type(vi).is_some_and(tensor::is_integer)
}

/// The value of an integer input whose declared static shape has no elements: it can hold
/// nothing else, so it is a constant (ONNX tests pass empty `axes` this way).
fn empty_integer(vi: &proto::ValueInfoProto) -> Option<Const> {
    if !declared_integer(vi) {
        return None;
    }
    let shape = vi.r#type.as_ref()?.tensor_type.as_ref()?.shape.as_ref()?;
    let dims: Vec<usize> = shape
        .dim
        .iter()
        .map(|d| d.dim_value.and_then(|v| usize::try_from(v).ok()))
        .collect::<Option<_>>()?;
    dims.contains(&0)
        .then(|| Const::new(dims, tensor::Data::Int(Vec::new())))
}

/// An imported model: `.mdl` source and its weights (names as the `.mdl` declares them).
#[derive(Debug, Clone)]
pub struct Imported {
    /// The model: it declares every parameter of `weights`, with these shapes.
    pub mdl: String,
    /// Each parameter's name (as `memc run --params` looks it up), shape and f32 values.
    pub weights: Vec<(String, Vec<usize>, Vec<f32>)>,
    /// Graph input names of the ONNX file, each with the `.mdl` input name it became, in the
    /// file's order; initializers aside, and integer inputs of a static shape with no
    /// elements (an empty `axes`), whose only possible value is folded in as a constant.
    pub inputs: Vec<(String, String)>,
    /// Graph output names of the ONNX file, each with the `.mdl` output name it became.
    pub outputs: Vec<(String, String)>,
    /// The `.mdl` names of the outputs that hold an ONNX boolean as a float 0/1 mask (1 for
    /// true): comparisons and their combinations.
    pub boolean_outputs: Vec<String>,
}

/// A tensor read from a serialized `TensorProto` (the `input_0.pb` files of ONNX tests).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorFile {
    /// The tensor's name as stored (may be empty).
    pub name: String,
    /// Its dims.
    pub shape: Vec<usize>,
    /// Its elements in row-major order: exact for every float and double that fits f32,
    /// and for integers below 2^53.
    pub values: Vec<f64>,
    /// True for floating element types, false for integers and booleans.
    pub float: bool,
}

/// Decodes a serialized `TensorProto`; the error says why it cannot be read (a malformed
/// message, or an element type memc does not read).
pub fn read_tensor(bytes: &[u8]) -> Result<TensorFile, String> {
    let t = proto::TensorProto::decode(bytes).map_err(|e| e.to_string())?;
    let c = tensor::decode(&t)?;
    let float = matches!(c.data, tensor::Data::Float(_));
    let values = (0..c.data.len()).map(|i| c.data.get(i)).collect();
    Ok(TensorFile {
        name: t.name,
        shape: c.shape,
        values,
        float,
    })
}

/// A value computed at run time: its `.mdl` expression (a name), shape, and for each dim
/// the model `dim` it equals, if any.
#[derive(Debug, Clone, PartialEq)]
struct Dyn {
    expr: String,
    shape: Vec<usize>,
    syms: Vec<Option<String>>,
}

/// An ONNX value during import: folded to a constant, or computed by the `.mdl`.
#[derive(Debug, Clone)]
enum Value {
    Const(Rc<Const>),
    Dyn(Dyn),
}

type Env = HashMap<String, Value>;

/// A node being imported, with what its diagnostics need.
struct Node<'a> {
    p: &'a proto::NodeProto,
    opset: i64,
    index: usize,
}

impl Node<'_> {
    fn op(&self) -> &str {
        &self.p.op_type
    }

    /// `node `conv1` (Conv, opset 9)`, or by index and first output when unnamed.
    fn label(&self) -> String {
        let who = if self.p.name.is_empty() {
            let out = self.p.output.first().map(String::as_str).unwrap_or("");
            format!("node #{} (output `{out}`)", self.index)
        } else {
            format!("node `{}`", self.p.name)
        };
        format!("{who} ({}, opset {})", self.p.op_type, self.opset)
    }

    fn err(&self, what: impl std::fmt::Display, help: impl Into<String>) -> UserError {
        UserError::general(format!("{}: {what}", self.label()), help)
    }

    fn attr(&self, name: &str) -> Option<&proto::AttributeProto> {
        self.p.attribute.iter().find(|a| a.name == name)
    }

    fn int(&self, name: &str, default: i64) -> i64 {
        self.attr(name).map_or(default, |a| a.i)
    }

    fn float(&self, name: &str, default: f32) -> f32 {
        self.attr(name).map_or(default, |a| a.f)
    }

    fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.attr(name).map(|a| a.ints.clone())
    }

    fn string(&self, name: &str) -> Option<String> {
        self.attr(name)
            .map(|a| String::from_utf8_lossy(&a.s).into_owned())
    }

    /// The name of input `i`, when present and not the empty "absent" name.
    fn input_name(&self, i: usize) -> Option<&str> {
        self.p
            .input
            .get(i)
            .map(String::as_str)
            .filter(|n| !n.is_empty())
    }

    /// Input `i`'s value; a missing input or one no earlier node produced is an error.
    fn input<'e>(&self, env: &'e Env, i: usize) -> Result<&'e Value, UserError> {
        let Some(name) = self.input_name(i) else {
            return Err(self.err(
                format!("input {i} is missing"),
                "the operator requires it; the file is malformed",
            ));
        };
        env.get(name).ok_or_else(|| {
            self.err(
                format!("reads `{name}`, which no graph input, initializer or earlier node produces"),
                "the graph is malformed or uses an output memc does not produce (e.g. a training-mode output)",
            )
        })
    }

    /// Input `i`, which must be a constant.
    fn konst<'e>(&self, env: &'e Env, i: usize) -> Result<&'e Rc<Const>, UserError> {
        match self.input(env, i)? {
            Value::Const(c) => Ok(c),
            Value::Dyn(_) => Err(self.err(
                format!(
                    "input {i} (`{}`) is computed at run time; memc needs it constant",
                    self.input_name(i).unwrap_or("")
                ),
                "export the model with this input as an initializer (e.g. weights, shapes, axes)",
            )),
        }
    }
}

fn malformed(what: impl std::fmt::Display) -> UserError {
    UserError::general(
        format!("the file is not a valid ONNX model: {what}"),
        "check that it was written by `torch.onnx.export` or `onnx.save` and is complete",
    )
}

/// Imports an ONNX model file's bytes as a `.mdl` model named `name`.
pub fn import(bytes: &[u8], name: &str) -> Result<Imported, UserError> {
    let model = proto::ModelProto::decode(bytes).map_err(malformed)?;
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| malformed("it has no graph"))?;
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .ok_or_else(|| malformed("it imports no version of the default operator set"))?;
    let declared = opset;
    let opset = if (1..*OPSETS.start()).contains(&opset) && unchanged_since_1(graph) {
        *OPSETS.start()
    } else {
        opset
    };
    if !OPSETS.contains(&opset) {
        return Err(UserError::general(
            format!("the model uses opset {opset} of the default domain, which memc does not import"),
            format!(
                "memc imports opsets {} to {}; convert it with `onnx.version_converter.convert_version(model, 17)`",
                OPSETS.start(),
                OPSETS.end()
            ),
        ));
    }
    let mut w = write::Writer::new(graph);
    let mut env = Env::new();
    for t in &graph.initializer {
        let c = tensor::decode(t).map_err(|e| {
            UserError::general(
                format!("initializer `{}`: {e}", t.name),
                "memc imports float32 weights and integer shape constants",
            )
        })?;
        env.insert(t.name.clone(), Value::Const(Rc::new(c)));
    }
    let mut inputs = Vec::new();
    for input in &graph.input {
        if env.contains_key(&input.name) {
            continue;
        }
        if let Some(c) = empty_integer(input) {
            env.insert(input.name.clone(), Value::Const(Rc::new(c)));
            continue;
        }
        let d = w.input(input)?;
        inputs.push((input.name.clone(), d.expr.clone()));
        env.insert(input.name.clone(), Value::Dyn(d));
    }
    for (index, p) in graph.node.iter().enumerate() {
        let node = Node { p, opset, index };
        if !(p.domain.is_empty() || p.domain == "ai.onnx") {
            return Err(node.err(
                format!("operators of domain `{}` are not supported", p.domain),
                "memc imports operators of the default ONNX domain only",
            ));
        }
        let outs = match fold::fold(&node, &env)? {
            Some(c) => vec![Value::Const(Rc::new(c))],
            None => map::map(&node, &env, &mut w)?,
        };
        for (name, v) in p.output.iter().zip(outs) {
            if !name.is_empty() {
                env.insert(name.clone(), v);
            }
        }
    }
    let mut outputs = Vec::new();
    let mut boolean_outputs = Vec::new();
    for out in &graph.output {
        match env.get(&out.name) {
            Some(Value::Dyn(d)) if w.is_integer(d) => {
                return Err(UserError::general(
                    format!("graph output `{}` is an integer tensor", out.name),
                    "memc computes float outputs; integer inputs can only be ids of an embedding",
                ))
            }
            Some(Value::Dyn(d))
                if w.is_mask(d) && elem_type(out).is_none_or(|t| t == tensor::BOOL) =>
            {
                let mdl = w.output(&out.name, d);
                boolean_outputs.push(mdl.clone());
                outputs.push((out.name.clone(), mdl));
            }
            Some(Value::Dyn(d)) if w.is_mask(d) || declared_integer(out) => {
                return Err(UserError::general(
                    format!(
                        "graph output `{}` is a {} tensor",
                        out.name,
                        tensor::dtype_name(elem_type(out).unwrap_or(9))
                    ),
                    "memc computes float outputs; cast the result to float in the model",
                ))
            }
            Some(Value::Dyn(d)) => outputs.push((out.name.clone(), w.output(&out.name, d))),
            Some(Value::Const(_)) => {
                return Err(UserError::general(
                    format!("graph output `{}` is a constant", out.name),
                    "memc plans computations; a constant output needs no model",
                ))
            }
            None => {
                return Err(malformed(format!(
                    "no node produces graph output `{}`",
                    out.name
                )))
            }
        }
    }
    let (mdl, weights) = w.finish(name, declared);
    Ok(Imported {
        mdl,
        weights,
        inputs,
        outputs,
        boolean_outputs,
    })
}
