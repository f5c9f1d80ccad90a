//! A plan's estimated step time on a GPU: every launching step through the roofline of
//! `model.rs`, summed over a whole training step (forward and backward once per
//! micro-batch, updates once), with a breakdown by op kind and by bound.

use super::{Bound, Gpu, Work, LAUNCH_OVERHEAD_S};
use crate::plan::{grouped, human_bytes, Plan};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

/// The estimated time of one training (or inference) step of a plan on a GPU. An estimate
/// from datasheet peaks and stated efficiencies, never a measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// The GPU estimated on.
    pub gpu: Gpu,
    /// The whole step: `compute_bound_seconds + memory_bound_seconds + launch_seconds`, plus
    /// the extra time of offload when the plan has copies and of page faults when its arena
    /// is in unified memory.
    pub seconds: f64,
    /// Time of the launches whose FLOPs take longer than their bytes (launch overhead apart).
    pub compute_bound_seconds: f64,
    /// Time of the other launches (launch overhead apart).
    pub memory_bound_seconds: f64,
    /// Kernel launches per step times the per-launch overhead.
    pub launch_seconds: f64,
    /// Kernel launches per step (steps that only view their input launch nothing).
    pub launches: u64,
    /// Of those, launches on tensor cores: 16-bit library GEMMs and MMA kernels.
    pub tensor_core_launches: u64,
    /// FLOPs per step, every micro-batch counted.
    pub flops: u64,
    /// Bytes the launches move per step.
    pub bytes: u64,
    /// Time per op kind, most first.
    pub by_op: Vec<OpTime>,
    /// Every launching step on the device, in plan order, one launch each.
    pub steps: Vec<StepTime>,
    /// What an offloaded plan's copies and host updates add (included in `seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload: Option<super::OffloadTime>,
    /// What unified memory's page faults add on this GPU (included in `seconds`), for a plan
    /// with `report.unified`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<f64>,
}

/// The estimate of one launch of one plan step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepTime {
    /// Index of the step in [`Plan::steps`].
    pub step: usize,
    /// The op's kernel name.
    pub op: String,
    /// FLOPs of one launch.
    pub flops: u64,
    /// Bytes one launch moves.
    pub bytes: u64,
    /// Which limit its time comes from.
    pub bound: Bound,
    /// Its time, launch overhead included.
    pub seconds: f64,
}

/// The estimated time of every launch of one op kind in a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpTime {
    /// The op's kernel name (`matmul`, `binary`, ...).
    pub op: String,
    /// Its launches per step.
    pub launches: u64,
    /// Their time, launch overhead included.
    pub seconds: f64,
    /// Of that, the bound part of its compute-bound launches.
    pub compute_bound_seconds: f64,
}

/// The estimated time of one step of `plan` on `gpu`: each step that launches a kernel
/// ([`Plan::launches`]) on the device costs [`Work::time`] on its buffers' types plus the
/// launch overhead; forward and backward steps run once per micro-batch, updates once; an
/// offloaded plan's copies and host updates add [`super::OffloadTime::extra_seconds`].
pub fn estimate(plan: &Plan, gpu: Gpu) -> Estimate {
    let spec = gpu.spec();
    let mut e = Estimate {
        gpu,
        seconds: 0.0,
        compute_bound_seconds: 0.0,
        memory_bound_seconds: 0.0,
        launch_seconds: 0.0,
        launches: 0,
        tensor_core_launches: 0,
        flops: 0,
        bytes: 0,
        by_op: Vec::new(),
        steps: Vec::new(),
        offload: None,
        page_faults: None,
    };
    let mut by_op: BTreeMap<&str, OpTime> = BTreeMap::new();
    let ty = |b: crate::plan::BufferId| plan.buffers.get(b.index()).map(|b| &b.ty);
    for (index, step) in plan.steps.iter().enumerate() {
        if !plan.launches(step) || plan.placement(step) != crate::plan::Placement::Device {
            continue;
        }
        let inputs: Vec<_> = step.inputs.iter().filter_map(|&b| ty(b)).collect();
        let workspace = step
            .workspace
            .and_then(|b| plan.buffers.get(b.index()))
            .map_or(0, |b| b.bytes);
        let output = step.output.and_then(ty);
        let work = Work::new(&step.op, step.flops, &inputs, output, workspace);
        let time = work.time(spec);
        let repeats = u64::from(plan.runs(step.phase));
        let n = repeats as f64;
        let bound = n * time.bound_seconds();
        let compute_bound = if time.bound == Bound::Compute {
            e.compute_bound_seconds += bound;
            bound
        } else {
            e.memory_bound_seconds += bound;
            0.0
        };
        e.launches += repeats;
        e.tensor_core_launches += if work.on_tensor_cores() { repeats } else { 0 };
        e.flops += repeats * work.flops;
        e.bytes += repeats * work.bytes;
        let op = by_op.entry(step.op.name()).or_insert_with(|| OpTime {
            op: step.op.name().to_string(),
            launches: 0,
            seconds: 0.0,
            compute_bound_seconds: 0.0,
        });
        op.launches += repeats;
        op.seconds += n * time.seconds();
        op.compute_bound_seconds += compute_bound;
        e.steps.push(StepTime {
            step: index,
            op: step.op.name().to_string(),
            flops: work.flops,
            bytes: work.bytes,
            bound: time.bound,
            seconds: time.seconds(),
        });
    }
    e.launch_seconds = e.launches as f64 * LAUNCH_OVERHEAD_S;
    e.offload = super::offload::offload_time(plan, gpu, &e.steps);
    let extra = e.offload.as_ref().map_or(0.0, |o| o.extra_seconds);
    e.page_faults = (plan.report.unified.as_ref()).map(|u| u.fault_seconds(gpu));
    let faults = e.page_faults.unwrap_or(0.0);
    e.seconds =
        e.compute_bound_seconds + e.memory_bound_seconds + e.launch_seconds + extra + faults;
    e.by_op = by_op.into_values().collect();
    e.by_op.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    e
}

/// Op kinds the text report lists.
const TOP_OPS: usize = 8;

/// `12.345 ms`: seconds as milliseconds.
pub fn ms(seconds: f64) -> String {
    format!("{:.3} ms", seconds * 1e3)
}

/// The estimate's lines of the text report on `plan`: its arena is compared with the GPU's
/// memory, and a plan built for the CPU is said to count the CPU's kernel scratch.
pub fn render_text(out: &mut String, e: &Estimate, plan: &Plan) {
    let arena = plan.arena_bytes;
    let spec = e.gpu.spec();
    let pct = |s: f64| 100.0 * s / e.seconds.max(f64::MIN_POSITIVE);
    let _ = writeln!(
        out,
        "  estimated step time on {} ({} SMs): {} (an estimate from datasheet peaks, not a measurement)",
        spec.name,
        spec.sms,
        ms(e.seconds)
    );
    if let Some(faults) = e.page_faults {
        let _ = writeln!(
            out,
            "    of which unified memory's page faults: {} (below)",
            ms(faults)
        );
    }
    let _ = writeln!(
        out,
        "    compute-bound {} ({:.1}%), memory-bound {} ({:.1}%), launch overhead {} ({:.1}%) over {} launches",
        ms(e.compute_bound_seconds),
        pct(e.compute_bound_seconds),
        ms(e.memory_bound_seconds),
        pct(e.memory_bound_seconds),
        ms(e.launch_seconds),
        pct(e.launch_seconds),
        grouped(e.launches)
    );
    let _ = writeln!(
        out,
        "    {:.3} GFLOP, {} moved; {} of {} launches on tensor cores",
        e.flops as f64 / 1e9,
        human_bytes(e.bytes),
        grouped(e.tensor_core_launches),
        grouped(e.launches)
    );
    let fits = if arena <= spec.memory {
        "fits in"
    } else {
        "does NOT fit in"
    };
    let _ = writeln!(
        out,
        "    arena {} {fits} its {}",
        human_bytes(arena),
        human_bytes(spec.memory)
    );
    if plan.target == crate::plan::Target::Cpu {
        let _ = writeln!(
            out,
            "    (a plan for the CPU: its kernel scratch is counted; --device cuda plans for the GPU)"
        );
    }
    for o in e.by_op.iter().take(TOP_OPS) {
        let bound = if 2.0 * o.compute_bound_seconds > o.seconds {
            "mostly compute-bound"
        } else {
            "mostly memory- or launch-bound"
        };
        let _ = writeln!(
            out,
            "    {:<36} {:>6} launches {:>12} {:>5.1}%  {bound}",
            o.op,
            grouped(o.launches),
            ms(o.seconds),
            pct(o.seconds)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{LIBRARY_FP32_EFFICIENCY, MEMORY_EFFICIENCY};
    use crate::ir::Phase;
    use crate::{compile, Options};

    /// A 512 x 512 fp32 matmul and an add of its result with `a`, on the CUDA target.
    const MATMUL_ADD: &str = "model m {
  dim N = 512
  input a: [N, N]
  input b: [N, N]
  output y = a @ b + a
}";

    fn plan(src: &str, gpu: Option<Gpu>) -> crate::plan::Plan {
        let options = Options {
            target: crate::plan::Target::CUDA_MIN,
            gpu,
            ..Options::default()
        };
        match compile(src, &options) {
            Ok(c) => c.plan.plan().clone(),
            Err(e) => unreachable!("{e:?}"),
        }
    }

    #[test]
    fn a_matmul_and_an_add_cost_their_flops_and_bytes_plus_two_launches() {
        let p = plan(MATMUL_ADD, Some(Gpu::H100));
        let e = estimate(&p, Gpu::H100);
        assert_eq!(
            p.report.estimate.as_ref(),
            Some(&e),
            "--gpu fills the report"
        );
        let n = 512f64;
        let matrix = 4.0 * n * n;
        // The matmul is a cuBLASLt GEMM: fp32 at cuBLAS's share of the FMA peak.
        let h100 = Gpu::H100.spec();
        let matmul = 2.0 * n * n * n / (h100.fp32 * LIBRARY_FP32_EFFICIENCY);
        let add = 3.0 * matrix / (3.35e12 * MEMORY_EFFICIENCY);
        let gemm_bytes = 3.0 * matrix + crate::ops::matmul::GEMM_WORKSPACE as f64;
        assert!(matmul > gemm_bytes / (3.35e12 * MEMORY_EFFICIENCY));
        assert_eq!(e.launches, 2);
        // fp32 GEMMs run on the FMA units (no TF32).
        assert_eq!(e.tensor_core_launches, 0);
        assert_eq!(e.flops, 2 * 512 * 512 * 512 + 512 * 512);
        // The matmul's cuBLASLt workspace counts as moved.
        let workspace = crate::ops::matmul::GEMM_WORKSPACE;
        assert_eq!(e.bytes, 6 * 512 * 512 * 4 + workspace);
        assert_eq!(e.compute_bound_seconds, matmul);
        assert_eq!(e.memory_bound_seconds, add);
        assert_eq!(e.launch_seconds, 2.0 * LAUNCH_OVERHEAD_S);
        assert_eq!(e.seconds, matmul + add + 2.0 * LAUNCH_OVERHEAD_S);
        let ops: Vec<(&str, u64)> = e
            .by_op
            .iter()
            .map(|o| (o.op.as_str(), o.launches))
            .collect();
        assert_eq!(ops, [("matmul", 1), ("binary", 1)]);
        assert_eq!(e.by_op[0].seconds, matmul + LAUNCH_OVERHEAD_S);
        assert_eq!(e.by_op[1].compute_bound_seconds, 0.0);
        let steps: Vec<(&str, u64, Bound)> = e
            .steps
            .iter()
            .map(|s| (s.op.as_str(), s.bytes, s.bound))
            .collect();
        let matrix_bytes = 512 * 512 * 4;
        assert_eq!(
            steps,
            [
                ("matmul", 3 * matrix_bytes + workspace, Bound::Compute),
                ("binary", 3 * matrix_bytes, Bound::Memory)
            ]
        );
        assert_eq!(e.steps[1].seconds, add + LAUNCH_OVERHEAD_S);
    }

    #[test]
    fn no_gpu_leaves_the_report_without_an_estimate_and_its_json_unchanged() {
        let p = plan(MATMUL_ADD, None);
        assert_eq!(p.report.estimate, None);
        let json = serde_json::to_string(&p.report).unwrap_or_default();
        assert!(
            json.contains("\"flops\"") && !json.contains("estimate"),
            "{json}"
        );
    }

    #[test]
    fn forward_and_backward_run_once_per_micro_batch_and_updates_once() {
        let src = include_str!("../../examples/mlp.mdl");
        let one = plan(src, None);
        let with = |n: u32| Options {
            accumulate: Some(n),
            target: crate::plan::Target::CUDA_MIN,
            ..Options::default()
        };
        let four = match compile(src, &with(4)) {
            Ok(c) => c.plan.plan().clone(),
            Err(e) => unreachable!("{e:?}"),
        };
        let per_micro = four
            .steps
            .iter()
            .filter(|s| four.launches(s) && s.phase != Phase::Update)
            .count() as u64;
        let updates = four
            .steps
            .iter()
            .filter(|s| four.launches(s) && s.phase == Phase::Update)
            .count() as u64;
        let e = estimate(&four, Gpu::A100);
        assert_eq!(e.launches, 4 * per_micro + updates);
        assert!(estimate(&one, Gpu::A100).launches < e.launches);
        let faster = estimate(&four, Gpu::H200);
        assert!(faster.seconds < e.seconds, "{faster:?} vs {e:?}");
    }
}
