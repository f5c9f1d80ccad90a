//! CUDA lowering of the embedding lookup and its deterministic gather-form backward onto
//! `embedding.cu`.

use crate::codegen::build::c_u64;
use crate::codegen::geometry::{pow2_block, u};
use crate::codegen::launch::{templated, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ir::Op;
use crate::ops::cuda::CudaLowering;

/// `embedding.cu`: the lookup and scatter-free backward templates.
const TEMPLATE: &str = include_str!("embedding.cu");

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
        let out = a.output;
        let n_out = out.numel();
        match a.op {
            Op::Embedding => {
                let table = a.at(0)?;
                Ok(templated(
                    "embedding",
                    &[TEMPLATE],
                    vec![
                        c_u64("N", n_out),
                        c_u64("D", u(table.shape[1])),
                        c_u64("ROWS", u(table.shape[0])),
                    ],
                    ("embedding_kernel", &[a.out_ty()], 2),
                    Launch::Elementwise(n_out),
                ))
            }
            Op::EmbeddingBackward { rows } => {
                let ids = a.at(0)?;
                let d = u(out.shape[1]);
                let block = pow2_block(d, 32, 256);
                Ok(templated(
                    "embedding_backward",
                    &[TEMPLATE],
                    vec![
                        c_u64("D", d),
                        c_u64("ROWS", u(*rows)),
                        c_u64("NIDS", ids.numel()),
                    ],
                    ("embedding_backward_kernel", &[a.ty(1)?, a.out_ty()], 2),
                    Launch::Grid(
                        [d.div_ceil(u64::from(block)), u(*rows).min(65535), 1],
                        block,
                    ),
                ))
            }
            _ => Err(a.foreign("embedding")),
        }
    }
}
