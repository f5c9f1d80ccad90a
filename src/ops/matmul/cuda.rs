//! CUDA lowering of the (batched, broadcasting, optionally transposed) matmul: cuBLASLt
//! GEMMs ([`crate::codegen::gemm`]), one strided batch per run of batch dims whose operands
//! advance uniformly (one call for the usual shapes).

use crate::codegen::gemm::{Addr, Call, Gemm};
use crate::codegen::geometry::{bcast_strides, contiguous, dims, u};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ir::Op;
use crate::ops::cuda::CudaLowering;

impl super::Family {
    /// `matmul.cu`: the tiled fp32-accumulating GEMM core the convolutions run on.
    pub(crate) const TEMPLATE: &'static str = include_str!("matmul.cu");
}

/// Bytes of cuBLASLt workspace a matmul step gets (a planned arena buffer, set on each
/// call): enough for its split-K and stream-K algorithms at these sizes.
pub(crate) const GEMM_WORKSPACE: u64 = 4 << 20;

/// The step a batch of `per` flat batch items advances each operand by, when it advances
/// uniformly over `dims` (strides in matrices, 0 on broadcast dims): 0 when every stride is
/// 0, 1 when the strides are the dims' own contiguous ones; else `None`.
fn uniform(strides: &[u64], batch: &[usize]) -> Option<u64> {
    if strides.iter().all(|&s| s == 0) {
        Some(0)
    } else if strides == contiguous(batch).as_slice() {
        Some(1)
    } else {
        None
    }
}

/// `out = op(x) @ op(y)` over broadcast batch dims, `op` transposing when `tx` / `ty`, plus
/// input 2 added to every row in the epilogue when `bias`; the output's element type may be
/// wider than the operands' (`f32_out`).
fn matmul(a: &Args, tx: bool, ty: bool, bias: bool) -> Result<Kernel, CodegenError> {
    let (x, y, out) = (a.at(0)?, a.at(1)?, a.output);
    let (rx, ry, ro) = (x.shape.len(), y.shape.len(), out.shape.len());
    let (m, n) = (u(out.shape[ro - 2]), u(out.shape[ro - 1]));
    let k = u(if tx { x.shape[rx - 2] } else { x.shape[rx - 1] });
    let batch = &out.shape[..ro - 2];
    let (sx, sy) = (
        bcast_strides(&x.shape[..rx - 2], batch),
        bcast_strides(&y.shape[..ry - 2], batch),
    );
    // The batch dims from `split` on form one strided batch; the ones before it are looped.
    let split = (0..=batch.len())
        .find(|&s| {
            uniform(&sx[s..], &batch[s..]).is_some() && uniform(&sy[s..], &batch[s..]).is_some()
        })
        .unwrap_or(batch.len());
    let inner: u64 = batch[split..].iter().map(|&d| u(d)).product();
    let (ix, iy) = (
        uniform(&sx[split..], &batch[split..]).unwrap_or(0),
        uniform(&sy[split..], &batch[split..]).unwrap_or(0),
    );
    let outer = dims(&batch[..split]);
    let outer_n: u64 = outer.iter().product();
    let (ex, ey, eo) = (x.dtype.size(), y.dtype.size(), out.dtype.size());
    let mut calls = Vec::with_capacity(outer_n as usize);
    for o in 0..outer_n {
        // Matrix index of each operand for outer item `o` (row-major over the outer dims).
        let (mut rem, mut mx, mut my) = (o, 0, 0);
        for d in (0..split).rev() {
            let i = rem % outer[d];
            rem /= outer[d];
            mx += i * sx[d];
            my += i * sy[d];
        }
        let g = Gemm::row_major(
            (
                Addr::Input(0, mx * m * k * ex),
                x.dtype,
                tx,
                if tx { m } else { k },
            ),
            (
                Addr::Input(1, my * k * n * ey),
                y.dtype,
                ty,
                if ty { k } else { n },
            ),
            (Addr::Output(o * inner * m * n * eo), out.dtype, n),
            (m, n, k),
        );
        let g = g.batched(inner, (ix * m * k, iy * k * n, m * n));
        calls.push(Call::gemm(if bias {
            g.with_bias(Addr::Input(2, 0))
        } else {
            g
        }));
    }
    Ok(Kernel::library_only("matmul", calls))
}

/// A [`Op::MatMulBiasGrad`]: the 2-D product `op(x) @ op(y)` at the output's start and
/// `op(y)`'s column sums at [`super::bias_grad_offset`], one cuBLASLt call with
/// the bias-gradient epilogue.
fn matmul_bias_grad(a: &Args, tx: bool, ty: bool) -> Result<Kernel, CodegenError> {
    let (x, y, out) = (a.at(0)?, a.at(1)?, a.output);
    if x.shape.len() != 2 || y.shape.len() != 2 {
        return Err(a.err("a product with a bias gradient over matrices"));
    }
    let (m, k) = match tx {
        true => (u(x.shape[1]), u(x.shape[0])),
        false => (u(x.shape[0]), u(x.shape[1])),
    };
    let n = u(if ty { y.shape[0] } else { y.shape[1] });
    let eo = out.dtype.size();
    let sums = super::bias_grad_offset(m * n);
    let g = Gemm::row_major(
        (Addr::Input(0, 0), x.dtype, tx, u(x.shape[1])),
        (Addr::Input(1, 0), y.dtype, ty, u(y.shape[1])),
        (Addr::Output(0), out.dtype, n),
        (m, n, k),
    );
    let call = Call::gemm(g.with_bias_grad(Addr::Output(sums * eo)));
    Ok(Kernel::library_only("matmul_bias_grad", vec![call]))
}

impl CudaLowering for super::Family {
    /// The cuBLASLt workspace, [`GEMM_WORKSPACE`] bytes.
    fn cuda_workspace_bytes(
        &self,
        _: &crate::ir::Op,
        _: &[&crate::ir::TensorType],
        _: &crate::ir::TensorType,
    ) -> u64 {
        GEMM_WORKSPACE
    }

    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        match a.op {
            Op::MatMul { ta, tb, bias, .. } => matmul(a, *ta, *tb, *bias),
            Op::MatMulBiasGrad { ta, tb, .. } => matmul_bias_grad(a, *ta, *tb),
            _ => Err(a.foreign("matmul")),
        }
    }
}
