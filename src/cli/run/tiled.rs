//! `memc run --tile`: the window's plan run over every tile of whole inputs on the CPU
//! reference backend (training steps accumulated over the tiles, or inference into whole
//! outputs that `--dump` writes).

use super::{dump_file, plain, read_file, show_loss, RunArgs};
use crate::cli::Failure;
use memc::exec::cpu::CpuExecutor;
use memc::exec::io::{read_npy, TensorData};
use memc::ir::DType;
use memc::tiling::run::{infer, train, Tensor};
use memc::tiling::{Tiling, KEPT};
use std::path::Path;

/// Runs `args` over tiles; refuses the options a tiled run does not take.
pub fn run(args: &RunArgs) -> Result<(), Failure> {
    for (given, flag) in [
        (args.compile.device != "cpu", "--device cuda"),
        (args.params.is_some(), "--params"),
        (args.load_state.is_some(), "--load-state"),
        (args.save_params.is_some(), "--save-params"),
        (args.save_state.is_some(), "--save-state"),
        (args.save_adapters.is_some(), "--save-adapters"),
        (args.profile, "--profile"),
    ] {
        if given {
            return Err(Failure::Plain(format!(
                "{flag} does not apply to a tiled run (--tile runs on the CPU backend from seeded parameters)"
            )));
        }
    }
    let (compiled, tiling) = crate::cli::tile::tiled(&args.compile)?;
    let plan = compiled.plan;
    if plan.plan().report.parallel.is_some() {
        return Err(Failure::Plain(
            "a tiled run runs one rank's windows; drop --parallel (or run the plan without --tile)"
                .into(),
        ));
    }
    let mut ex = CpuExecutor::new(&plan).map_err(plain)?;
    ex.set_seed(args.seed);
    ex.init_params(args.seed).map_err(plain)?;
    let inputs = whole_inputs(args, &ex, &tiling)?;
    if plan.plan().train.is_some() {
        for step in 1..=args.steps {
            let loss = train(&mut ex, &plan, &tiling, &inputs).map_err(plain)?;
            show_loss(None, step, loss)?;
        }
        return Ok(());
    }
    if args.steps > 1 {
        return Err(Failure::Plain(
            "an inference plan runs one step; drop --steps".into(),
        ));
    }
    for (name, out) in infer(&mut ex, &plan, &tiling, &inputs).map_err(plain)? {
        eprintln!(
            "output {name}: {:?} over {} tiles",
            out.shape,
            tiling.count()
        );
        if let Some(dir) = &args.dump {
            std::fs::create_dir_all(dir)
                .map_err(|e| Failure::Plain(format!("cannot create {}: {e}", dir.display())))?;
            dump_file(dir, &format!("output.{name}.npy"), &out.shape, &out.data)?;
        }
    }
    Ok(())
}

/// Every input over the whole input, `accumulate` micro-batches of it for a training step:
/// from `--input NAME=FILE.npy` (micro-batches one after another along the first axis, as
/// `memc run` reads them), else seeded synthetic values drawn as `memc run` draws them.
fn whole_inputs(
    args: &RunArgs,
    ex: &CpuExecutor,
    t: &Tiling,
) -> Result<Vec<(String, Tensor)>, Failure> {
    let plan = ex.plan();
    let mut out = Vec::new();
    for (k, binding) in plan.inputs.iter().enumerate() {
        if binding.name == KEPT {
            continue;
        }
        let window = &plan.buffers[binding.buffer.index()].ty;
        let shape = t.input_shape(t.input_dims(&binding.name), &window.shape);
        let mut stacked = shape.clone();
        if let Some(first) = stacked.first_mut() {
            *first *= t.accumulate;
        }
        let ty = memc::ir::TensorType::new(window.dtype, stacked);
        let file = args.inputs.iter().find_map(|s| {
            s.split_once('=')
                .filter(|(n, _)| *n == binding.name)
                .map(|(_, f)| f)
        });
        let data = match file {
            Some(file) => from_npy(file, &ty)?,
            None => memc::init::synthetic_values(binding, &ty, ty.numel(), (k, args.seed)),
        };
        out.push((binding.name.clone(), Tensor { shape, data }));
    }
    Ok(out)
}

/// The values of `file`, which must hold a tensor of type `want` (ids as bit patterns).
fn from_npy(file: &str, want: &memc::ir::TensorType) -> Result<Vec<f32>, Failure> {
    let data = read_npy(&read_file(Path::new(file))?)
        .map_err(|e| Failure::Plain(format!("{file}: {e}")))?;
    match (data, want.dtype) {
        (TensorData::F32(shape, v), DType::F32) if shape == want.shape => Ok(v),
        (TensorData::I32(shape, v), DType::I32) if shape == want.shape => {
            Ok(v.iter().map(|&i| f32::from_bits(i as u32)).collect())
        }
        (TensorData::F32(shape, _) | TensorData::I32(shape, _), _) => Err(Failure::Plain(format!(
            "{file}: {shape:?} is not the whole input the tiles cut, {want}"
        ))),
    }
}
