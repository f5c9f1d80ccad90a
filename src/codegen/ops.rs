//! `kernel_for`: checks an op application and hands it to its family's lowering
//! (`src/ops/<family>/cuda.rs`), which picks the template, constants and launch geometry.

use super::{ctype, CodegenError, Kernel};
use crate::ir::infer::infer;
use crate::ir::{DType, NormKind, Op, TensorType};

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

    fn arity(&self, lo: usize, hi: usize) -> Result<()> {
        let got = self.inputs.len();
        if got < lo || got > hi {
            let want = if lo == hi {
                format!("{lo}")
            } else {
                format!("{lo} to {hi}")
            };
            return Err(CodegenError::Arity {
                op: self.name(),
                want,
                got,
            });
        }
        Ok(())
    }

    /// Input `i`'s type, or a `Type` error when the op has fewer inputs.
    pub(crate) fn at(&self, i: usize) -> Result<&TensorType> {
        self.inputs
            .get(i)
            .ok_or_else(|| self.err(format!("missing input {i}")))
    }

    /// Input `i`'s type, or a `Type` error unless it has exactly rank `rank`.
    pub(crate) fn rank(&self, i: usize, rank: usize) -> Result<&TensorType> {
        let t = self.at(i)?;
        if t.shape.len() != rank {
            return Err(self.err(format!("input {i} needs rank {rank}, found {t}")));
        }
        Ok(t)
    }

    fn min_rank(&self, i: usize, rank: usize) -> Result<&TensorType> {
        let t = self.at(i)?;
        if t.shape.len() < rank {
            return Err(self.err(format!("input {i} needs rank >= {rank}, found {t}")));
        }
        Ok(t)
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
    pre_check(&a)?;
    a.check_infer()?;
    crate::ops::family(op).lower(&a).map(Some)
}

/// Rank checks that make shape inference and the generators index-safe.
fn pre_check(a: &Args) -> Result<()> {
    use Op::*;
    match a.op {
        Conv2dBackwardInput { .. } | Conv2dBackwardWeight { .. } => {
            a.arity(2, 2)?;
            a.rank(0, 4)?;
            a.rank(1, 4)?;
        }
        MaxPool2dBackward(_) => {
            a.arity(2, 2)?;
            a.rank(0, 4)?;
            a.rank(1, 4)?;
        }
        AvgPool2dBackward { .. } => {
            a.arity(1, 1)?;
            a.rank(0, 4)?;
        }
        AttentionBackward { attn, .. } => {
            a.arity(4, 4)?;
            let refs: Vec<&TensorType> = a.inputs[..3].iter().collect();
            infer(&Attention(*attn), &refs).map_err(|e| a.err(e.message))?;
            if a.inputs[3] != a.inputs[0] {
                return Err(a.err("dout must have q's type"));
            }
        }
        CrossEntropyBackward => {
            a.arity(3, 3)?;
            let refs: Vec<&TensorType> = a.inputs[..2].iter().collect();
            infer(&CrossEntropy, &refs).map_err(|e| a.err(e.message))?;
        }
        MseBackward => {
            a.arity(3, 3)?;
            let refs: Vec<&TensorType> = a.inputs[..2].iter().collect();
            infer(&Mse, &refs).map_err(|e| a.err(e.message))?;
        }
        NormBackwardInput { kind, eps } => {
            a.arity(3, 3)?;
            let refs = [&a.inputs[0], &a.inputs[1]];
            infer(
                &Norm {
                    kind: *kind,
                    eps: *eps,
                },
                &refs,
            )
            .map_err(|e| a.err(e.message))?;
        }
        NormBackwardWeight { kind, .. } | NormBackwardBias { kind } => {
            a.min_rank(
                0,
                if matches!(kind, NormKind::Layer | NormKind::Rms) {
                    1
                } else {
                    2
                },
            )?;
            if let NormKind::Group(g) = kind {
                let c = a.at(0)?.shape[1];
                if *g == 0 || c % g != 0 {
                    return Err(a.err("group count must divide the channels"));
                }
            }
        }
        MaxToBackward => {
            a.arity(3, 3)?;
            let refs = [&a.inputs[0]];
            let fwd = MaxTo {
                shape: a.inputs[1].shape.clone(),
            };
            infer(&fwd, &refs).map_err(|e| a.err(e.message))?;
        }
        EmbeddingBackward { .. } => {
            a.arity(2, 2)?;
            a.min_rank(1, 1)?;
            if a.inputs[0].dtype != DType::I32 {
                return Err(a.err("ids must be i32"));
            }
        }
        UnaryBackward(_) | SoftmaxBackward { .. } | LogSoftmaxBackward { .. } => {
            a.arity(2, 2)?;
            if !a.inputs[0].dtype.is_float() {
                return Err(a.err("operand must be floating"));
            }
        }
        ClipCoefficient { .. }
        | UnscaleGrads
        | LossScaleUpdate { .. }
        | AccumulateGrad { .. }
        | AdamW(_)
        | Sgd(_)
            if a.inputs.iter().any(|t| !t.dtype.is_float()) =>
        {
            return Err(a.err("optimizer operands must be floating"));
        }
        Reshape { .. }
        | Permute { .. }
        | Slice { .. }
        | PadSlice { .. }
        | Concat { .. }
        | SumTo { .. }
        | BroadcastTo { .. }
        | MaxTo { .. } => {
            a.arity(1, usize::MAX)?;
            if a.inputs.iter().any(|t| t.dtype == DType::I32)
                && !matches!(
                    a.op,
                    Reshape { .. } | Permute { .. } | Slice { .. } | Concat { .. }
                )
            {
                return Err(a.err("integer tensors cannot be reduced or broadcast"));
            }
        }
        _ => {}
    }
    Ok(())
}
