//! What `--lora` trained, for use elsewhere: the adapters in PEFT's layout (an
//! `adapter_model.safetensors` and `adapter_config.json` that `PeftModel.from_pretrained`
//! loads onto the base model), or merged into the weights they adapt (`W + alpha/r · A·B`,
//! in W's own orientation) so the base model runs the adapted step without them.

use crate::ir::Op;
use crate::plan::{BufferId, Plan};
use std::collections::BTreeSet;

/// One adapted weight of a plan: the weight and its two adapters.
#[derive(Debug, Clone, PartialEq)]
pub struct Adapted {
    /// The weight's parameter name (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// `lora_a: [fan_in, r]`.
    pub a: BufferId,
    /// `lora_b: [r, fan_out]`.
    pub b: BufferId,
    /// The rank r.
    pub rank: usize,
    /// Whether the weight is stored `[out, in]` (read as `x @ W^T`).
    pub out_in: bool,
}

/// The adapted weights of `plan`, in parameter order: every parameter `W` with parameters
/// `W.lora_a` and `W.lora_b`. A weight whose orientation the plan does not show (no matmul
/// reads it) is left out.
pub fn adapted(plan: &Plan) -> Vec<Adapted> {
    let by_name = |name: &str| plan.params.iter().find(|p| p.name == name);
    plan.params
        .iter()
        .filter_map(|w| {
            let a = by_name(&format!("{}.lora_a", w.name))?;
            let b = by_name(&format!("{}.lora_b", w.name))?.buffer;
            let rank = *plan.param_shape(a).get(1)?;
            let a = a.buffer;
            Some(Adapted {
                name: w.name.clone(),
                a,
                b,
                rank,
                out_in: reads_transposed(plan, w.buffer)?,
            })
        })
        .collect()
}

/// Whether the matmuls of `plan` read buffer `w` (or its cast, or its dequantized weight)
/// as their transposed right operand; None when no matmul reads it.
fn reads_transposed(plan: &Plan, w: BufferId) -> Option<bool> {
    let mut held = vec![w];
    for step in &plan.steps {
        match step.op {
            Op::MatMul { ta: false, tb, .. } if held.contains(&step.inputs[1]) => return Some(tb),
            Op::Cast { .. } | Op::Dequantize { .. } if held.contains(&step.inputs[0]) => {
                held.extend(step.output)
            }
            _ => {}
        }
    }
    None
}

/// `W + scale · A·B` in W's orientation (`[fan_in, fan_out]`, or `[fan_out, fan_in]` when
/// `out_in`), all row-major f32.
pub fn merged(ad: &Adapted, w: &[f32], a: &[f32], b: &[f32], scale: f32) -> Vec<f32> {
    let r = ad.rank;
    let (fan_in, fan_out) = (a.len() / r.max(1), b.len() / r.max(1));
    let mut out = w.to_vec();
    for i in 0..fan_in {
        for o in 0..fan_out {
            let ab: f32 = (0..r).map(|k| a[i * r + k] * b[k * fan_out + o]).sum();
            let at = if ad.out_in {
                o * fan_in + i
            } else {
                i * fan_out + o
            };
            out[at] += scale * ab;
        }
    }
    out
}

/// The transpose of a row-major `[rows, cols]` matrix.
pub fn transposed(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; m.len()];
    for i in 0..rows {
        for j in 0..cols {
            t[j * rows + i] = m[i * cols + j];
        }
    }
    t
}

/// Whether a parameter name is one of LoRA's adapters (`W.lora_a`, `W.lora_b`).
pub fn is_adapter(name: &str) -> bool {
    name.ends_with(".lora_a") || name.ends_with(".lora_b")
}

/// PEFT's module path of a weight: its name without the trailing `.weight`.
pub fn module(weight: &str) -> &str {
    weight.strip_suffix(".weight").unwrap_or(weight)
}

/// `adapter_config.json` for the adapters of `list`, with LoRA's `alpha`: PEFT's LoRA config
/// naming the targeted modules by their last component.
pub fn peft_config(list: &[Adapted], alpha: f32) -> String {
    let targets: BTreeSet<&str> = list
        .iter()
        .map(|ad| {
            let m = module(&ad.name);
            m.rsplit('.').next().unwrap_or(m)
        })
        .collect();
    let rank = list.first().map_or(0, |ad| ad.rank);
    let config = serde_json::json!({
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": targets,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": list.iter().any(|ad| !ad.out_in),
        "inference_mode": true,
        "base_model_name_or_path": null,
        "task_type": null,
    });
    serde_json::to_string_pretty(&config).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ad(out_in: bool) -> Adapted {
        Adapted {
            name: "fc.weight".into(),
            a: BufferId(1),
            b: BufferId(2),
            rank: 1,
            out_in,
        }
    }

    #[test]
    fn merging_follows_the_weights_orientation() {
        // fan_in 2, fan_out 3, r 1: A·B = [[1, 2, 3], [2, 4, 6]].
        let (a, b) = ([1.0, 2.0], [1.0, 2.0, 3.0]);
        let w = [0.0; 6];
        assert_eq!(
            merged(&ad(false), &w, &a, &b, 0.5),
            [0.5, 1.0, 1.5, 1.0, 2.0, 3.0]
        );
        assert_eq!(
            merged(&ad(true), &w, &a, &b, 0.5),
            [0.5, 1.0, 1.0, 2.0, 1.5, 3.0]
        );
        assert_eq!(
            transposed(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3),
            [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
        );
        assert_eq!(
            module("model.layers.0.mlp.up_proj.weight"),
            "model.layers.0.mlp.up_proj"
        );
    }
}
