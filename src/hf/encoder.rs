//! Post-norm and pre-norm encoders with learned positions: BERT for masked LM (`bert`), the
//! ViT image classifier (`vit`) and GPT-2 (`gpt2`, a causal decoder of the same pieces),
//! named and laid out as their checkpoints store them.

use super::config::Config;
use super::{num, Written};
use crate::diagnostic::UserError;

/// The encoder sizes every one of these configs gives.
struct Sizes {
    d: usize,
    h: usize,
    f: usize,
    layers: usize,
    eps: String,
    lin: String,
}

fn sizes(c: &Config, keys: [&str; 5], eps: f64) -> Result<Sizes, UserError> {
    let [d, h, f, l, e] = keys;
    let d = c.count(d)?;
    let h = c.count(h)?;
    if d % h != 0 {
        return Err(c.error(
            "num_attention_heads",
            format!("{d} does not split into {h} heads"),
            format!("num_attention_heads must divide the hidden size ({d})"),
        ));
    }
    Ok(Sizes {
        d,
        h,
        f: c.count_or(f, 4 * d)?,
        layers: c.count(l)?,
        eps: num(c.number_or(e, eps)?),
        lin: format!("std = {}", num(c.number_or("initializer_range", 0.02)?)),
    })
}

/// The config's activation as a `.mdl` call prefix: `gelu(` with `exact` for the erf form.
fn gelu(c: &Config, key: &str, default: &str) -> Result<(&'static str, &'static str), UserError> {
    match c.text(key)?.unwrap_or(default) {
        "gelu" => Ok(("gelu", ", exact = true")),
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(("gelu", "")),
        "relu" => Ok(("relu", "")),
        other => Err(c.error(
            key,
            format!("activation `{other}` is not supported"),
            "memc writes gelu (erf or tanh form) and relu",
        )),
    }
}

/// The block both BERT and ViT use: attention (`attention.self.*` in BERT,
/// `attention.attention.*` in ViT) and an MLP, post-norm (BERT) or pre-norm (ViT); the
/// attention's arguments end with `extra` (BERT's key mask).
fn block(
    s: &Sizes,
    attn: &str,
    pre_norm: bool,
    act: (&str, &str),
    (rows, extra): (&str, &str),
) -> String {
    let Sizes { eps, lin, .. } = s;
    let mut b = format!("  block layer(x: [B, {rows}, D]) {{\n");
    if pre_norm {
        b += "    param layernorm_before: layernorm(D)\n";
    }
    for p in ["query", "key", "value"] {
        b += &format!("    param {attn}.{p}: linear(D, D, layout = out_in, {lin})\n");
    }
    b += &format!("    param attention.output.dense: linear(D, D, layout = out_in, {lin})\n");
    if pre_norm {
        b += "    param layernorm_after: layernorm(D)\n";
    } else {
        b += "    param attention.output.LayerNorm: layernorm(D)\n";
    }
    b += &format!("    param intermediate.dense: linear(D, F, layout = out_in, {lin})\n");
    b += &format!("    param output.dense: linear(F, D, layout = out_in, {lin})\n");
    if !pre_norm {
        b += "    param output.LayerNorm: layernorm(D)\n";
    }
    b += "\n";
    let (f, exact) = act;
    let h = if pre_norm {
        b += &format!("    let h = layernorm(x, layernorm_before, eps = {eps})\n");
        "h"
    } else {
        "x"
    };
    b += &format!(
        "    let a = attention(linear({h}, {attn}.query), linear({h}, {attn}.key), linear({h}, {attn}.value), heads = H{extra})\n"
    );
    if pre_norm {
        b += "    x = x + linear(a, attention.output.dense)\n";
        b += &format!("    let m = layernorm(x, layernorm_after, eps = {eps})\n");
        b += &format!(
            "    x = x + linear({f}(linear(m, intermediate.dense){exact}), output.dense)\n"
        );
    } else {
        b += &format!("    x = layernorm(x + linear(a, attention.output.dense), attention.output.LayerNorm, eps = {eps})\n");
        b += &format!("    x = layernorm(x + linear({f}(linear(x, intermediate.dense){exact}), output.dense), output.LayerNorm, eps = {eps})\n");
    }
    b += "    return x\n  }\n\n";
    b
}

/// `BertForMaskedLM`: learned positions and token types, post-norm blocks, the MLM head
/// tied to the word embeddings.
pub fn bert(c: &Config) -> Result<Written, UserError> {
    c.refuse(
        "quantization_config",
        "a checkpoint stored quantized (load the unquantized weights)",
    )?;
    if let Some(kind) = c
        .text("position_embedding_type")?
        .filter(|k| *k != "absolute")
    {
        return Err(c.error(
            "position_embedding_type",
            format!("position embeddings `{kind}` are not supported"),
            "memc writes absolute (learned) positions",
        ));
    }
    let s = bert_sizes(c)?;
    let act = gelu(c, "hidden_act", "gelu")?;
    let positions = c.count_or("max_position_embeddings", 512)?;
    let types = c.count_or("type_vocab_size", 2)?;
    let vocab = c.count("vocab_size")?;
    let padding = c.padding_idx(vocab, Some(0))?;
    let (eps, lin, e) = (&s.eps, &s.lin, "bert.embeddings");
    let mut m = format!(
        "# BertForMaskedLM from a Hugging Face config (model_type \"bert\"). Parameters are named and\n\
         # laid out as its checkpoints store them: `memc run --params model.safetensors` loads one.\n\
         # targets: the original token at each masked position, -100 elsewhere (no loss there, as\n\
         # transformers reads labels). attention_mask: 1 at real tokens, 0 at padding, which no\n\
         # query attends (BertModel's attention_mask). Dropout is not modelled.\n\
         model bert {{\n  \
           dim B = 1, T = {positions}, P = {positions}, D = {d}, H = {h}, F = {f}, V = {vocab}, L = {l}, TT = {types}\n  \
           input  tokens:         i32[B, T]\n  \
           input  token_type_ids: i32[B, T]\n  \
           input  attention_mask: i32[B, T]\n  \
           input  targets:        i32[B, T]\n  \
           param  {e}.word_embeddings: embedding(V, D, {lin})\n  \
           param  {e}.position_embeddings: embedding(P, D, {lin})\n  \
           param  {e}.token_type_embeddings: embedding(TT, D, {lin})\n  \
           param  {e}.LayerNorm: layernorm(D)\n\n",
        d = s.d,
        h = s.h,
        f = s.f,
        l = s.layers,
    );
    let mask = ", key_mask = attention_mask";
    m += &block(&s, "attention.self", false, act, ("T", mask));
    let (f, exact) = act;
    m += &format!(
        "  param cls.predictions.transform.dense: linear(D, D, layout = out_in, {lin})\n  \
         param cls.predictions.transform.LayerNorm: layernorm(D)\n  \
         param cls.predictions.bias: [V] = zeros\n  \
         let x = embed({e}.word_embeddings, tokens{padding}) + slice({e}.position_embeddings.weight, 0, T, axis = 0)\n  \
         x = layernorm(x + embed({e}.token_type_embeddings, token_type_ids), {e}.LayerNorm, eps = {eps})\n  \
         x = repeat L layer(x) as bert.encoder.layer\n  \
         let h = layernorm({f}(linear(x, cls.predictions.transform.dense){exact}), cls.predictions.transform.LayerNorm, eps = {eps})\n  \
         loss = cross_entropy(h @ transpose({e}.word_embeddings.weight) + cls.predictions.bias, targets, ignore_index = -100)\n"
    );
    m += &super::train_section(c)?;
    Ok(Written {
        mdl: m,
        class: "BertForMaskedLM",
    })
}

/// The sizes of a BERT-style config (BERT and ViT name them alike).
fn bert_sizes(c: &Config) -> Result<Sizes, UserError> {
    let keys = [
        "hidden_size",
        "num_attention_heads",
        "intermediate_size",
        "num_hidden_layers",
        "layer_norm_eps",
    ];
    sizes(c, keys, 1e-12)
}

/// `ViTForImageClassification`: patches by a strided convolution, a class token, learned
/// positions, pre-norm blocks and a linear classifier on the class token.
pub fn vit(c: &Config) -> Result<Written, UserError> {
    c.refuse(
        "quantization_config",
        "a checkpoint stored quantized (load the unquantized weights)",
    )?;
    let s = bert_sizes(c)?;
    let act = gelu(c, "hidden_act", "gelu")?;
    let image = c.count_or("image_size", 224)?;
    let patch = c.count_or("patch_size", 16)?;
    if image % patch != 0 {
        return Err(c.error(
            "patch_size",
            format!("{image}-pixel images do not split into {patch}-pixel patches"),
            format!("patch_size must divide image_size ({image})"),
        ));
    }
    let channels = c.count_or("num_channels", 3)?;
    let labels = c.entries("id2label").unwrap_or(2);
    let bias = c.flag_or("qkv_bias", true)?;
    if !bias {
        return Err(c.error(
            "qkv_bias",
            "ViT without q/k/v biases is not supported",
            "memc writes the biased projections of the standard ViT",
        ));
    }
    let (eps, lin, e) = (&s.eps, &s.lin, "vit.embeddings");
    let mut m = format!(
        "# ViTForImageClassification from a Hugging Face config (model_type \"vit\"). Parameters are\n\
         # named and laid out as its checkpoints store them: `memc run --params model.safetensors`.\n\
         # Dropout is not modelled.\n\
         model vit {{\n  \
           dim B = 1, C = {channels}, S = {image}, PS = {patch}, N = (S / PS) * (S / PS), D = {d}, H = {h}, F = {f}, L = {l}, K = {labels}\n  \
           input  pixel_values: f32[B, C, S, S]\n  \
           input  labels:       i32[B]\n  \
           param  {e}.cls_token: [1, 1, D] = normal(0.02)\n  \
           param  {e}.position_embeddings: [1, N + 1, D] = normal(0.02)\n  \
           param  {e}.patch_embeddings.projection: conv2d(C, D, PS, bias = true)\n\n",
        d = s.d,
        h = s.h,
        f = s.f,
        l = s.layers,
    );
    m += &block(&s, "attention.attention", true, act, ("N + 1", ""));
    m += &format!(
        "  param vit.layernorm: layernorm(D)\n  \
         param classifier: linear(D, K, layout = out_in, {lin})\n  \
         let p = conv2d(pixel_values, {e}.patch_embeddings.projection, stride = PS)\n  \
         let patches = transpose(reshape(p, (B, D, N)), 1, 2)\n  \
         let x = concat(expand({e}.cls_token, (B, 1, D)), patches, axis = 1) + {e}.position_embeddings\n  \
         x = repeat L layer(x) as vit.encoder.layer\n  \
         let cls = reshape(slice(layernorm(x, vit.layernorm, eps = {eps}), 0, 1, axis = 1), (B, D))\n  \
         loss = cross_entropy(linear(cls, classifier), labels)\n"
    );
    m += &super::train_section(c)?;
    Ok(Written {
        mdl: m,
        class: "ViTForImageClassification",
    })
}

/// `GPT2LMHeadModel`: learned positions, pre-norm blocks with `[in, out]` (Conv1D) weights,
/// the head tied to the token embeddings.
pub fn gpt2(c: &Config) -> Result<Written, UserError> {
    c.refuse(
        "quantization_config",
        "a checkpoint stored quantized (load the unquantized weights)",
    )?;
    let s = sizes(
        c,
        [
            "n_embd",
            "n_head",
            "n_inner",
            "n_layer",
            "layer_norm_epsilon",
        ],
        1e-5,
    )?;
    let (f, exact) = gelu(c, "activation_function", "gelu_new")?;
    let positions = c.count_or("n_positions", 1024)?;
    let vocab = c.count("vocab_size")?;
    let (eps, lin) = (&s.eps, &s.lin);
    let mut m = format!(
        "# GPT2LMHeadModel from a Hugging Face config (model_type \"gpt2\"). Parameters are named and\n\
         # laid out as its checkpoints store them: `memc run --params model.safetensors` loads one.\n\
         # targets: the token that follows each position, -100 where no loss is taken.\n\
         # attention_mask: 1 at real tokens, 0 at padding, which no query attends (the model's\n\
         # attention_mask); a query with only padding to see outputs zeros. Dropout is not modelled.\n\
         model gpt2 {{\n  \
           dim B = 1, T = {positions}, P = {positions}, D = {d}, H = {h}, F = {ff}, V = {vocab}, L = {l}\n  \
           input  tokens:  i32[B, T]\n  \
           input  attention_mask: i32[B, T]\n  \
           input  targets: i32[B, T]\n  \
           param  transformer.wte: embedding(V, D, {lin})\n  \
           param  transformer.wpe: embedding(P, D, std = 0.01)\n\n  \
           block layer(x: [B, T, D]) {{\n    \
             param ln_1: layernorm(D)\n    \
             param attn.c_attn: linear(D, 3 * D, {lin})\n    \
             param attn.c_proj: linear(D, D, {lin})\n    \
             param ln_2: layernorm(D)\n    \
             param mlp.c_fc: linear(D, F, {lin})\n    \
             param mlp.c_proj: linear(F, D, {lin})\n\n    \
             let q, k, v = split(linear(layernorm(x, ln_1, eps = {eps}), attn.c_attn), 3)\n    \
             x = x + linear(attention(q, k, v, heads = H, causal = true, key_mask = attention_mask), attn.c_proj)\n    \
             x = x + linear({f}(linear(layernorm(x, ln_2, eps = {eps}), mlp.c_fc){exact}), mlp.c_proj)\n    \
             return x\n  \
           }}\n\n  \
           param transformer.ln_f: layernorm(D)\n  \
           let x = embed(transformer.wte, tokens) + slice(transformer.wpe.weight, 0, T, axis = 0)\n  \
           x = repeat L layer(x) as transformer.h\n  \
           loss = cross_entropy(layernorm(x, transformer.ln_f, eps = {eps}) @ transpose(transformer.wte.weight), targets, ignore_index = -100)\n",
        d = s.d,
        h = s.h,
        ff = s.f,
        l = s.layers,
    );
    m += &super::train_section(c)?;
    Ok(Written {
        mdl: m,
        class: "GPT2LMHeadModel",
    })
}
