//! `memc run --save-adapters DIR` and `--merge-adapters`: what `--lora` trained, written for
//! use elsewhere (see [`memc::exec::adapters`]).

use super::{output::write_atomic, Failure};
use memc::exec::adapters::{self, adapted, Adapted};
use memc::exec::io::write_safetensors;
use memc::plan::{BufferId, Plan};
use std::path::Path;

/// Named tensors as safetensors writes them: name, shape, values.
pub type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

/// The adapted weights of `plan` and LoRA's alpha, from the `--lora` or `lora = lora(...)`
/// it was compiled with; an error naming `flag` otherwise.
pub fn lora(plan: &Plan, flag: &str) -> Result<(Vec<Adapted>, f32), Failure> {
    match plan.train.as_ref().and_then(|t| t.lora.as_ref()) {
        Some(spec) => Ok((adapted(plan), spec.alpha)),
        None => Err(Failure::Plain(format!(
            "{flag} saves what LoRA trains, and this plan has no adapters: compile with --lora \
             or `train {{ lora = lora(r = 16) }}`"
        ))),
    }
}

/// Writes DIR/adapter_model.safetensors and DIR/adapter_config.json: the adapters as PEFT
/// stores LoRA (`base_model.model.<module>.lora_A.weight: [r, in]`, `lora_B.weight:
/// [out, r]`), read through `read`.
pub fn save(
    dir: &Path,
    plan: &Plan,
    read: impl Fn(BufferId) -> Result<Vec<f32>, Failure>,
) -> Result<(), Failure> {
    let (list, alpha) = lora(plan, "--save-adapters")?;
    let mut tensors: Tensors = Vec::new();
    for ad in &list {
        let (a, b) = (read(ad.a)?, read(ad.b)?);
        let (fan_in, fan_out) = (a.len() / ad.rank, b.len() / ad.rank);
        let at = format!("base_model.model.{}", adapters::module(&ad.name));
        let a_t = adapters::transposed(&a, fan_in, ad.rank);
        let b_t = adapters::transposed(&b, ad.rank, fan_out);
        tensors.push((format!("{at}.lora_A.weight"), vec![ad.rank, fan_in], a_t));
        tensors.push((format!("{at}.lora_B.weight"), vec![fan_out, ad.rank], b_t));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Failure::Plain(format!("cannot create {}: {e}", dir.display())))?;
    let bytes = write_safetensors(&tensors, None)
        .map_err(|e| Failure::Plain(format!("cannot encode the adapters: {e}")))?;
    write_atomic(&dir.join("adapter_model.safetensors"), &bytes)?;
    let config = adapters::peft_config(&list, alpha);
    write_atomic(&dir.join("adapter_config.json"), config.as_bytes())
}

/// Every parameter of `plan` but the adapters, each adapted weight merged with its
/// adapters (`W + alpha/r · A·B`): what the model without `--lora` loads with `--params`.
pub fn merged_params(
    plan: &Plan,
    read: impl Fn(BufferId) -> Result<Vec<f32>, Failure>,
) -> Result<Tensors, Failure> {
    let (list, alpha) = lora(plan, "--merge-adapters")?;
    let mut out = Tensors::new();
    for p in plan
        .params
        .iter()
        .filter(|p| !adapters::is_adapter(&p.name))
    {
        let shape = plan.param_shape(p);
        let mut values = read(p.buffer)?;
        if let Some(ad) = list.iter().find(|ad| ad.name == p.name) {
            let scale = alpha / ad.rank as f32;
            values = adapters::merged(ad, &values, &read(ad.a)?, &read(ad.b)?, scale);
        }
        out.push((p.name.clone(), shape, values));
    }
    Ok(out)
}
