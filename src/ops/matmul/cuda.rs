//! CUDA lowering of the (batched, broadcasting, optionally transposed) matmul onto the tiled
//! GEMM of `matmul.cu`, which the convolutions share.

use crate::codegen::build::{c_bool, c_dims, c_u64};
use crate::codegen::geometry::{bcast_strides, dims, numel, u};
use crate::codegen::launch::{gemm_launch, templated};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ir::Op;
use crate::ops::cuda::CudaLowering;

impl super::Family {
    /// `matmul.cu`: the tiled fp32-accumulating GEMM core and the matmul entry template.
    pub(crate) const TEMPLATE: &'static str = include_str!("matmul.cu");
}

/// `out = op(x) @ op(y)` over broadcast batch dims, `op` transposing when `ta` / `tb`; the
/// output's element type may be wider than the operands' (`f32_out`).
fn matmul(a: &Args, ta: bool, tb: bool) -> Result<Kernel, CodegenError> {
    let (x, y, out) = (a.at(0)?, a.at(1)?, a.output);
    let (rx, ry, ro) = (x.shape.len(), y.shape.len(), out.shape.len());
    let (m, n) = (u(out.shape[ro - 2]), u(out.shape[ro - 1]));
    let kd = u(if ta { x.shape[rx - 2] } else { x.shape[rx - 1] });
    let batch = &out.shape[..ro - 2];
    let launch = gemm_launch(a, m, n, numel(batch))?;
    Ok(templated(
        "matmul",
        &[super::Family::TEMPLATE],
        vec![
            c_u64("M", m),
            c_u64("N", n),
            c_u64("K", kd),
            c_bool("TA", ta),
            c_bool("TB", tb),
            c_dims("BATCH", &dims(batch)),
            c_dims("SA", &bcast_strides(&x.shape[..rx - 2], batch)),
            c_dims("SB", &bcast_strides(&y.shape[..ry - 2], batch)),
        ],
        ("matmul_kernel", &[a.ty(0)?, a.out_ty()], 2),
        launch,
    ))
}

impl CudaLowering for super::Family {
    /// No kernel of this family reads a workspace.
    fn cuda_workspace_bytes(
        &self,
        _: &crate::ir::Op,
        _: &[&crate::ir::TensorType],
        _: &crate::ir::TensorType,
    ) -> u64 {
        0
    }

    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        match a.op {
            Op::MatMul { ta, tb, .. } => matmul(a, *ta, *tb),
            _ => Err(a.foreign("matmul")),
        }
    }
}
