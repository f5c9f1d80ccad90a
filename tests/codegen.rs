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

/// Every GEMM of every case that calls libraries stays inside the buffers it addresses: each
/// operand's (and bias's) offset plus its extent over the batch is within its input, the
/// output or the step's CUDA workspace (the library's scratch after the kernel's own).
#[test]
fn every_library_gemm_stays_inside_its_buffers() {
    use memc::codegen::gemm::{Addr, Call};
    let mut gemms = 0;
    for case in kernel_cases() {
        let refs: Vec<&TensorType> = case.inputs.iter().collect();
        let workspace = memc::plan::Target::CUDA_MIN.workspace_bytes(&case.op, &refs, &case.output);
        let size = |a: Addr| match a {
            Addr::Input(i, plus) => (case.inputs[i].bytes(), plus),
            Addr::Output(plus) => (case.output.bytes(), plus),
            Addr::Workspace(plus) => (case.kernel.library_workspace_from, plus),
        };
        for call in &case.kernel.library {
            let Call::Gemm(g) = call else { continue };
            gemms += 1;
            let bias = g.epilogue_vector();
            for m in [&g.a, &g.b, &g.d].into_iter().chain(bias.as_ref()) {
                let (limit, at) = size(m.at);
                assert!(
                    at + g.extent_bytes(m) <= limit,
                    "{}: {m:?} of {g:?} past {limit} bytes",
                    case.label
                );
            }
        }
        assert!(
            case.kernel.library_workspace_from <= workspace,
            "{}",
            case.label
        );
    }
    assert!(gemms > 0, "the cases include library GEMMs");
}

/// Attention's backward at a size whose scores exceed one unit's scratch for the query and
/// key gradients (6 heads of 1,024 x 1,024 scores at 12 bytes each: units of 5 heads, then
/// 1; the value gradient's 6 bytes a score fit all 6 heads in one unit): every gradient's
/// GEMMs write each element of the output exactly once.
#[test]
fn attention_backward_units_cover_every_head_once() {
    use memc::codegen::gemm::{Addr, Call};
    let q = TensorType::new(DType::BF16, vec![2, 1024, 48]);
    let attn = AttnParams {
        heads: 6,
        kv_heads: 6,
        causal: true,
        scale: 0.35,
        window: None,
        softcap: None,
        key_mask: false,
    };
    for which in [AttnInput::Q, AttnInput::K, AttnInput::V] {
        let op = Op::AttentionBackward { attn, which };
        let inputs = vec![q.clone(), q.clone(), q.clone(), q.clone()];
        let k = kernel_for(&op, &inputs, &q).unwrap().unwrap();
        let mut written = vec![0u8; q.numel() as usize];
        let mut units = 0;
        for call in &k.library {
            let Call::Gemm(g) = call else { continue };
            let Addr::Output(at) = g.d.at else { continue };
            units += 1;
            let first = at / 2;
            for z in 0..g.batch {
                for c in 0..g.d.cols {
                    for r in 0..g.d.rows {
                        written[(first + z * g.d.stride + c * g.d.ld + r) as usize] += 1;
                    }
                }
            }
        }
        let per_batch = if which == AttnInput::V { 1 } else { 2 };
        assert_eq!(units, 2 * per_batch, "{which:?}: units per batch");
        assert!(written.iter().all(|&w| w == 1), "{which:?}");
    }
}

/// A sliding window bounds the scores attention's backward computes: each unit of rows
/// scores only the keys its rows see, about T x (64 + W) in all for T = 1,024 and W = 32,
/// where plain causal attention scores all T x T; the query gradient's rows are each written
/// once.
#[test]
fn windowed_attention_backward_scores_only_the_window() {
    use memc::codegen::gemm::{Addr, Call};
    let (t, w) = (1024u64, 32);
    // fp32 operands: 16-bit ones run on tensor cores without materialized scores.
    let q = TensorType::new(DType::F32, vec![1, t as usize, 16]);
    let scores = |window, which| {
        let attn = AttnParams {
            heads: 1,
            kv_heads: 1,
            causal: true,
            scale: 0.25,
            window,
            softcap: None,
            key_mask: false,
        };
        let op = Op::AttentionBackward { attn, which };
        let k = kernel_for(&op, &vec![q.clone(); 4], &q).unwrap().unwrap();
        let mut written = vec![0u8; q.numel() as usize];
        let mut n = 0;
        for call in &k.library {
            let Call::Gemm(g) = call else { continue };
            match g.d.at {
                Addr::Workspace(0) => n += g.batch * g.d.rows * g.d.cols,
                Addr::Output(at) => {
                    for c in 0..g.d.cols {
                        for r in 0..g.d.rows {
                            written[(at / 4 + c * g.d.ld + r) as usize] += 1;
                        }
                    }
                }
                _ => {}
            }
        }
        if which == AttnInput::Q {
            assert!(written.iter().all(|&w| w == 1), "{window:?}");
        }
        n
    };
    for which in [AttnInput::Q, AttnInput::K, AttnInput::V] {
        assert_eq!(scores(None, which), t * t);
        let windowed = scores(Some(w as usize), which);
        assert!(windowed <= t * (64 + w), "{which:?}: {windowed} scores");
    }
}

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
        // Whole quarter-warps (the SIMT attention's row tiles go down to 8 rows).
        assert!(
            k.block[0] <= 1024 && k.block[0].is_multiple_of(8),
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
        &Op::ConvBackwardInput {
            conv: ConvParams::uniform(2, 1, 0, 1),
            input: vec![3, 3],
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
        stride: vec![2, 1],
        padding: vec![1, 1],
        dilation: vec![1, 2],
        groups: 2,
    };
    let w = t(DType::F32, &[6, 2, 3, 3]);
    let x = t(DType::F32, &[2, 4, 9, 9]);
    let bwd_in = Op::ConvBackwardInput {
        conv: conv.clone(),
        input: vec![9, 9],
    };
    let bwd_w = Op::ConvBackwardWeight {
        conv,
        kernel: vec![3, 3],
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
