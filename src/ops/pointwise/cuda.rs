//! CUDA lowering of the elementwise ops (unary, unary derivative, broadcasting binary,
//! `where`, `clamp` and its backward, affine) onto `pointwise.cu`, which also holds the fill and cast kernels of the source and
//! cast families.

use crate::codegen::build::{c_bool, c_dims, c_f32, c_int, c_u64};
use crate::codegen::geometry::{bcast_strides, dims};
use crate::codegen::launch::{templated, Launch::Elementwise};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ir::{BinaryFn, Bounds, Op, UnaryFn};
use crate::ops::cuda::CudaLowering;

impl super::Family {
    /// `pointwise.cu`: the fill, unary, unary-derivative, broadcasting binary, `where`,
    /// clamp, affine and cast templates.
    pub(crate) const TEMPLATE: &'static str = include_str!("pointwise.cu");
}

/// The `OP` constant `unary_eval` / `unary_deriv` in `pointwise.cu` switch on.
fn unary_code(f: UnaryFn) -> i64 {
    match f {
        UnaryFn::Neg => 0,
        UnaryFn::Exp => 1,
        UnaryFn::Log => 2,
        UnaryFn::Sqrt => 3,
        UnaryFn::Rsqrt => 4,
        UnaryFn::Tanh => 5,
        UnaryFn::Sigmoid => 6,
        UnaryFn::Relu => 7,
        UnaryFn::GeluTanh => 8,
        UnaryFn::GeluErf => 9,
        UnaryFn::Silu => 10,
        UnaryFn::Erf => 11,
        UnaryFn::Softplus => 12,
        UnaryFn::Reciprocal => 13,
    }
}

/// The `OP` constant `binary_kernel` in `pointwise.cu` switches on.
fn binary_code(f: BinaryFn) -> i64 {
    match f {
        BinaryFn::Add => 0,
        BinaryFn::Sub => 1,
        BinaryFn::Mul => 2,
        BinaryFn::Div => 3,
        BinaryFn::Minimum => 4,
        BinaryFn::Maximum => 5,
        BinaryFn::Less => 6,
        BinaryFn::LessEqual => 7,
        BinaryFn::Greater => 8,
        BinaryFn::GreaterEqual => 9,
        BinaryFn::Equal => 10,
        BinaryFn::Pow => 11,
    }
}

/// `N` and the bounds of a clamp kernel: `HAS_LO`/`HAS_HI` say which are present, `LO`/`HI`
/// hold them (0 when absent, never read).
fn bound_lines(n: u64, b: Bounds) -> Vec<String> {
    vec![
        c_u64("N", n),
        c_bool("HAS_LO", b.lo.is_some()),
        c_f32("LO", b.lo.unwrap_or(0.0)),
        c_bool("HAS_HI", b.hi.is_some()),
        c_f32("HI", b.hi.unwrap_or(0.0)),
    ]
}

impl CudaLowering for super::Family {
    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        let out = a.output;
        let n_out = out.numel();
        let files = &[Self::TEMPLATE];
        match a.op {
            Op::Unary(f) => Ok(templated(
                "unary",
                files,
                vec![c_u64("N", n_out), c_int("OP", unary_code(*f))],
                ("unary_kernel", &[a.ty(0)?], 1),
                Elementwise(n_out),
            )),
            Op::UnaryBackward(f) => Ok(templated(
                "unary_backward",
                files,
                vec![c_u64("N", n_out), c_int("OP", unary_code(*f))],
                ("unary_backward_kernel", &[a.ty(0)?, a.ty(1)?], 2),
                Elementwise(n_out),
            )),
            Op::UnaryPair(f) => {
                let n = a.at(0)?.numel();
                let (at, _) = crate::ops::packed_pair(n, n, a.at(0)?.dtype.size());
                Ok(templated(
                    "unary_pair",
                    files,
                    vec![c_u64("N", n), c_u64("AT", at), c_int("OP", unary_code(*f))],
                    ("unary_pair_kernel", &[a.ty(0)?, a.ty(1)?], 2),
                    Elementwise(at),
                ))
            }
            Op::UnaryOutputBackward(f) => Ok(templated(
                "unary_output_backward",
                files,
                vec![c_u64("N", n_out), c_int("OP", unary_code(*f))],
                ("unary_output_backward_kernel", &[a.ty(0)?, a.ty(1)?], 2),
                Elementwise(n_out),
            )),
            Op::Binary(f) => {
                let (x, y) = (a.at(0)?, a.at(1)?);
                let lines = vec![
                    c_u64("N", n_out),
                    c_int("OP", binary_code(*f)),
                    c_dims("OUT", &dims(&out.shape)),
                    c_dims("SA", &bcast_strides(&x.shape, &out.shape)),
                    c_dims("SB", &bcast_strides(&y.shape, &out.shape)),
                ];
                let types = [a.ty(0)?, a.ty(1)?, a.out_ty()];
                let entry = ("binary_kernel", &types[..], 2);
                Ok(templated("binary", files, lines, entry, Elementwise(n_out)))
            }
            Op::Where => {
                let lines = vec![
                    c_u64("N", n_out),
                    c_dims("OUT", &dims(&out.shape)),
                    c_dims("SC", &bcast_strides(&a.at(0)?.shape, &out.shape)),
                    c_dims("SA", &bcast_strides(&a.at(1)?.shape, &out.shape)),
                    c_dims("SB", &bcast_strides(&a.at(2)?.shape, &out.shape)),
                ];
                let entry = ("where_kernel", &[a.out_ty()][..], 3);
                Ok(templated("where", files, lines, entry, Elementwise(n_out)))
            }
            Op::Clamp(bounds) => Ok(templated(
                "clamp",
                files,
                bound_lines(n_out, *bounds),
                ("clamp_kernel", &[a.ty(0)?], 1),
                Elementwise(n_out),
            )),
            Op::ClampBackward(bounds) => Ok(templated(
                "clamp_backward",
                files,
                bound_lines(n_out, *bounds),
                ("clamp_backward_kernel", &[a.ty(0)?, a.ty(1)?], 2),
                Elementwise(n_out),
            )),
            Op::Affine { scale, shift } => Ok(templated(
                "affine",
                files,
                vec![
                    c_u64("N", n_out),
                    c_f32("SCALE", *scale),
                    c_f32("SHIFT", *shift),
                ],
                ("affine_kernel", &[a.out_ty()], 1),
                Elementwise(n_out),
            )),
            _ => Err(a.foreign("pointwise")),
        }
    }
}
