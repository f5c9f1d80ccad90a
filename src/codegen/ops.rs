//! `kernel_for`: checks an op application and hands it to its family's lowering
//! (`src/ops/<family>/cuda.rs`), which picks the template, constants and launch geometry.

use super::{ctype, CodegenError, Kernel};
use crate::ir::infer::infer;
use crate::ir::{Op, TensorType};

type Result<T> = std::result::Result<T, CodegenError>;

/// Checked accessors over an op's input types.
pub struct Args<'a> {
    /// The op being lowered.
    pub op: &'a Op,
    /// Its input types, in op order.
    pub inputs: &'a [TensorType],
    /// Its output type (agrees with shape inference once `kernel_for` has checked it).
    pub output: &'a TensorType,
}

impl Args<'_> {
    fn name(&self) -> &'static str {
        self.op.name()
    }

    /// A `Type` error naming the op.
    pub(crate) fn err(&self, message: impl Into<String>) -> CodegenError {
        CodegenError::Type {
            op: self.name(),
            message: message.into(),
        }
    }

    /// Input `i`'s type, or a `Type` error when the op has fewer inputs.
    pub(crate) fn at(&self, i: usize) -> Result<&TensorType> {
        self.inputs
            .get(i)
            .ok_or_else(|| self.err(format!("missing input {i}")))
    }

    /// The CUDA element type of input `i`.
    pub(crate) fn ty(&self, i: usize) -> Result<&'static str> {
        Ok(ctype(self.at(i)?.dtype))
    }

    /// The CUDA element type of the output.
    pub(crate) fn out_ty(&self) -> &'static str {
        ctype(self.output.dtype)
    }

    /// Checks that shape inference agrees with the given output type.
    fn check_infer(&self) -> Result<()> {
        let refs: Vec<&TensorType> = self.inputs.iter().collect();
        let want = infer(self.op, &refs).map_err(|e| self.err(e.message))?;
        if &want != self.output {
            return Err(self.err(format!("output {} but inference gives {want}", self.output)));
        }
        Ok(())
    }

    /// An `Unsupported` error naming the op.
    pub(crate) fn unsupported(&self, message: impl Into<String>) -> CodegenError {
        CodegenError::Unsupported {
            op: self.name(),
            message: message.into(),
        }
    }

    /// The error a family's lowering returns for an op that is not its own (a dispatch
    /// mismatch in `crate::ops::family`).
    pub(crate) fn foreign(&self, family: &str) -> CodegenError {
        self.unsupported(format!("not an op of the {family} family"))
    }
}

/// The kernel computing `op` on inputs of the given types into `output`, or `None` for
/// source ops (Input, Param, OptimState) that need no kernel. Inputs must satisfy
/// [`infer`](crate::ir::infer::infer) with result `output`, else a `CodegenError`; the
/// returned kernel reads only its inputs, writes only its output (or, for AdamW/SGD, the
/// mutated inputs) and is deterministic.
pub fn kernel_for(op: &Op, inputs: &[TensorType], output: &TensorType) -> Result<Option<Kernel>> {
    let a = Args { op, inputs, output };
    if matches!(
        op,
        Op::Input { .. } | Op::Param { .. } | Op::OptimState { .. }
    ) {
        return Ok(None);
    }
    a.check_infer()?;
    crate::ops::family(op).lower(&a).map(Some)
}
