//! CUDA lowering of the embedding lookup and its deterministic backward onto `embedding.cu`:
//! a block per tile of table rows, one pass over the ids per tile (no scan of all ids per
//! element).

use crate::codegen::build::c_u64;
use crate::codegen::geometry::{pow2_block, u};
use crate::codegen::launch::{templated, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ir::Op;
use crate::ops::cuda::CudaLowering;

/// `embedding.cu`: the lookup and scatter-free backward templates.
const TEMPLATE: &str = include_str!("embedding.cu");

/// Most fp32 accumulators one thread of the backward holds: rows of a tile times the columns
/// it owns.
const MAX_ACC: u64 = 32;

/// Tiles the backward aims for at least (twice the 132 streaming multiprocessors of an
/// H100), so a short table still spreads over the whole GPU.
const TILE_BLOCKS: u64 = 2 * 132;

impl CudaLowering for super::Family {
    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        let out = a.output;
        let n_out = out.numel();
        match a.op {
            Op::Embedding { .. } => {
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
            Op::EmbeddingBackward { rows, padding_idx } => {
                let ids = a.at(0)?;
                let d = u(out.shape[1]);
                let block = pow2_block(d.div_ceil(4), 32, 1024);
                let cpt = d.div_ceil(u64::from(block)).max(1);
                if cpt > MAX_ACC {
                    return Err(a.unsupported(format!(
                        "embedding dim {d} exceeds {} per block",
                        MAX_ACC * 1024
                    )));
                }
                // Rows a tile: as many as the accumulators hold, fewer when that leaves
                // fewer than TILE_BLOCKS tiles.
                let rt = u(*rows)
                    .div_ceil(TILE_BLOCKS)
                    .clamp(1, (MAX_ACC / cpt).max(1));
                let tiles = u(*rows).div_ceil(rt);
                Ok(templated(
                    "embedding_backward",
                    &[TEMPLATE],
                    vec![
                        c_u64("D", d),
                        c_u64("ROWS", u(*rows)),
                        // No row when there is no padding row: ids are below ROWS.
                        c_u64("SKIP", padding_idx.map_or(u(*rows), u)),
                        c_u64("NIDS", ids.numel()),
                        c_u64("BLOCK", u64::from(block)),
                        c_u64("CPT", cpt),
                        c_u64("RT", rt),
                        c_u64("TILES", tiles),
                    ],
                    ("embedding_backward_kernel", &[a.ty(1)?, a.out_ty()], 2),
                    Launch::PerBlock(tiles, block),
                ))
            }
            _ => Err(a.foreign("embedding")),
        }
    }
}
