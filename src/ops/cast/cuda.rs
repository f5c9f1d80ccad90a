//! CUDA lowering of Cast and CastGroup: the `cast_kernel` and `cast_group_kernel`
//! templates, which live in the pointwise family's `pointwise.cu` beside the other
//! elementwise templates. A group's kernel reads its inputs through a [`TensorTable`] the
//! host writes at the start of its workspace, so its arguments do not grow with the group.

use crate::codegen::build::{c_u64, Gen};
use crate::codegen::ops::Args;
use crate::codegen::{ctype, CodegenError, Kernel, KernelParam, TensorTable};
use crate::ir::{DType, Op, TensorType};
use crate::ops::cuda::CudaLowering;

impl super::Family {
    /// The `cast` kernel converting `numel` contiguous elements from `from` to `to` (through
    /// fp32, round-to-nearest-even when narrowing); arguments: arena, input offset, output
    /// offset.
    pub(crate) fn kernel(from: DType, to: DType, numel: u64) -> Kernel {
        let mut k = Gen::new("cast", &[crate::ops::pointwise::Family::TEMPLATE]);
        k.cfg("Cfg", vec![c_u64("N", numel)]);
        k.call(format!(
            "cast_kernel<{}, {}, Cfg>(arena, in0, out)",
            ctype(from),
            ctype(to)
        ));
        k.params(&[KernelParam::Input(0), KernelParam::Output]);
        k.elementwise(numel);
        k.finish()
    }
}

/// The table of a cast group's inputs: each one's offset and first element in the packed
/// output (the elements of the inputs before it).
fn group_table(inputs: &[&TensorType]) -> TensorTable {
    TensorTable::new((inputs.iter().enumerate()).map(|(i, t)| (i, t.numel(), t.dtype)))
}

/// One launch over the packed output of a cast group (`cast_group_kernel`): each element
/// finds its input in the table in the workspace and converts as `cast_kernel` does.
fn cast_group(a: &Args, to: DType) -> Result<Kernel, CodegenError> {
    let refs: Vec<&TensorType> = a.inputs.iter().collect();
    let from = a.at(0)?.dtype;
    let total = a.output.numel();
    let mut k = Gen::new("cast_group", &[crate::ops::pointwise::Family::TEMPLATE]);
    k.cfg(
        "Cfg",
        vec![c_u64("TENSORS", refs.len() as u64), c_u64("TOTAL", total)],
    );
    k.params(&[KernelParam::Workspace, KernelParam::Output]);
    k.call(format!(
        "cast_group_kernel<{}, {}, Cfg>(arena, ws, out)",
        ctype(from),
        ctype(to)
    ));
    k.elementwise(total);
    k.table(group_table(&refs));
    Ok(k.finish())
}

impl CudaLowering for super::Family {
    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        match a.op {
            Op::Cast { to } => Ok(Self::kernel(a.at(0)?.dtype, *to, a.output.numel())),
            Op::CastGroup { to, .. } => cast_group(a, *to),
            _ => Err(a.foreign("cast")),
        }
    }

    /// A cast group's table of inputs; a cast takes no workspace.
    fn cuda_workspace_bytes(&self, op: &Op, inputs: &[&TensorType], _: &TensorType) -> u64 {
        match op {
            Op::CastGroup { .. } => group_table(inputs).len_bytes(),
            _ => 0,
        }
    }
}
