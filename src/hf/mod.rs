//! Hugging Face models: a transformers `config.json` to readable `.mdl` text whose parameters
//! are named and laid out as the model's checkpoints store them (`model.layers.0.self_attn.
//! q_proj.weight`, `[out, in]`), and the loading of those checkpoints ([`checkpoint`]).

pub mod checkpoint;
mod config;
mod decoder;
mod encoder;

use crate::diagnostic::UserError;
use config::Config;

/// An imported model: its `.mdl` text and the transformers class it follows.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// The model as `.mdl` text; it compiles as written.
    pub mdl: String,
    /// The transformers class whose parameters it has (`LlamaForCausalLM`).
    pub class: &'static str,
}

/// The `.mdl` of the model `text` (a `config.json`) describes. Every `model_type` memc does
/// not write, and every option it does not model, is a diagnostic at its key.
pub fn import_config(text: &str) -> Result<Written, UserError> {
    let c = Config::parse(text)?;
    let Some(model_type) = c.text("model_type")? else {
        return Err(UserError::general(
            "the config has no `model_type`",
            "pass a transformers config.json (it names its model_type)",
        ));
    };
    match model_type {
        "gpt2" => encoder::gpt2(&c),
        "bert" => encoder::bert(&c),
        "vit" => encoder::vit(&c),
        t if decoder::MODEL_TYPES.contains(&t) => decoder::write(&c, t),
        other => Err(c.error(
            "model_type",
            format!("model_type `{other}` is not supported"),
            format!(
                "memc imports {}, gpt2, bert and vit; write the model as a .mdl by hand otherwise",
                decoder::MODEL_TYPES.join(", ")
            ),
        )),
    }
}

/// A number as `.mdl` text: integers without a fraction, others in the shortest form that
/// reads back to the same f32.
fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else if (1e-3..1e6).contains(&x.abs()) {
        format!("{}", x as f32)
    } else {
        format!("{:e}", x as f32)
    }
}

/// The `train { }` section: AdamW as the transformers Trainer defaults it, in the precision
/// of the checkpoint (`torch_dtype`: bf16 and fp16 as mixed precision).
fn train_section(c: &Config) -> Result<String, UserError> {
    let precision = match c.text("torch_dtype")? {
        Some("bfloat16") => "bf16",
        Some("float16") => "fp16",
        _ => "fp32",
    };
    Ok(format!(
        "\n  train {{\n    \
           optimizer = adamw(lr = 5e-5, betas = (0.9, 0.999), eps = 1e-8, weight_decay = 0)\n    \
           precision = {precision}\n  \
         }}\n}}\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::num;

    #[test]
    fn numbers_read_back() {
        assert_eq!(num(500000.0), "500000");
        assert_eq!(num(1e-5), "1e-5");
        assert_eq!(num(1e-12), "1e-12");
        assert_eq!(num(0.02), "0.02");
        assert_eq!(num(64.0f64.sqrt()), "8");
        assert_eq!(num(3072f64.sqrt()), "55.425625");
    }
}
