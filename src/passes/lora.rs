//! LoRA (`--lora r=16[,alpha=32][,targets=wq+wv]`, Hu et al. 2021): every targeted weight
//! `W: [IN, OUT]` read as `x @ W` (or `W: [OUT, IN]` read transposed, as a `layout = out_in`
//! linear layer keeps it) gains two trained adapters, `W.lora_a: [IN, r]` (uniform in
//! ±1/sqrt(IN), as PEFT's Kaiming init) and `W.lora_b: [r, OUT]` (zeros), and the product
//! becomes `x @ W + (x @ A) @ B * alpha / r`; every parameter of the model itself is frozen.
//! With B at zero the first forward equals the base model's.

use crate::diagnostic::UserError;
use crate::ir::*;
use std::collections::HashMap;

/// The adapters to add: rank, scale numerator and which weights.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoraSpec {
    /// The adapters' rank r (at least 1).
    pub rank: usize,
    /// The output scale is `alpha / rank`.
    pub alpha: f32,
    /// Weight names or one of their dotted components (`wq` matches `layer.3.wq`, `qkv`
    /// matches `layer.3.qkv.weight`), `*` matching any run of characters; empty: every 2-D
    /// weight read by a matmul inside a block (the blocks' linear layers).
    pub targets: Vec<String>,
}

impl LoraSpec {
    /// Parses `r=16[,alpha=32][,targets=wq+wv]` (alpha defaults to r: scale 1).
    pub fn parse(text: &str) -> Result<LoraSpec, String> {
        let mut spec = LoraSpec {
            rank: 0,
            alpha: 0.0,
            targets: Vec::new(),
        };
        let mut alpha = None;
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, value)) = part.split_once('=') else {
                return Err(format!("`{part}` is not KEY=VALUE (r, alpha or targets)"));
            };
            match key.trim() {
                "r" => {
                    spec.rank = value
                        .trim()
                        .parse::<usize>()
                        .ok()
                        .filter(|&r| r > 0)
                        .ok_or_else(|| format!("r={value}: the rank is a positive integer"))?;
                }
                "alpha" => {
                    let a: f32 = value
                        .trim()
                        .parse()
                        .ok()
                        .filter(|a: &f32| a.is_finite() && *a > 0.0)
                        .ok_or_else(|| format!("alpha={value}: a positive number"))?;
                    alpha = Some(a);
                }
                "targets" => {
                    spec.targets = value
                        .split('+')
                        .map(|t| t.trim().to_string())
                        .filter(|t| !t.is_empty())
                        .collect();
                }
                other => {
                    return Err(format!(
                        "unknown LoRA setting `{other}` (use r, alpha, targets)"
                    ))
                }
            }
        }
        if spec.rank == 0 {
            return Err("the rank is required: --lora r=16".into());
        }
        spec.alpha = alpha.unwrap_or(spec.rank as f32);
        Ok(spec)
    }

    /// Whether the weight named `name` (inside a block when `in_block`) is a target.
    fn targets(&self, name: &str, in_block: bool) -> bool {
        if self.targets.is_empty() {
            return in_block;
        }
        self.targets
            .iter()
            .any(|t| super::freeze::matches(t, name) || name.split('.').any(|part| part == t))
    }
}

/// A weight a matmul reads as its right operand.
#[derive(Clone, Copy)]
struct Weight<'g> {
    value: ValueId,
    name: &'g str,
    /// Its fan-in and fan-out (`[IN, OUT]`, or the reverse when read transposed).
    fans: (usize, usize),
}

/// The weight `W` of `x @ W` (or `x @ W^T`) when it is a 2-D parameter.
fn weight_of(graph: &Graph, v: ValueId) -> Option<Weight<'_>> {
    let node = graph.node(v);
    let Op::MatMul { ta: false, tb, .. } = node.op else {
        return None;
    };
    let w = node.inputs[1];
    match &graph.node(w).op {
        Op::Param { name, ty, .. } if ty.shape.len() == 2 => Some(Weight {
            value: w,
            name: name.as_str(),
            fans: if tb {
                (ty.shape[1], ty.shape[0])
            } else {
                (ty.shape[0], ty.shape[1])
            },
        }),
        _ => None,
    }
}

/// `graph` with the adapters of `spec` and every original parameter frozen. A `targets` entry
/// that matches no weight read by a matmul is a user error.
pub fn run(graph: &Graph, spec: &LoraSpec) -> Result<Graph, UserError> {
    let chosen = |v: ValueId| {
        weight_of(graph, v).filter(|w| spec.targets(w.name, !graph.node(w.value).scope.is_empty()))
    };
    for t in &spec.targets {
        let one = LoraSpec {
            targets: vec![t.clone()],
            ..spec.clone()
        };
        let hit = graph.values().any(|v| {
            weight_of(graph, v)
                .is_some_and(|w| one.targets(w.name, !graph.node(w.value).scope.is_empty()))
        });
        if !hit {
            return Err(UserError::general(
                format!("`--lora targets={t}` matches no weight read as `x @ W`"),
                "name a 2-D parameter used as the right operand of a matmul (e.g. wq, or qkv for a linear group), or leave targets out for every linear layer in the blocks",
            ));
        }
    }
    if !graph.values().any(|v| chosen(v).is_some()) {
        return Err(UserError::general(
            "--lora finds no linear layer inside a block to adapt",
            "name the weights with targets=NAME+NAME (2-D parameters read as `x @ W`)",
        ));
    }
    let internal = |e: TypeError| UserError::general(format!("LoRA: {}", e.message), e.help);
    let mut out = Graph::new();
    let mut map: Vec<ValueId> = Vec::with_capacity(graph.len());
    let mut adapters: HashMap<ValueId, (ValueId, ValueId)> = HashMap::new();
    let scale = spec.alpha / spec.rank as f32;
    for v in graph.values() {
        let node = graph.node(v);
        let origin = node.origin();
        let op = match &node.op {
            Op::Param {
                name,
                ty,
                init,
                buffer,
                ..
            } => Op::Param {
                name: name.clone(),
                ty: ty.clone(),
                init: *init,
                frozen: true,
                buffer: *buffer,
            },
            op => op.clone(),
        };
        let inputs: Vec<ValueId> = node.inputs.iter().map(|i| map[i.index()]).collect();
        let mut y = out.add(op, inputs.clone(), &origin).map_err(internal)?;
        if let Some(Weight {
            value: w,
            name,
            fans: (fan_in, fan_out),
        }) = chosen(v)
        {
            let (a, b) = match adapters.get(&w) {
                Some(&pair) => pair,
                None => {
                    let bound = 1.0 / (fan_in as f32).sqrt();
                    let param = |suffix: &str, dims: Vec<usize>, init: Init| Op::Param {
                        name: format!("{name}.{suffix}"),
                        ty: TensorType::new(DType::F32, dims),
                        init,
                        frozen: false,
                        buffer: false,
                    };
                    let at = graph.node(w).origin();
                    let a = out
                        .add(
                            param(
                                "lora_a",
                                vec![fan_in, spec.rank],
                                Init::Uniform {
                                    low: -bound,
                                    high: bound,
                                },
                            ),
                            vec![],
                            &at,
                        )
                        .map_err(internal)?;
                    let b = out
                        .add(
                            param("lora_b", vec![spec.rank, fan_out], Init::Zeros),
                            vec![],
                            &at,
                        )
                        .map_err(internal)?;
                    adapters.insert(w, (a, b));
                    (a, b)
                }
            };
            let xa = out
                .add(Op::matmul(false, false), vec![inputs[0], a], &origin)
                .map_err(internal)?;
            let xab = out
                .add(Op::matmul(false, false), vec![xa, b], &origin)
                .map_err(internal)?;
            let scaled = out
                .add(Op::Affine { scale, shift: 0.0 }, vec![xab], &origin)
                .map_err(internal)?;
            y = out
                .add(Op::Binary(BinaryFn::Add), vec![y, scaled], &origin)
                .map_err(internal)?;
        }
        map.push(y);
    }
    for (name, v) in &graph.outputs {
        out.outputs.push((name.clone(), map[v.index()]));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::LoraSpec;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        let s = LoraSpec::parse("r=16,alpha=32,targets=wq+wv");
        assert_eq!(
            s.map(|s| (s.rank, s.alpha, s.targets.len())),
            Ok((16, 32.0, 2))
        );
        assert_eq!(LoraSpec::parse("r=8").map(|s| s.alpha), Ok(8.0));
        assert!(LoraSpec::parse("alpha=2").is_err());
        assert!(LoraSpec::parse("r=0").is_err());
        assert!(LoraSpec::parse("r=4,beta=1").is_err());
        assert!(LoraSpec::parse("r").is_err());
    }
}
