//! Whole training steps through the g++ host shim: a plan's kernels launched one by one in
//! plan order over one arena, each step checked against the CPU backend's kernel on the same
//! inputs, then the loss, the gradients and the updated parameters against a CPU step
//! (tolerances as `tests/shim.rs` states them).

use crate::common;
use crate::shim_harness::cases::compare_results;
use crate::shim_harness::*;
use memc::codegen::{plan_kernel_uses, KernelParam};
use memc::front::train::Precision;
use memc::ir::{DType, Op, TensorType};
use memc::plan::{Plan, Target};
use std::collections::HashMap;
use std::path::Path;

/// An example model compiled with the given dims (the loss head fused).
pub fn example(name: &str, dims: &[(&str, i64)], precision: Precision) -> memc::Compiled {
    example_fused(name, dims, precision, true)
}

/// An example model compiled with the given dims, its loss head fused or not.
pub fn example_fused(
    name: &str,
    dims: &[(&str, i64)],
    precision: Precision,
    fuse_loss: bool,
) -> memc::Compiled {
    let path = format!("{}/examples/{name}.mdl", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(&path).expect("example");
    common::compiled_with(
        &src,
        &memc::Options {
            overrides: dims.iter().map(|&(k, v)| (k.to_string(), v)).collect(),
            precision: Some(precision),
            fuse_loss,
            ..Default::default()
        },
    )
}

/// A whole plan step run through the shim.
pub struct PlanRun {
    /// Each parameter's gradient as read just before its update.
    pub grads: HashMap<String, Vec<f32>>,
    /// The largest error ratio of one step's results against the CPU backend's kernel on
    /// the same inputs, and which step.
    pub worst_step: (f32, String),
    /// Distinct kernels launched.
    pub kernels: usize,
}

/// Runs every step of `plan` in order through the shim over `arena` (in place, as a file in
/// `dir`), checking each step against the CPU backend's kernel on the same inputs.
pub fn shim_plan_step(plan: &Plan, arena: &mut Vec<u8>, dir: &Path) -> Result<PlanRun, String> {
    let uses = plan_kernel_uses(plan).map_err(|e| e.to_string())?;
    let exes = par_map(&uses, |(k, _)| compile(k, dir));
    let mut kernel_of = vec![None; plan.steps.len()];
    for ((kernel, steps), exe) in uses.iter().zip(&exes) {
        let exe = exe.as_ref().map_err(Clone::clone)?;
        for &s in steps {
            kernel_of[s] = Some((kernel, exe));
        }
    }
    // The plan is laid out for the CPU, whose workspaces differ from CUDA's: each kernel's
    // CUDA workspace lies past the arena's end instead (POISON, as a reused one would be).
    let buffer = |b: memc::plan::BufferId| &plan.buffers[b.index()];
    let scratch_at = arena.len() as u64;
    let scratch = plan.steps.iter().map(|step| {
        let types: Vec<&TensorType> = step.inputs.iter().map(|&b| &buffer(b).ty).collect();
        let out = step.output.map(|b| &buffer(b).ty);
        out.map_or(0, |o| Target::CUDA_MIN.workspace_bytes(&step.op, &types, o))
    });
    arena.resize(arena.len() + scratch.max().unwrap_or(0) as usize, POISON);
    let file = dir.join("plan.arena");
    std::fs::write(&file, &*arena).map_err(|e| e.to_string())?;
    let read = |bytes: &[u8], b| {
        let buf = buffer(b);
        get(bytes, buf.offset, buf.ty.dtype, buf.ty.numel() as usize)
    };
    let mut run = PlanRun {
        grads: HashMap::new(),
        worst_step: (0.0, String::new()),
        kernels: uses.len(),
    };
    for (s, step) in plan.steps.iter().enumerate() {
        if !plan.launches(step) {
            continue; // a view: its bytes are its root's
        }
        let types: Vec<TensorType> = step.inputs.iter().map(|&b| buffer(b).ty.clone()).collect();
        let data: Vec<Vec<f32>> = step.inputs.iter().map(|&b| read(arena, b)).collect();
        let stepped = memc::ops::optimizer::stepped(&step.op, &step.inputs);
        for (k, (target, _, _)) in stepped.into_iter().enumerate() {
            let name = plan
                .params
                .iter()
                .find(|p| p.buffer == target)
                .map(|p| p.name.clone())
                .ok_or("update of a non-parameter")?;
            // The gradient follows its parameter: input 1 of a single update, 4k + 1 of a
            // group's k-th parameter.
            run.grads.insert(name, data[4 * k + 1].clone());
        }
        let (kernel, exe) = kernel_of[s].ok_or_else(|| format!("step {s} has no kernel"))?;
        if kernel.table.is_some() {
            put_table(arena, kernel, scratch_at, |i| buffer(step.inputs[i]).offset);
            std::fs::write(&file, &*arena).map_err(|e| e.to_string())?;
        }
        launch(exe, kernel, &file, false, |p| match p {
            KernelParam::Arena => 0,
            KernelParam::Input(i) => buffer(step.inputs[i]).offset,
            KernelParam::Output => step.output.map_or(0, |b| buffer(b).offset),
            KernelParam::Step | KernelParam::Stream => 1,
            KernelParam::MicroStep => 0,
            KernelParam::Workspace => scratch_at,
            KernelParam::Phase | KernelParam::Chunk => 0,
        })?;
        *arena = std::fs::read(&file).map_err(|e| e.to_string())?;
        let got = Results {
            output: step.output.map(|b| read(arena, b)),
            updated: step
                .op
                .mutated_inputs()
                .iter()
                .map(|&i| (i, read(arena, step.inputs[i])))
                .collect(),
        };
        let want = cpu_reference(&step.op, &types, &data, 1);
        let out_ty = step
            .output
            .map_or_else(|| types[0].clone(), |b| buffer(b).ty.clone());
        let (_, ratio) = compare_results((&got, &want), &step.op, &out_ty, &types)
            .map_err(|e| format!("step {s} ({}): {e}", step.op.name()))?;
        if ratio >= run.worst_step.0 {
            run.worst_step = (ratio, format!("step {s} ({})", step.op.name()));
        }
    }
    Ok(run)
}

/// How many times the format's tolerance a gradient may differ by at the end of a whole
/// step. The fused loss head rounds the logits' gradient to the operand type (as its 16-bit
/// GEMM takes it) from fp32 logits whose last bits depend on each backend's GEMM summation
/// order; in fp16 that rounding flips by one ulp often enough for the rest of the backward
/// to carry the difference to about 1.6 units (bf16: 0.000, the unfused fp16 head: 0.000).
/// Every single step still agrees within a few percent of the tolerance on the same inputs.
pub fn end_to_end_slack(tolerance: DType) -> f32 {
    if tolerance == DType::F16 {
        2.0
    } else {
        1.0
    }
}

/// Runs one training step of `c` through the shim, kernel by kernel in plan order over one
/// arena, and checks every step's results against the CPU backend's kernel on the same
/// inputs, then the loss, and the gradients (within `tolerance`) and the updated
/// parameters against a CPU backend step.
pub fn training_step_matches(name: &str, c: &memc::Compiled, tolerance: DType) {
    let start = std::time::Instant::now();
    let plan = c.plan.plan();
    let mut ex = common::executor(c, 5);
    // The arena before the step: parameters, zeroed optimizer state and bound inputs (the
    // CPU plan's buffers are all 4-byte words; ids are stored as their bit patterns); every
    // other byte is POISON, so a kernel reading a buffer before it is written yields NaN.
    let mut arena = vec![POISON; plan.arena_bytes as usize];
    for b in plan
        .params
        .iter()
        .map(|p| p.buffer)
        .chain(plan.inputs.iter().map(|i| i.buffer))
        .chain(plan.optim_state.iter().map(|s| s.buffer))
    {
        let at = plan.buffers[b.index()].offset as usize;
        for (i, w) in ex.read(b).iter().enumerate() {
            arena[at + 4 * i..at + 4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
    }
    let mut want = HashMap::new();
    ex.run_step(Some(&mut |name: &str, g: &[f32]| {
        want.insert(name.to_string(), g.to_vec());
    }))
    .expect("cpu step");
    let dir = tempfile::tempdir().expect("temp dir");
    let run =
        shim_plan_step(plan, &mut arena, dir.path()).unwrap_or_else(|e| panic!("{name}: {e}"));

    let (_, loss_buf) = plan
        .outputs
        .iter()
        .find(|(n, _)| n == "loss")
        .expect("loss");
    let loss_at = plan.buffers[loss_buf.index()].offset;
    let (shim_loss, cpu_loss) = (
        get(&arena, loss_at, DType::F32, 1)[0],
        ex.output("loss").expect("loss")[0],
    );
    // Running statistics take no gradient: after the step they match the CPU backend's
    // within the format's tolerance.
    let (stats, trained): (Vec<_>, Vec<_>) = plan.params.iter().partition(|p| p.running_statistic);
    assert_eq!(
        run.grads.len(),
        trained.len(),
        "{name}: every parameter gets a gradient"
    );
    for p in stats {
        let buf = &plan.buffers[p.buffer.index()];
        let after = get(&arena, buf.offset, DType::F32, buf.ty.numel() as usize);
        let (err, ratio) = compare(&after, &ex.read(p.buffer), tolerance);
        assert!(
            ratio <= end_to_end_slack(tolerance),
            "{name}: running statistic {} differs by {err:e}",
            p.name
        );
    }
    // Gradients: the given format's tolerance. Updated parameters: within lr / 30, where the
    // gradient stands clear of that tolerance's noise floor (twice 10% of the tensor's largest
    // gradient times the format's relative tolerance): AdamW's first step normalizes each
    // element to about ±lr, so an element that is rounding noise (the key bias: softmax
    // ignores a constant shift; a weight gradient summed from 16-bit operands in a different
    // order) may move either way.
    let lr = plan
        .steps
        .iter()
        .find_map(|s| match &s.op {
            Op::AdamW(h) | Op::AdamWGroup { hyper: h, .. } => Some(h.lr),
            Op::Sgd(h) => Some(h.lr),
            _ => None,
        })
        .expect("a training plan has updates");
    let mut worst = (0f32, 0f32, String::new());
    let mut worst_param = (0f32, String::new());
    for p in &trained {
        let (err, ratio) = compare(&run.grads[&p.name], &want[&p.name], tolerance);
        let ratio = ratio / end_to_end_slack(tolerance);
        if ratio >= worst.1 {
            worst = (err, ratio, p.name.clone());
        }
        let buf = &plan.buffers[p.buffer.index()];
        let after = get(&arena, buf.offset, DType::F32, buf.ty.numel() as usize);
        let grad = &want[&p.name];
        let floor = 0.1 * rtol(tolerance) * grad.iter().fold(0f32, |m, g| m.max(g.abs()));
        let perr = after
            .iter()
            .zip(ex.read(p.buffer).iter())
            .zip(grad)
            .filter(|(_, g)| g.abs() > 2.0 * floor)
            .fold(0f32, |m, ((a, b), _)| m.max((a - b).abs()));
        if perr >= worst_param.0 {
            worst_param = (perr, p.name.clone());
        }
    }
    println!(
        "{name}: {} steps, {} kernels; worst {} ({:.3} of the tolerance); loss shim \
         {shim_loss} cpu {cpu_loss}; {} gradients, worst {} (max error {:e}, {:.3} of the \
         tolerance); worst updated parameter {} (max error {:e}); {:.1?}",
        plan.steps.len(),
        run.kernels,
        run.worst_step.1,
        run.worst_step.0,
        trained.len(),
        worst.2,
        worst.0,
        worst.1,
        worst_param.1,
        worst_param.0,
        start.elapsed()
    );
    assert!(
        run.worst_step.0 <= 1.0,
        "{name}: {} differs from the CPU kernel",
        run.worst_step.1
    );
    assert!(
        (shim_loss - cpu_loss).abs() <= 1e-4 * cpu_loss.abs(),
        "{name}: loss {shim_loss} vs {cpu_loss}"
    );
    assert!(
        worst.1 <= 1.0,
        "{name}: gradient of {} off by {:e}",
        worst.2,
        worst.0
    );
    assert!(
        worst_param.0 <= lr / 30.0,
        "{name}: updated {} off by {:e}",
        worst_param.1,
        worst_param.0
    );
}
