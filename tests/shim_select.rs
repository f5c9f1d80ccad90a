//! The selection kernels (extrema, comparisons, `where`, `clamp` and its backward,
//! `reciprocal`) through the g++ host shim against the CPU backend in f32, f16 and bf16,
//! with the tolerances of `tests/shim.rs`, on data drawn in halves so that operands tie.
//! Without g++ the test prints SKIP.
#![allow(
    clippy::panic,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used
)]

mod cuda_cases;
// The helpers of the other shim tests.
#[allow(dead_code)]
mod shim_harness;

use cuda_cases::kernel_cases_of;
use cuda_cases::select::select_cases;
use shim_harness::cases::check_kernel_cases;

#[test]
fn selection_kernels_match_the_cpu_backend_through_the_shim() {
    let cases = kernel_cases_of(select_cases());
    assert_eq!(cases.len(), 3 * select_cases().len());
    check_kernel_cases(&cases);
}
