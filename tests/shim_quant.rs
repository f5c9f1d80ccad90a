//! The dequantize kernels through the g++ host shim against the CPU backend, bit for bit:
//! dequantization is exact arithmetic on the stored codes (separately rounded products and
//! sums), so the only rounding is the store into the output's precision, the same on both.
//! Without g++ the test prints SKIP.
#![allow(
    clippy::panic,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used
)]

mod cuda_cases;
// The op-case helpers this file does not use.
#[allow(dead_code)]
mod shim_harness;

use cuda_cases::quant::{quant_cases, QuantCase};
use memc::exec::cpu::CpuExecutor;
use memc::exec::kernels::rng;
use memc::ir::{Graph, Init, Op, Phase};
use memc::ops::quant::pack;
use memc::plan::{build, verify, BuildOptions};
use shim_harness::*;
use std::path::Path;

/// Weights of a few magnitudes (blocks and channels of different absmaxes), exact in f32.
fn weights(case: &QuantCase) -> Vec<f32> {
    (0..case.quant.numel())
        .map(|i| rng::normal01(17, 0, i) * (1.0 + (i / 64 % 5) as f32))
        .collect()
}

/// The CPU backend's dequantized weight: a plan of one frozen quantized parameter written
/// with `values` (packed by the executor) and dequantized into the output.
fn cpu_dequantized(case: &QuantCase, values: &[f32]) -> Vec<f32> {
    let mut g = Graph::new();
    let param = Op::Param {
        name: "w".into(),
        ty: case.input.clone(),
        init: Init::Zeros,
        frozen: true,
        buffer: false,
    };
    let p = g.add(param, vec![], &origin(Phase::Forward)).unwrap();
    let w = g
        .add(case.op.clone(), vec![p], &origin(Phase::Forward))
        .unwrap();
    g.outputs.push(("out".to_string(), w));
    let options = BuildOptions {
        optimizer_in_backward: false,
        layout_time: std::time::Duration::from_millis(10),
        alignment: ALIGN,
        pipeline: None,
    };
    let plan = verify(build("case", &g, None, &options).unwrap()).unwrap();
    assert_eq!(plan.plan().params[0].quant, Some(case.quant));
    let mut ex = CpuExecutor::new(&plan).unwrap();
    ex.write(plan.plan().params[0].buffer, values).unwrap();
    ex.run_step(None).unwrap();
    ex.output("out").unwrap().into_owned()
}

fn run_case(case: &QuantCase, dir: &Path) -> Result<(), String> {
    let values = weights(case);
    let packed = pack::pack(&case.quant, &values)?;
    let want = cpu_dequantized(case, &values);
    let exe = compile(&case.kernel, dir)?;
    let arena = dir.join(format!("{}.arena", case.kernel.name));
    let bytes: Vec<f32> = packed.iter().map(|&b| f32::from(b)).collect();
    let run = |reverse| {
        shim_run(
            &exe,
            &case.kernel,
            (std::slice::from_ref(&case.input), &case.output),
            std::slice::from_ref(&bytes),
            &[],
            &arena,
            reverse,
            0,
        )
    };
    let got = run(false)?;
    if run(true)?.bits() != got.bits() {
        return Err("the result depends on the order of threads or blocks".into());
    }
    let got = got.output.ok_or("no output")?;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    if bits(&got) != bits(&want) {
        let first = (got.iter().zip(&want)).position(|(g, w)| g.to_bits() != w.to_bits());
        return Err(format!("differs from the CPU backend first at {first:?}"));
    }
    Ok(())
}

#[test]
fn dequantize_kernels_equal_the_cpu_backend_bitwise() {
    if let Some(why) = gxx_missing() {
        println!("SKIP: {why}");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = quant_cases();
    let results = par_map(&cases, |c| run_case(c, dir.path()));
    let failures: Vec<String> = (cases.iter().zip(&results))
        .filter_map(|(c, r)| r.as_ref().err().map(|e| format!("{}: {e}", c.label)))
        .collect();
    println!(
        "{} dequantize kernels equal the CPU backend bit for bit",
        cases.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
