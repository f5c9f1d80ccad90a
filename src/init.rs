//! The contents a plan's buffers start from, one buffer at a time: parameters from their
//! initializers, persistent state at its initial value, and seeded synthetic inputs. Every
//! executor fills its arena from these, so the CPU and the device start from the same values
//! without either building the whole arena on the host.

use crate::exec::kernels::rng;
use crate::ir::{DType, Init};
use crate::plan::{BufferId, Plan};

/// Where a rank sits in a parallel layout: its index among the data-parallel ranks that
/// hold its tensor slice (the ZeRO shard it holds) and its tensor rank (the slice of each
/// tensor-parallel parameter it holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankIndex {
    /// Data-parallel index, 0-based.
    pub data: usize,
    /// Tensor-parallel index, 0-based.
    pub tensor: usize,
}

impl RankIndex {
    /// The first rank, and the only rank of a plan on one device.
    pub const FIRST: RankIndex = RankIndex { data: 0, tensor: 0 };
}

/// The values (as f32, before any 16-bit rounding) parameter `k` of `plan` starts from under
/// `seed` on rank `rank`: its initializer keyed by `seed` and the parameter's position among
/// the parameters (running statistics not counted), evaluated at each element's index in the
/// whole parameter (a tensor-parallel rank's slice takes the elements of the whole its slice
/// holds); a parameter sharded over the data-parallel ranks (ZeRO-3) starts from its shard of
/// those values, zero past their end, so N ranks start from what one does.
pub fn param_values(plan: &Plan, k: usize, seed: u64, rank: RankIndex) -> Vec<f32> {
    let Some(p) = plan.params.get(k) else {
        return Vec::new();
    };
    match &p.shard_of {
        Some(full) => sliced(plan, k, full, (Some(p.buffer), rank), seed),
        None => sliced(plan, k, &plan.param_shape(p), (None, rank), seed),
    }
}

/// The values parameter `k`'s fp32 master shard (ZeRO-1 and 2 with mixed precision) starts
/// from on rank `rank`: its slice of the values the whole parameter starts from, zero past
/// their end, so the rank's 16-bit copy and master agree as one rank's cast would.
fn master_values(plan: &Plan, k: usize, master: BufferId, seed: u64, rank: RankIndex) -> Vec<f32> {
    match plan.params.get(k) {
        Some(p) => sliced(plan, k, &plan.param_shape(p), (Some(master), rank), seed),
        None => Vec::new(),
    }
}

/// The values parameter `k` of (this tensor rank's) shape `full` starts from under `seed`:
/// all of them, or with `shard = (Some(buffer), rank)` data rank `rank.data`'s slice of
/// `buffer`'s length, zero past their end; a tensor-parallel parameter's element `i` is the
/// initializer's at its index in the whole parameter on tensor rank `rank.tensor`.
fn sliced(
    plan: &Plan,
    k: usize,
    full: &[usize],
    (shard, rank): (Option<BufferId>, RankIndex),
    seed: u64,
) -> Vec<f32> {
    let Some(p) = plan.params.get(k) else {
        return Vec::new();
    };
    let n: u64 = full.iter().map(|&d| d as u64).product();
    // The position among the parameters proper: running statistics (constant initial
    // values) take none, so adding a batch norm's leaves every other draw as it was; a
    // pipeline stage's parameters take their positions in the whole model.
    let position = match plan.pipeline.as_ref().and_then(|st| st.positions.get(k)) {
        Some(&position) => position as usize,
        None => plan.params[..k]
            .iter()
            .filter(|q| !q.running_statistic)
            .count(),
    };
    let key = seed.wrapping_mul(1_000_003).wrapping_add(position as u64);
    let (range, len) = match shard {
        Some(b) => {
            let len = plan.buffers[b.index()].ty.numel();
            let data = rank.data as u64;
            ((data * len).min(n)..((data + 1) * len).min(n), len)
        }
        None => (0..n, n),
    };
    let whole_index = |i: u64| match &p.tensor_split {
        Some(split) => split.global_index(i as usize, rank.tensor) as u64,
        None => i,
    };
    let mut values: Vec<f32> = range
        .map(whole_index)
        .map(|i| match p.init {
            Init::Zeros => 0.0,
            Init::Ones => 1.0,
            Init::Normal { std } => rng::normal01(key, 0, i) * std,
            Init::Uniform { low, high } => low + (high - low) * rng::uniform01(key, 0, i),
        })
        .collect();
    values.resize(len as usize, 0.0);
    values
}

/// Every persistent buffer (each parameter, then each optimizer-state buffer) with the values
/// it holds before the first step under `seed` on rank `rank` ([`RankIndex::FIRST`] on one device),
/// computed lazily one buffer at a time; a parameter's fp32 master shard starts from the
/// rank's slice of the parameter's values.
pub fn persistent(
    plan: &Plan,
    seed: u64,
    rank: RankIndex,
) -> impl Iterator<Item = (BufferId, Vec<f32>)> + '_ {
    let params = (0..plan.params.len())
        .map(move |k| (plan.params[k].buffer, param_values(plan, k, seed, rank)));
    let state = plan.optim_state.iter().map(move |s| {
        let master = (plan.params.iter()).position(|p| p.master == Some(s.buffer));
        match master {
            Some(k) => (s.buffer, master_values(plan, k, s.buffer, seed, rank)),
            None => {
                let n = plan.buffers[s.buffer.index()].ty.numel() as usize;
                (s.buffer, vec![s.init; n])
            }
        }
    });
    params.chain(state)
}

/// Seeded synthetic data for input `k` of `plan`, every micro-batch of a step one after
/// another: ids (as their i32 bit patterns) uniform below the input's id limit, except that
/// an input read only as attention key masks is all ones (every key a real token), floats
/// standard normal.
pub fn synthetic_input(plan: &Plan, k: usize, seed: u64) -> Vec<f32> {
    let Some(input) = plan.inputs.get(k) else {
        return Vec::new();
    };
    let ty = &plan.buffers[input.buffer.index()].ty;
    synthetic_values(
        input,
        ty,
        u64::from(plan.micro_steps()) * ty.numel(),
        (k, seed),
    )
}

/// The first `n` synthetic values of input `k` (its binding `input`, of type `ty`) under
/// `seed`, as [`synthetic_input`] draws them: data-parallel ranks draw the full batch's
/// with this and each takes its rows.
pub fn synthetic_values(
    input: &crate::plan::InputBinding,
    ty: &crate::ir::TensorType,
    n: u64,
    (k, seed): (usize, u64),
) -> Vec<f32> {
    let key = seed ^ (0x5151_0000 + k as u64);
    match ty.dtype {
        DType::I32 if input.key_mask => vec![f32::from_bits(1); n as usize],
        DType::I32 => {
            let limit = input.id_limit.unwrap_or(2) as f32;
            (0..n)
                .map(|i| {
                    let id = ((rng::uniform01(key, 0, i) * limit) as i32).min(limit as i32 - 1);
                    f32::from_bits(id as u32)
                })
                .collect()
        }
        _ => (0..n).map(|i| rng::normal01(key, 0, i)).collect(),
    }
}

/// Every input with its synthetic data ([`synthetic_input`]), one input at a time.
pub fn synthetic_inputs(plan: &Plan, seed: u64) -> impl Iterator<Item = (BufferId, Vec<f32>)> + '_ {
    (0..plan.inputs.len()).map(move |k| (plan.inputs[k].buffer, synthetic_input(plan, k, seed)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::cpu::CpuExecutor;
    use crate::exec::lowp;
    use crate::settings::Precision;
    use crate::Options;

    fn mlp(precision: Precision, master_weights: bool) -> crate::plan::VerifiedPlan {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/mlp.mdl");
        let src = std::fs::read_to_string(path).unwrap_or_default();
        let options = Options {
            overrides: vec![("B".into(), 4), ("IN".into(), 12), ("H".into(), 8)],
            precision: Some(precision),
            master_weights: Some(master_weights),
            accumulate: Some(2),
            ..Options::default()
        };
        crate::compile(&src, &options).expect("compiles").plan
    }

    /// An input read only as a key mask starts as all ones (no padding); ids stay below
    /// their limit.
    #[test]
    fn synthetic_key_masks_are_ones() {
        let src = "model m {\n  dim B = 2, T = 5, D = 8, V = 11\n  input ids: i32[B, T]\n  \
                   input attention_mask: i32[B, T]\n  param e: [V, D] = normal(1.0)\n  \
                   let x = embed(e, ids)\n  \
                   loss = mean(attention(x, x, x, heads = 2, key_mask = attention_mask))\n  \
                   train { optimizer = sgd(lr = 0.1) }\n}\n";
        let plan = crate::compile(src, &crate::Options::default())
            .expect("compiles")
            .plan;
        let plan = plan.plan();
        let input = |name| plan.inputs.iter().position(|i| i.name == name).expect(name);
        let mask = synthetic_input(plan, input("attention_mask"), 3);
        assert_eq!(mask.len(), 10);
        assert!(mask.iter().all(|v| v.to_bits() == 1), "{mask:?}");
        let ids = synthetic_input(plan, input("ids"), 3);
        assert!(ids.iter().all(|v| v.to_bits() < 11));
        assert!(ids.iter().any(|v| v.to_bits() > 1));
    }

    /// The bytes each buffer starts from are those the CPU executor's arena holds after its
    /// own initialization, for every dtype a buffer can have.
    #[test]
    fn per_buffer_values_are_the_cpu_executors_arena() {
        for (precision, masters) in [
            (Precision::Fp32, true),
            (Precision::Bf16, false),
            (Precision::Fp16, true),
        ] {
            let plan = mlp(precision, masters);
            let mut cpu = CpuExecutor::new(&plan).expect("executor");
            cpu.init_params(7).expect("init");
            cpu.synthetic_inputs(7).expect("inputs");
            let plan = plan.plan();
            let dtype = |b: BufferId| plan.buffers[b.index()].ty.dtype;
            let mut seen = 0;
            for (b, values) in persistent(plan, 7, RankIndex::FIRST) {
                assert_eq!(
                    lowp::to_bytes(dtype(b), &values),
                    lowp::to_bytes(dtype(b), &cpu.read(b)),
                    "{}",
                    plan.buffers[b.index()].name
                );
                seen += 1;
            }
            assert_eq!(seen, plan.params.len() + plan.optim_state.len());
            assert!(plan.params.iter().any(|p| dtype(p.buffer) != DType::F32) || masters);
            for (b, values) in synthetic_inputs(plan, 7) {
                let bound = cpu.bound(b).expect("bound input");
                assert_eq!(
                    lowp::to_bytes(dtype(b), &values),
                    lowp::to_bytes(dtype(b), bound)
                );
            }
        }
    }
}
