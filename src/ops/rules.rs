//! The stage trait for shape and dtype rules, costs and precision classes, and the checks
//! the families' type rules share (arity, dtype, rank, window arithmetic).

use crate::ir::{DType, Op, OpClass, TensorType, TypeError};

/// In which precision an op runs under automatic mixed precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrecisionClass {
    /// In the low precision (bf16 or fp16); the kernel accumulates in fp32.
    Low,
    /// In fp32.
    Fp32,
    /// In the widest precision among its inputs that depend on a step input.
    Widest,
    /// Reads its inputs as they are: the kernel computes in fp32 and returns fp32.
    AsIs,
}

/// Type rule, cost and precision class of a family's ops.
pub trait Rules {
    /// The output type of `op` on inputs of the given types, or why they are ill-typed. An
    /// `Ok` guarantees every input the op's kernels index exists with the rank and dtype
    /// they read, so the CPU kernels and CUDA generators need no checks of their own.
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType>;
    /// FLOPs of one execution of `op` (multiply-add = 2).
    fn flops(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64;
    /// How `op` runs: its precision, its class and the inputs it overwrites.
    fn behaviour(&self, op: &Op) -> Behaviour;
}

/// How an op runs, beyond its types: what a pass needs to place, cost and order it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Behaviour {
    /// The precision the op runs in under mixed precision.
    pub precision: PrecisionClass,
    /// What kind of work the op is, for cost models and recomputation policy.
    pub class: OpClass,
    /// Indices of inputs the op overwrites in place.
    pub mutated_inputs: &'static [usize],
    /// What the op's CUDA work runs on. The GPU cost model (`crate::cost`) reads only this,
    /// so a family moving its work to a library or to MMA sets it in its `behaviour`, the one
    /// place its estimate changes.
    pub compute: Compute,
}

/// What an op's CUDA kernels compute on, as the cost model prices it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compute {
    /// Generated SIMT kernels (fp32 FMA units).
    Simt,
    /// cuBLASLt GEMMs: tensor cores for 16-bit operands, cuBLAS's fp32 rate otherwise (no
    /// TF32).
    Library,
    /// Generated kernels on tensor cores (`mma.sync`) for 16-bit operands, SIMT kernels
    /// otherwise.
    Mma,
    /// Generated kernels on tensor cores for 16-bit operands, cuBLASLt GEMMs otherwise.
    MmaOrLibrary,
}

impl Behaviour {
    /// Cheap work in its inputs' widest precision, writing no input.
    pub const CHEAP: Behaviour = Behaviour {
        precision: PrecisionClass::Widest,
        class: OpClass::Cheap,
        mutated_inputs: &[],
        compute: Compute::Simt,
    };
    /// Heavy work in its inputs' widest precision, writing no input.
    pub const HEAVY: Behaviour = Behaviour {
        class: OpClass::Heavy,
        ..Behaviour::CHEAP
    };
    /// [`Behaviour::HEAVY`] done by cuBLASLt GEMMs.
    pub const LIBRARY_GEMM: Behaviour = Behaviour {
        compute: Compute::Library,
        ..Behaviour::HEAVY
    };
    /// [`Behaviour::HEAVY`] on tensor cores in a generated kernel for 16-bit operands.
    pub const MMA: Behaviour = Behaviour {
        compute: Compute::Mma,
        ..Behaviour::HEAVY
    };
    /// [`Behaviour::MMA`] whose fp32 form is cuBLASLt GEMMs.
    pub const MMA_OR_LIBRARY: Behaviour = Behaviour {
        compute: Compute::MmaOrLibrary,
        ..Behaviour::HEAVY
    };

    /// The same behaviour run in `precision`.
    pub const fn in_precision(self, precision: PrecisionClass) -> Behaviour {
        Behaviour { precision, ..self }
    }
}

/// The result of a type rule.
pub(crate) type Result<T> = std::result::Result<T, TypeError>;

/// A type error with its message and help line.
pub(crate) fn fail<T>(message: impl Into<String>, help: impl Into<String>) -> Result<T> {
    Err(TypeError {
        message: message.into(),
        help: help.into(),
    })
}

/// The internal error of a family asked about an op that is not its own.
pub(crate) fn foreign<T>(op: &Op, family: &str) -> Result<T> {
    fail(
        format!("internal: `{}` is not a {family} op", op.name()),
        "the op registry dispatched to the wrong family",
    )
}

/// Fails unless there are `lo..=hi` inputs.
pub(crate) fn arity(op: &Op, inputs: &[&TensorType], lo: usize, hi: usize) -> Result<()> {
    if inputs.len() < lo || inputs.len() > hi {
        let want = if lo == hi {
            format!("{lo}")
        } else {
            format!("{lo} to {hi}")
        };
        return fail(
            format!("`{}` takes {want} inputs, got {}", op.name(), inputs.len()),
            "check the number of arguments",
        );
    }
    Ok(())
}

/// Fails unless `t` has a floating dtype.
pub(crate) fn float(t: &TensorType, what: &str) -> Result<()> {
    if !t.dtype.is_float() {
        return fail(
            format!("{what} must be a floating tensor, found {t}"),
            "integer tensors can only be ids or targets",
        );
    }
    Ok(())
}

/// Fails unless `t` is i32.
pub(crate) fn int(t: &TensorType, what: &str) -> Result<()> {
    if t.dtype != DType::I32 {
        return fail(
            format!("{what} must be i32, found {t}"),
            "declare it as `input name: i32[...]`",
        );
    }
    Ok(())
}

/// Fails unless `t` is a single f32 element.
pub(crate) fn scalar_f32(t: &TensorType, what: &str) -> Result<()> {
    if t.dtype != DType::F32 || t.numel() != 1 {
        return fail(
            format!("{what} must be one f32 element, found {t}"),
            "loss scaling state is a single fp32 value",
        );
    }
    Ok(())
}

/// Fails unless `a` and `b` have the same dtype.
pub(crate) fn same_dtype(a: &TensorType, b: &TensorType) -> Result<()> {
    if a.dtype != b.dtype {
        return fail(
            format!("dtype clash: {a} and {b}"),
            "both operands must have the same element type",
        );
    }
    Ok(())
}

/// Fails unless `a` and `b` have the same shape.
pub(crate) fn same_shape(a: &TensorType, b: &TensorType, what: &str) -> Result<()> {
    if a.shape != b.shape {
        return fail(
            format!("shape mismatch in {what}: {a} vs {b}"),
            "both tensors must have the same shape",
        );
    }
    Ok(())
}

/// Fails unless `t` has rank `rank` or more.
pub(crate) fn rank_at_least(t: &TensorType, rank: usize, what: &str) -> Result<()> {
    if t.shape.len() < rank {
        return fail(
            format!("{what} needs rank >= {rank}, found {t}"),
            "reshape the tensor first",
        );
    }
    Ok(())
}

/// Fails unless `t` has rank exactly `rank`.
pub(crate) fn rank_exactly(t: &TensorType, rank: usize, what: &str) -> Result<()> {
    if t.shape.len() != rank {
        return fail(
            format!("{what} needs rank {rank}, found {t}"),
            "reshape the tensor first",
        );
    }
    Ok(())
}

/// Fails unless `axis` is below the rank of `t`; `prefix` opens the message (`"concat "`).
pub(crate) fn axis_below_rank(t: &TensorType, axis: usize, prefix: &str) -> Result<()> {
    if axis >= t.shape.len() {
        return fail(
            format!("{prefix}axis {axis} out of range for {t}"),
            "use an axis below the rank",
        );
    }
    Ok(())
}

/// Output spatial size of a window op: `(n + 2p - d(k-1) - 1) / s + 1`, or None if empty.
pub fn window_out(n: usize, k: usize, s: usize, p: usize, d: usize) -> Option<usize> {
    let span = d * (k.max(1) - 1) + 1;
    let padded = n + 2 * p;
    (padded >= span && s > 0).then(|| (padded - span) / s + 1)
}

/// Elements of the first input, 0 without inputs: the size most cost rules scale with.
pub(crate) fn first_numel(inputs: &[&TensorType]) -> u64 {
    inputs.first().map(|t| t.numel()).unwrap_or(0)
}

/// The cost of one pass over the larger of the output and the first input.
pub(crate) fn elementwise_flops(inputs: &[&TensorType], out: &TensorType) -> u64 {
    out.numel().max(first_numel(inputs))
}

#[cfg(test)]
mod tests {
    use super::Rules;
    use crate::ir::infer::infer;
    use crate::ir::*;

    fn t(dtype: DType, shape: &[usize]) -> TensorType {
        TensorType::new(dtype, shape.to_vec())
    }

    fn ok(op: Op, inputs: &[TensorType]) -> bool {
        let refs: Vec<&TensorType> = inputs.iter().collect();
        infer(&op, &refs).is_ok()
    }

    #[test]
    fn backward_ops_check_what_their_kernels_index() {
        let (f, i) = (DType::F32, DType::I32);
        let x = t(f, &[2, 3, 4, 4]);
        let pool = PoolParams {
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0, 0],
        };
        assert!(ok(
            Op::MaxPool2dBackward(pool),
            &[x.clone(), t(f, &[2, 3, 2, 2])]
        ));
        assert!(!ok(
            Op::MaxPool2dBackward(pool),
            &[t(f, &[3, 4, 4]), t(f, &[3, 2, 2])]
        ));
        assert!(!ok(
            Op::MaxPool2dBackward(pool),
            &[x.clone(), t(f, &[2, 3, 3, 2])]
        ));
        let avg = Op::AvgPool2dBackward {
            pool,
            input: [4, 4],
        };
        assert!(!ok(avg, &[t(f, &[2, 3, 3, 2])]));
        let conv = ConvParams {
            groups: 0,
            ..ConvParams::uniform(2, 1, 0, 1)
        };
        let dw = Op::ConvBackwardWeight {
            conv: conv.clone(),
            kernel: vec![1, 1],
        };
        assert!(!ok(dw, &[x.clone(), x.clone()]));
        // Geometry lists of the wrong length, and operands of the wrong rank, are refused.
        let short = ConvParams {
            stride: vec![1],
            ..ConvParams::uniform(2, 1, 0, 1)
        };
        assert!(!ok(Op::Conv(short), &[x.clone(), x.clone()]));
        let volume = Op::Conv(ConvParams::uniform(3, 1, 0, 1));
        assert!(!ok(volume.clone(), &[x.clone(), x.clone()]));
        let v = t(f, &[1, 2, 3, 3, 3]);
        assert!(ok(volume, &[v.clone(), t(f, &[4, 2, 1, 2, 3])]));
        let dw = Op::ConvBackwardWeight {
            conv,
            kernel: vec![1, 1, 1],
        };
        assert!(!ok(dw, &[x.clone(), x.clone()]));
        let attn = AttnParams {
            heads: 2,
            kv_heads: 2,
            causal: true,
            scale: 0.5,
            window: None,
            softcap: None,
            key_mask: false,
        };
        let q = t(f, &[1, 4, 8]);
        let which = AttnInput::K;
        let back = Op::AttentionBackward { attn, which };
        assert!(ok(
            back.clone(),
            &[q.clone(), q.clone(), q.clone(), q.clone()]
        ));
        let dout = t(DType::BF16, &[1, 4, 8]);
        assert!(!ok(back, &[q.clone(), q.clone(), q.clone(), dout.clone()]));
        // Packed: x holds 2 q heads and 2 + 2 kv heads of 4 columns; anything else is refused.
        let x = t(f, &[1, 4, 24]);
        assert!(ok(Op::PackedAttention(attn), std::slice::from_ref(&x)));
        assert!(!ok(Op::PackedAttention(attn), &[t(f, &[1, 4, 20])]));
        assert!(!ok(Op::PackedAttention(attn), &[t(f, &[4, 24])]));
        let packed_back = Op::PackedAttentionBackward(attn);
        assert!(ok(packed_back.clone(), &[x.clone(), q.clone()]));
        assert!(!ok(packed_back.clone(), &[x.clone(), dout]));
        assert!(!ok(packed_back, std::slice::from_ref(&x)));
        let ids = t(i, &[2, 3]);
        let rows = Op::EmbeddingBackward {
            rows: 10,
            padding_idx: None,
        };
        assert!(ok(rows.clone(), &[ids.clone(), t(f, &[2, 3, 5])]));
        assert!(!ok(rows.clone(), &[ids.clone(), t(f, &[3, 2, 5])]));
        assert!(!ok(rows.clone(), &[t(f, &[2, 3]), t(f, &[2, 3, 5])]));
        assert!(!ok(rows, &[t(i, &[]), t(f, &[5])]));
        assert!(!ok(
            Op::CrossEntropyBackward(CeParams::default()),
            &[q.clone(), q.clone(), t(f, &[])]
        ));
        // With an ignored id, cross-entropy also reads the f32 scalar count of kept rows.
        let ignore = CeParams {
            ignore_index: Some(-100),
        };
        let (logits, targets) = (t(f, &[6, 5]), t(i, &[6]));
        let counted = [logits.clone(), targets.clone(), t(f, &[])];
        assert!(ok(Op::CrossEntropy(ignore), &counted));
        assert!(!ok(Op::CrossEntropy(ignore), &counted[..2]));
        assert!(!ok(Op::CrossEntropy(CeParams::default()), &counted));
        let wrong = [logits.clone(), targets.clone(), t(f, &[1])];
        assert!(!ok(Op::CrossEntropy(ignore), &wrong));
        let back = [logits, targets.clone(), t(f, &[]), t(f, &[])];
        assert!(ok(Op::CrossEntropyBackward(ignore), &back));
        assert!(ok(Op::KeptCount(ignore), &[targets]));
        assert!(!ok(Op::KeptCount(ignore), &[t(f, &[6])]));
        assert!(!ok(Op::MseBackward, &[q.clone(), x.clone(), t(f, &[])]));
        let group = NormKind::Group(3);
        assert!(!ok(
            Op::NormBackwardBias { kind: group },
            &[t(f, &[2, 4, 5])]
        ));
        let norm = Op::NormBackwardInput {
            kind: NormKind::Layer,
            eps: 1e-5,
        };
        assert!(!ok(norm, &[q.clone(), t(f, &[4]), q.clone()]));
        assert!(!ok(
            Op::MaxToBackward,
            &[q.clone(), t(f, &[1, 1]), t(f, &[1, 1])]
        ));
        let relu = Op::UnaryBackward(UnaryFn::Relu);
        assert!(!ok(relu, &[t(i, &[3]), t(i, &[3])]));
    }

    #[test]
    fn integer_tensors_move_but_are_not_reduced() {
        let ids = [TensorType::new(DType::I32, vec![2, 3])];
        assert!(ok(Op::Reshape { shape: vec![6] }, &ids));
        assert!(!ok(Op::sum_to(vec![3]), &ids));
        assert!(!ok(
            Op::BroadcastTo {
                shape: vec![4, 2, 3]
            },
            &ids
        ));
        let pad = Op::PadSlice {
            axis: 0,
            start: 1,
            full: 3,
        };
        assert!(!ok(pad, &ids));
    }

    #[test]
    fn optimizer_operands_are_floating_and_the_multiplier_f32() {
        let adam = Op::AdamW(AdamWParams {
            weight_decay: 0.0,
            ..AdamWParams::default()
        });
        let (p, h) = (t(DType::F32, &[4]), t(DType::F16, &[4]));
        let one = t(DType::F32, &[]);
        assert!(ok(
            adam.clone(),
            &[h.clone(), h.clone(), p.clone(), p.clone(), one]
        ));
        let half = t(DType::F16, &[]);
        assert!(!ok(
            adam.clone(),
            &[p.clone(), p.clone(), p.clone(), p.clone(), half]
        ));
        assert!(!ok(adam.clone(), &[p.clone(), p.clone(), p.clone(), h]));
        let ids = t(DType::I32, &[4]);
        assert!(!ok(adam, &[p.clone(), ids, p.clone(), p]));
    }

    #[test]
    fn a_family_rejects_ops_of_another() {
        let x = t(DType::F32, &[2]);
        let err =
            crate::ops::pointwise::Family.infer(&Op::Embedding { padding_idx: None }, &[&x, &x]);
        assert!(err.is_err_and(|e| e.message.starts_with("internal")));
    }
}
