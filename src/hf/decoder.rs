//! Decoder-only language models of the LLaMA line (`llama`, `mistral`, `qwen2`, `gemma`,
//! `gemma2`, `phi3`): RMSNorm, rotary positions, grouped-query attention and a gated MLP,
//! named and laid out (`[out, in]` linear weights) as their checkpoints store them.

use super::config::Config;
use super::{num, Written};
use crate::diagnostic::UserError;

/// How one architecture departs from LLaMA.
struct Variant {
    class: &'static str,
    /// q, k and v projections have biases (Qwen2).
    qkv_bias: bool,
    /// q, k, v in one `qkv_proj`, gate and up in one `gate_up_proj` (Phi-3).
    fused: bool,
    /// Embeddings scaled by sqrt(D), norms scale by `1 + weight`, head tied (Gemma).
    gemma: bool,
    /// Gemma 2 beyond Gemma: norms after attention and around the MLP, soft-capped attention
    /// scores and logits, `query_pre_attn_scalar`, and sliding-window layers alternating with
    /// global ones.
    gemma2: bool,
    /// The config key of the sliding window, when the architecture has one.
    window_key: Option<&'static str>,
    /// The config class's `pad_token_id` when a config leaves it out.
    pad_default: Option<usize>,
}

fn variant(model_type: &str) -> Option<Variant> {
    let base = Variant {
        class: "LlamaForCausalLM",
        qkv_bias: false,
        fused: false,
        gemma: false,
        gemma2: false,
        window_key: None,
        pad_default: None,
    };
    Some(match model_type {
        "llama" => base,
        "mistral" => Variant {
            class: "MistralForCausalLM",
            window_key: Some("sliding_window"),
            ..base
        },
        "qwen2" => Variant {
            class: "Qwen2ForCausalLM",
            qkv_bias: true,
            window_key: Some("sliding_window"),
            ..base
        },
        "gemma" => Variant {
            class: "GemmaForCausalLM",
            gemma: true,
            pad_default: Some(0),
            ..base
        },
        "gemma2" => Variant {
            class: "Gemma2ForCausalLM",
            gemma: true,
            gemma2: true,
            pad_default: Some(0),
            ..base
        },
        "phi3" => Variant {
            class: "Phi3ForCausalLM",
            fused: true,
            pad_default: Some(32000),
            window_key: Some("sliding_window"),
            ..base
        },
        _ => return None,
    })
}

/// The model types this module writes.
pub const MODEL_TYPES: [&str; 6] = ["llama", "mistral", "qwen2", "gemma", "gemma2", "phi3"];

/// The `.mdl` text of the decoder `model_type` described by `c`.
pub fn write(c: &Config, model_type: &str) -> Result<Written, UserError> {
    let Some(v) = variant(model_type) else {
        return Err(c.error(
            "model_type",
            format!("`{model_type}` is not a LLaMA-line decoder"),
            "use llama, mistral, qwen2, gemma, gemma2 or phi3",
        ));
    };
    c.refuse(
        "rope_scaling",
        "rotary scaling (positions are those of plain RoPE)",
    )?;
    c.refuse(
        "quantization_config",
        "a checkpoint stored quantized (load the unquantized weights)",
    )?;
    let g2 = if v.gemma2 {
        Some(Gemma2::read(c)?)
    } else {
        c.refuse("attn_logit_softcapping", "soft-capped attention logits")?;
        c.refuse("final_logit_softcapping", "soft-capped output logits")?;
        None
    };
    c.refuse("mlp_bias", "biases in the MLP")?;
    let d = c.count("hidden_size")?;
    let h = c.count("num_attention_heads")?;
    let kv = c.count_or("num_key_value_heads", h)?;
    if h % kv != 0 {
        return Err(c.error(
            "num_key_value_heads",
            format!("{h} query heads do not group evenly over {kv} key/value heads"),
            format!("num_key_value_heads must divide num_attention_heads ({h})"),
        ));
    }
    let hd = c.count_or("head_dim", d / h)?;
    let f = c.count("intermediate_size")?;
    let vocab = c.count("vocab_size")?;
    let padding = c.padding_idx(vocab, v.pad_default)?;
    let layers = c.count("num_hidden_layers")?;
    let positions = c.count_or("max_position_embeddings", 2048)?;
    let eps = c.number_or("rms_norm_eps", 1e-6)?;
    let theta = c.number_or("rope_theta", 10000.0)?;
    let init = c.number_or("initializer_range", 0.02)?;
    let tied = c.flag_or("tie_word_embeddings", v.gemma)?;
    let bias = v.qkv_bias || c.flag_or("attention_bias", false)?;
    let act = activation(c, v.gemma)?;
    let t = positions.min(2048);
    let window = match v.window_key {
        Some(key) if c.has(key) && c.flag_or("use_sliding_window", model_type != "qwen2")? => {
            Some(c.count(key)?)
        }
        _ => None,
    };
    let window = g2.as_ref().map_or(window, |g| g.window);
    let window = window
        .map(|w| format!(", window = {w}"))
        .unwrap_or_default();
    // Gemma 2's attention scale and soft cap, written after the window.
    let extra = g2.as_ref().map_or(String::new(), |g| {
        let cap = g
            .attn_cap
            .map_or(String::new(), |c| format!(", softcap = {}", num(c)));
        format!(", scale = {}{cap}", num(g.scale))
    });
    let (lin, b) = (
        format!("layout = out_in, std = {}", num(init)),
        if bias { "true" } else { "false" },
    );
    let offset = if v.gemma { ", offset = 1" } else { "" };
    let norm = |x: &str, p: &str| format!("rmsnorm({x}, {p}, eps = {}{offset})", num(eps));
    let rope = |x: &str, heads: &str| format!("rope({x}, heads = {heads}, base = {})", num(theta));
    let mut s = format!(
        "# {class} from a Hugging Face config (model_type \"{model_type}\"). Parameters are named\n\
         # and laid out as its checkpoints store them: `memc run --params model.safetensors`\n\
         # (or the shards' model.safetensors.index.json) loads one as downloaded.\n\
         # targets: the token that follows each position (the labels shifted by one); -100 where\n\
         # no loss is taken (padding, prompt tokens), as transformers reads labels.\n\
         # attention_mask: 1 at real tokens, 0 at padding, which no query attends (the model's\n\
         # attention_mask); a query with only padding to see outputs zeros.\n\
         model {name} {{\n  \
           dim B = 1, T = {t}, D = {d}, H = {h}, KV = {kv}, HD = {hd}, F = {f}, V = {vocab}, L = {layers}\n  \
           input  tokens:  i32[B, T]\n  \
           input  attention_mask: i32[B, T]\n  \
           input  targets: i32[B, T]\n  \
           param  model.embed_tokens: embedding(V, D, std = {init})\n\n",
        class = v.class,
        name = model_type,
        init = num(init),
    );
    // The layer block: one, or Gemma 2's sliding-window `local` and full `global` in turn.
    let block = |name: &str, window: &str| {
        let mut s =
            format!("  block {name}(x: [B, T, D]) {{\n    param input_layernorm: rmsnorm(D)\n");
        if v.fused {
            s += &format!(
                "    param self_attn.qkv_proj: linear(D, (H + 2 * KV) * HD, bias = {b}, {lin})\n"
            );
        } else {
            for (p, heads) in [("q_proj", "H"), ("k_proj", "KV"), ("v_proj", "KV")] {
                s += &format!(
                    "    param self_attn.{p}: linear(D, {heads} * HD, bias = {b}, {lin})\n"
                );
            }
        }
        s += &format!("    param self_attn.o_proj: linear(H * HD, D, bias = false, {lin})\n");
        s += "    param post_attention_layernorm: rmsnorm(D)\n";
        if v.gemma2 {
            s += "    param pre_feedforward_layernorm: rmsnorm(D)\n";
            s += "    param post_feedforward_layernorm: rmsnorm(D)\n";
        }
        if v.fused {
            s += &format!("    param mlp.gate_up_proj: linear(D, 2 * F, bias = false, {lin})\n");
        } else {
            s += &format!("    param mlp.gate_proj: linear(D, F, bias = false, {lin})\n");
            s += &format!("    param mlp.up_proj: linear(D, F, bias = false, {lin})\n");
        }
        s += &format!("    param mlp.down_proj: linear(F, D, bias = false, {lin})\n\n");
        s += &format!("    let h = {}\n", norm("x", "input_layernorm"));
        if v.fused {
            s += "    let qkv = linear(h, self_attn.qkv_proj)\n";
            s += &format!("    let q = {}\n", rope("slice(qkv, 0, H * HD)", "H"));
            s += &format!(
                "    let k = {}\n",
                rope("slice(qkv, H * HD, (H + KV) * HD)", "KV")
            );
            s += "    let v = slice(qkv, (H + KV) * HD, (H + 2 * KV) * HD)\n";
        } else {
            s += &format!("    let q = {}\n", rope("linear(h, self_attn.q_proj)", "H"));
            s += &format!(
                "    let k = {}\n",
                rope("linear(h, self_attn.k_proj)", "KV")
            );
            s += "    let v = linear(h, self_attn.v_proj)\n";
        }
        let attn = format!(
            "linear(attention(q, k, v, heads = H, kv_heads = KV, causal = true{window}{extra}, key_mask = attention_mask), self_attn.o_proj)"
        );
        let (split, mlp) = if v.fused {
            (
                "    let gate, up = split(linear(m, mlp.gate_up_proj), 2)\n",
                format!("linear({act}(gate) * up, mlp.down_proj)"),
            )
        } else {
            (
                "",
                format!("linear({act}(linear(m, mlp.gate_proj)) * linear(m, mlp.up_proj), mlp.down_proj)"),
            )
        };
        // Gemma 2 norms the attention's and the MLP's outputs before the residual adds.
        let (attn, pre_mlp, mlp) = if v.gemma2 {
            (
                norm(&attn, "post_attention_layernorm"),
                "pre_feedforward_layernorm",
                norm(&mlp, "post_feedforward_layernorm"),
            )
        } else {
            (attn, "post_attention_layernorm", mlp)
        };
        s += &format!("    x = x + {attn}\n");
        s += &format!("    let m = {}\n{split}", norm("x", pre_mlp));
        s += &format!("    x = x + {mlp}\n");
        s + "    return x\n  }\n\n"
    };
    let alternating = g2.as_ref().is_some_and(|g| g.window.is_some());
    let cycle = if alternating {
        s += &block("local", &window);
        s += &block("global", "");
        "(local, global)"
    } else {
        s += &block("layer", &window);
        "layer"
    };
    s += "  param model.norm: rmsnorm(D)\n";
    if !tied {
        s += &format!("  param lm_head: linear(D, V, bias = false, {lin})\n");
    }
    let scale = if v.gemma {
        format!(" * {}", num((d as f64).sqrt()))
    } else {
        String::new()
    };
    s += &format!("  let x = embed(model.embed_tokens, tokens{padding}){scale}\n");
    s += &format!("  x = repeat L {cycle}(x) as model.layers\n");
    let last = norm("x", "model.norm");
    let logits = if tied {
        format!("{last} @ transpose(model.embed_tokens.weight)")
    } else {
        format!("linear({last}, lm_head)")
    };
    let logits = match g2.and_then(|g| g.final_cap) {
        Some(cap) => {
            s += &format!("  let logits = {logits}\n");
            format!("tanh(logits / {c}) * {c}", c = num(cap))
        }
        None => logits,
    };
    s += &format!("  loss = cross_entropy({logits}, targets, ignore_index = -100)\n");
    s += &super::train_section(c)?;
    Ok(Written {
        mdl: s,
        class: v.class,
    })
}

/// What Gemma 2's config adds to Gemma's, as transformers' `Gemma2Config` defaults it.
struct Gemma2 {
    /// `query_pre_attn_scalar ** -0.5`, the attention's factor on q.k.
    scale: f64,
    /// `attn_logit_softcapping`: the soft cap of the attention scores.
    attn_cap: Option<f64>,
    /// `final_logit_softcapping`: the soft cap of the logits.
    final_cap: Option<f64>,
    /// `sliding_window` of the local layers (the even ones); `None` makes every layer global.
    window: Option<usize>,
}

impl Gemma2 {
    fn read(c: &Config) -> Result<Gemma2, UserError> {
        c.refuse(
            "use_bidirectional_attention",
            "bidirectional attention (memc writes Gemma 2 causal)",
        )?;
        let layers = c.count("num_hidden_layers")?;
        if let Some(types) = c.texts("layer_types")? {
            let alternating = types.len() == layers
                && types.iter().enumerate().all(|(i, t)| {
                    *t == if i % 2 == 0 {
                        "sliding_attention"
                    } else {
                        "full_attention"
                    }
                });
            if !alternating {
                return Err(c.error(
                    "layer_types",
                    "memc writes Gemma 2's layers alternating, sliding_attention first",
                    "remove `layer_types` (or write the default alternation) to plan the model",
                ));
            }
        }
        let window = match c.positive_or_null("sliding_window", Some(4096.0))? {
            Some(w) if w.fract() == 0.0 => Some(c.count_or("sliding_window", 4096)?),
            Some(w) => {
                return Err(c.error(
                    "sliding_window",
                    format!("`sliding_window` must be a whole number of keys, got {w}"),
                    "write the window as a JSON integer, or null for global layers only",
                ))
            }
            None => None,
        };
        let scalar = c.number_or("query_pre_attn_scalar", 256.0)?;
        if scalar <= 0.0 {
            return Err(c.error(
                "query_pre_attn_scalar",
                format!("`query_pre_attn_scalar` must be positive, got {scalar}"),
                "the attention scales q.k by query_pre_attn_scalar ** -0.5",
            ));
        }
        Ok(Gemma2 {
            scale: scalar.powf(-0.5),
            attn_cap: c.positive_or_null("attn_logit_softcapping", Some(50.0))?,
            final_cap: c.positive_or_null("final_logit_softcapping", Some(30.0))?,
            window,
        })
    }
}

/// The `.mdl` function of the config's `hidden_activation` (or `hidden_act`); Gemma's `gelu`
/// is the tanh form, as its modelling code runs it.
fn activation(c: &Config, gemma: bool) -> Result<&'static str, UserError> {
    let key = if c.has("hidden_activation") {
        "hidden_activation"
    } else {
        "hidden_act"
    };
    match c.text(key)?.unwrap_or(if gemma { "gelu" } else { "silu" }) {
        "gelu" if gemma => Ok("gelu"),
        "silu" | "swish" => Ok("silu"),
        "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Ok("gelu"),
        "relu" => Ok("relu"),
        other => Err(c.error(
            key,
            format!("activation `{other}` is not supported in a gated MLP"),
            "memc writes silu, gelu (tanh form) and relu",
        )),
    }
}
