//! Every launch over a tensor larger than 1 MiB fills an H100: at least one block for each
//! of its 132 streaming multiprocessors, in the CUDA plans of every example at its real size
//! (as written), in bf16 and fp32, and of a Llama-7B rank under ZeRO-3. A finishing launch of a two-stage reduction is exempt: it sums
//! the first stage's per-block partials.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use memc::codegen::gemm::Call;
use memc::ir::{Op, TensorType};
use memc::parallel::Parallel;
use memc::settings::Precision;
use memc::Options;
use std::collections::BTreeSet;

/// Streaming multiprocessors of an H100 SXM.
const SMS: u64 = 132;
const MIB: u64 = 1 << 20;

/// Blocks of a grid.
fn blocks(grid: &[u32; 3]) -> u64 {
    grid.iter().map(|&d| u64::from(d)).product()
}

/// The launches of `model`'s CUDA plan that take fewer blocks than [`SMS`] in a step whose
/// largest tensor is over 1 MiB, one line each (collectives are NCCL's, not kernels).
fn underfilled(model: &str, precision: Precision, parallel: Option<Parallel>) -> BTreeSet<String> {
    let options = Options {
        precision: Some(precision),
        target: memc::plan::Target::CUDA_MIN,
        parallel,
        ..Options::default()
    };
    let c = common::compiled_with(&common::example(model), &options);
    let plan = c.plan.plan();
    let mut found = BTreeSet::new();
    for step in &plan.steps {
        if !plan.launches(step) || plan.placement(step) != memc::plan::Placement::Device {
            continue;
        }
        let ty = |b: &memc::plan::BufferId| plan.buffers[b.index()].ty.clone();
        let inputs: Vec<TensorType> = step.inputs.iter().map(ty).collect();
        let refs: Vec<&TensorType> = inputs.iter().collect();
        let output = match &step.output {
            Some(b) => ty(b),
            None => memc::ir::infer::infer(&step.op, &refs).unwrap(),
        };
        let collective = matches!(
            step.op,
            Op::AllReduce { .. }
                | Op::ReduceScatter { .. }
                | Op::AllGather { .. }
                | Op::AllGatherInto { .. }
        );
        let kernel = match memc::codegen::kernel_for(&step.op, &inputs, &output) {
            Ok(Some(kernel)) => kernel,
            Ok(None) => continue,
            // NCCL's, not a kernel of the plan.
            Err(_) if collective => continue,
            Err(e) => panic!("{model}: {e}"),
        };
        let largest = step
            .inputs
            .iter()
            .chain(&step.output)
            .map(|b| plan.buffers[b.index()].bytes)
            .max()
            .unwrap_or(0);
        if largest <= MIB {
            continue;
        }
        let mut grids = Vec::new();
        if kernel.library.is_empty() {
            grids.push(kernel.grid);
        }
        for call in &kernel.library {
            if let Call::Launch {
                grid,
                finishes: false,
                ..
            } = call
            {
                grids.push(*grid);
            }
        }
        for grid in grids {
            if blocks(&grid) < SMS {
                found.insert(format!(
                    "{model} {precision:?}: {} ({}) over {largest} bytes launches {grid:?}",
                    kernel.name,
                    step.op.name()
                ));
            }
        }
    }
    found
}

#[test]
fn every_launch_over_a_large_tensor_fills_an_h100() {
    let mut found = Vec::new();
    for model in [
        "gpt2",
        "llama7b",
        "mlp",
        "resnet18",
        "sd_unet",
        "unet",
        "unet3d",
        "unet3d_tileable",
    ] {
        for precision in [Precision::Bf16, Precision::Fp32] {
            found.extend(underfilled(model, precision, None));
        }
    }
    // A rank of Llama-7B under ZeRO-3 keeps the head's backward ops apart: its input
    // gradient walks chunks of 131 rows.
    let zero3 = Parallel {
        data: 8,
        zero: 3,
        ..Parallel::default()
    };
    found.extend(underfilled("llama7b", Precision::Bf16, Some(zero3)));
    assert!(found.is_empty(), "{}", Vec::from_iter(found).join("\n"));
}
