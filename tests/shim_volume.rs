//! Whole training steps through the g++ host shim, kernel by kernel in plan order, against
//! the CPU backend: a tiny 3-D UNet (`examples/unet3d.mdl` on an 8^3 volume with 4 base
//! channels: 3-D convolutions, transposed convolutions, 3-D pooling, batch norm over NCDHW,
//! concatenated skips, the per-voxel cross-entropy) in fp32, and every volume op in one
//! shallow model (`common::VOLUME_OPS`) in fp32, bf16 and fp16. The UNet stays in fp32: its
//! batch norms at 1^3 to 2^3 voxels carry the 16-bit kernels' one-ulp differences from the
//! CPU's (each step agrees on the same inputs) to several units of the format's tolerance by
//! the first layer's gradient. Without g++ the test prints SKIP.
#![allow(
    clippy::panic,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used
)]

mod common;
mod cuda_cases;
// The op-case helpers this file does not use.
#[allow(dead_code)]
mod shim_harness;
#[allow(dead_code)]
mod shim_steps;

use memc::front::train::Precision;
use memc::ir::DType;
use shim_harness::gxx_missing;
use shim_steps::{example, training_step_matches};

#[test]
fn volume_training_steps_through_the_shim_match_the_cpu_backend() {
    if let Some(why) = gxx_missing() {
        println!("SKIP: {why}");
        return;
    }
    // B = 2: the batch norms that train need more than one value per channel at 1^3. The
    // bottleneck's norms then normalize two values each, so their 1/sqrt(var + eps) (up to
    // 316) magnifies the last-bit differences of the two backends' fp32 sums: every kernel
    // still agrees within the fp32 tolerance on the same inputs, but the whole step's
    // gradients are held to bf16's (a bias of the first block ends 1.2e-4 of its tensor's
    // largest gradient apart).
    let dims = [("B", 2), ("S", 8), ("F", 4)];
    let unet = example("unet3d", &dims, Precision::Fp32);
    training_step_matches("unet3d", &unet, DType::BF16);
    for (precision, tolerance) in [
        (Precision::Fp32, DType::F32),
        (Precision::Bf16, DType::BF16),
        (Precision::Fp16, DType::F16),
    ] {
        let options = memc::Options {
            precision: Some(precision),
            ..memc::Options::default()
        };
        let c = common::compiled_with(common::VOLUME_OPS, &options);
        training_step_matches(&format!("volume ops {precision:?}"), &c, tolerance);
    }
}
