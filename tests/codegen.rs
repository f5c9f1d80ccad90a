//! CPU-only checks of the generated kernels: every op variant yields a well-formed kernel.
#![allow(
    clippy::panic,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used
)]

mod cuda_cases;

use cuda_cases::*;
use memc::codegen::{cast_kernel, kernel_for, KernelParam};
use memc::ir::*;
use std::collections::HashMap;

#[test]
fn every_case_generates_a_wellformed_kernel() {
    let mut by_name: HashMap<String, String> = HashMap::new();
    for KernelCase {
        label, kernel: k, ..
    } in kernel_cases()
    {
        assert_eq!(k.params[0], KernelParam::Arena, "{label}");
        if !k.has_code() {
            // Library calls alone: at least one, every one a GEMM.
            assert!(!k.library.is_empty(), "{label}");
            assert!(
                k.library
                    .iter()
                    .all(|c| matches!(c, memc::codegen::gemm::Call::Gemm(_))),
                "{label}"
            );
            continue;
        }
        let sig = k
            .source
            .lines()
            .find(|l| l.contains(&k.entry))
            .unwrap_or_default();
        assert_eq!(
            sig.matches("u64 ").count() + 1,
            k.params.len(),
            "{label}: {sig}"
        );
        assert!(k.grid.iter().chain(&k.block).all(|&d| d >= 1), "{label}");
        assert!(
            k.block[0] <= 1024 && k.block[0].is_multiple_of(16),
            "{label}"
        );
        if let Some(prev) = by_name.insert(k.name.clone(), k.source.clone()) {
            assert_eq!(prev, k.source, "{label}: name collision");
        }
    }
}

#[test]
fn source_ops_have_no_kernel() {
    let ty = t(DType::F32, &[3]);
    for op in [
        Op::Input {
            name: "x".into(),
            ty: ty.clone(),
        },
        Op::OptimState {
            name: "m".into(),
            ty: ty.clone(),
            init: 0.0,
        },
    ] {
        assert_eq!(kernel_for(&op, &[], &ty), Ok(None));
    }
}

#[test]
fn mismatched_output_is_an_error() {
    let x = t(DType::F32, &[2, 3]);
    let wrong = t(DType::F32, &[3, 2]);
    assert!(kernel_for(&Op::Unary(UnaryFn::Exp), std::slice::from_ref(&x), &wrong).is_err());
    assert!(kernel_for(&Op::Unary(UnaryFn::Exp), &[], &x).is_err());
    assert!(kernel_for(
        &Op::Conv2dBackwardInput {
            conv: ConvParams {
                stride: [1, 1],
                padding: [0, 0],
                dilation: [1, 1],
                groups: 1
            },
            input: [3, 3],
        },
        &[x.clone(), x.clone()],
        &x
    )
    .is_err());
}

#[test]
fn optimizer_clip_coefficient_must_be_f32() {
    let h = t(DType::F16, &[10]);
    let adam = Op::AdamW(adamw(0.0));
    let empty = t(DType::F32, &[0]);
    for (clip, ok) in [(DType::F32, true), (DType::F16, false)] {
        let inputs = vec![h.clone(), h.clone(), h.clone(), h.clone(), t(clip, &[])];
        assert_eq!(kernel_for(&adam, &inputs, &empty).is_ok(), ok, "{clip}");
    }
}

#[test]
fn conv_gradients_must_match_the_forward_output() {
    let conv = ConvParams {
        stride: [2, 1],
        padding: [1, 1],
        dilation: [1, 2],
        groups: 2,
    };
    let w = t(DType::F32, &[6, 2, 3, 3]);
    let x = t(DType::F32, &[2, 4, 9, 9]);
    let bwd_in = Op::Conv2dBackwardInput {
        conv,
        input: [9, 9],
    };
    let bwd_w = Op::Conv2dBackwardWeight {
        conv,
        kernel: [3, 3],
    };
    // The forward output is [2, 6, 5, 7]; a [2, 6, 5, 5] gradient is refused.
    for dy in [[2, 6, 5, 7], [2, 6, 5, 5]] {
        let dy = t(DType::F32, &dy);
        let ok = dy.shape[3] == 7;
        let refs = [&dy, &w];
        assert_eq!(infer::infer(&bwd_in, &refs).is_ok(), ok, "{dy}");
        let refs = [&x, &dy];
        assert_eq!(infer::infer(&bwd_w, &refs).is_ok(), ok, "{dy}");
    }
}

#[test]
fn distinct_shapes_get_distinct_names_and_casts_are_keyed_by_dtype() {
    let a = cast_kernel(DType::F32, DType::F16, 100);
    let b = cast_kernel(DType::F32, DType::BF16, 100);
    let c = cast_kernel(DType::F32, DType::F16, 101);
    assert_ne!(a.name, b.name);
    assert_ne!(a.name, c.name);
    assert_eq!(a, cast_kernel(DType::F32, DType::F16, 100));
    assert!(a.name.starts_with("cast_"));
}
