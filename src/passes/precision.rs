//! Automatic mixed precision as a graph rewrite of the forward graph, decided at compile
//! time as `torch.autocast` decides it at run time:
//!
//! - matmul, conv2d and attention run in the low precision (bf16 or fp16; the kernels
//!   accumulate in fp32);
//! - softmax, log-softmax, layer/rms/group norm, reductions (`sum_to`, `max_to`) and
//!   the unary functions on autocast's fp32 list (exp, log, ...: the pointwise family's
//!   precision class) run in fp32 (batch norm, not on autocast's fp32 list, runs in its
//!   input's precision with fp32 statistics, as cuDNN's does);
//! - every other op (pointwise, movement, dropout, rope, embedding) runs in the widest
//!   precision among its inputs that depend on a step input, and in fp32 when none does.
//!
//! Two differences from autocast: an input that depends on parameters only (a bias, a
//! scale) is cast to the op's precision instead of promoting it, so `x @ w + b` stays in
//! bf16 as `torch.nn.Linear` does under autocast; and the losses read low-precision inputs
//! as they are (cross-entropy its logits; mse its operands, promoted to the wider of the
//! two), since their kernels compute in fp32 and return an fp32 loss: an fp32 copy of the
//! logits would hold the same values and, saved for backward, cost 4 bytes per logit
//! (1.6 GB for GPT-2 at B=8, T=1024). Casts are inserted only where a value
//! crosses between precisions, and each value is cast at most once per precision, so a
//! parameter's low-precision copy is made once per step and shared by all its readers.
//! Parameters stay fp32 (master weights); their gradients arrive in fp32 through the
//! backward of the cast. Without master weights (bf16 only) parameters are stored in bf16,
//! so their gradients are bf16 and the optimizer (fp32 moments) rounds each update to bf16.
//! Frozen parameters are stored in the low precision either way: they never update, so an
//! fp32 copy would only be cast down again by every matmul that reads it (ops that compute
//! in fp32, such as norms, read the rounded weight widened back; a bf16 checkpoint loses
//! nothing).
//! For fp16 the loss is multiplied by a persistent loss scale (initially 2^16) before
//! autodiff; the optimizer pass unscales and checks the gradients.

use super::StageError;
use crate::ir::*;
use crate::settings::Precision;
use std::collections::HashMap;

/// `torch.amp.GradScaler`'s initial scale.
pub const INITIAL_LOSS_SCALE: f32 = 65536.0;

/// The rewritten forward graph and what autodiff should differentiate.
#[derive(Debug, Clone)]
pub struct MixedPrecision {
    pub graph: Graph,
    /// The value to differentiate: the loss, or the loss times the loss scale.
    pub objective: ValueId,
    /// The persistent fp16 loss scale (f32[]), when the precision needs one.
    pub loss_scale: Option<ValueId>,
}

use crate::ops::rules::PrecisionClass as Rule;

fn internal(e: TypeError) -> StageError {
    StageError::internal("precision", e.message)
}

struct Rewriter<'a> {
    old: &'a Graph,
    graph: Graph,
    /// Old value -> new value.
    map: Vec<ValueId>,
    /// Whether an old value depends on a step input.
    from_input: Vec<bool>,
    casts: HashMap<(ValueId, DType), ValueId>,
}

impl Rewriter<'_> {
    /// `v` (a new value) in `dtype`, inserting one cast per value and precision.
    fn cast(&mut self, v: ValueId, dtype: DType, origin: &Origin) -> Result<ValueId, StageError> {
        let ty = &self.graph.node(v).ty;
        if !ty.dtype.is_float() || ty.dtype == dtype {
            return Ok(v);
        }
        if let Some(&c) = self.casts.get(&(v, dtype)) {
            return Ok(c);
        }
        let c = self
            .graph
            .add(Op::Cast { to: dtype }, vec![v], origin)
            .map_err(internal)?;
        self.casts.insert((v, dtype), c);
        Ok(c)
    }

    /// The precision node `v`'s op runs in.
    fn target(&self, v: ValueId, low: DType) -> Option<DType> {
        let node = self.old.node(v);
        match crate::ops::family(&node.op).behaviour(&node.op).precision {
            Rule::Low => Some(low),
            Rule::Fp32 => Some(DType::F32),
            Rule::AsIs => None,
            Rule::Widest => {
                let dtypes = node
                    .inputs
                    .iter()
                    .filter(|i| self.from_input[i.index()])
                    .map(|i| self.graph.node(self.map[i.index()]).ty.dtype)
                    .filter(|d| d.is_float());
                dtypes.max_by_key(|d| d.size())
            }
        }
    }

    fn copy(&mut self, v: ValueId, low: DType, master_weights: bool) -> Result<(), StageError> {
        let node = self.old.node(v);
        let op = match &node.op {
            Op::Param {
                name,
                ty,
                init,
                frozen,
                buffer: false,
            } if !master_weights || *frozen => Op::Param {
                name: name.clone(),
                ty: ty.with_dtype(low),
                init: *init,
                frozen: *frozen,
                buffer: false,
            },
            op => op.clone(),
        };
        let origin = node.origin();
        let target = self.target(v, low);
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for &i in &node.inputs {
            let new = self.map[i.index()];
            inputs.push(match target {
                Some(dtype) => self.cast(new, dtype, &origin)?,
                None => new,
            });
        }
        let new = self.graph.add(op, inputs, &origin).map_err(internal)?;
        self.map.push(new);
        Ok(())
    }
}

/// Rewrites a forward graph whose loss is `loss` for `precision`, storing parameters in the
/// low precision unless `master_weights` (frozen ones always); fp32 returns it unchanged.
pub fn run(
    graph: &Graph,
    loss: ValueId,
    precision: Precision,
    master_weights: bool,
) -> Result<MixedPrecision, StageError> {
    let low = match precision {
        Precision::Fp32 => {
            return Ok(MixedPrecision {
                graph: graph.clone(),
                objective: loss,
                loss_scale: None,
            })
        }
        Precision::Bf16 => DType::BF16,
        Precision::Fp16 => DType::F16,
    };
    let mut rw = Rewriter {
        old: graph,
        graph: Graph::new(),
        map: Vec::with_capacity(graph.len()),
        from_input: graph.input_dependent(),
        casts: HashMap::new(),
    };
    for v in graph.values() {
        rw.copy(v, low, master_weights)?;
    }
    let origin = Origin {
        span: graph.node(loss).span,
        scope: String::new(),
        phase: Phase::Forward,
    };
    let new_loss = rw.cast(rw.map[loss.index()], DType::F32, &origin)?;
    let mut out = rw.graph;
    out.outputs = graph
        .outputs
        .iter()
        .map(|(name, v)| {
            let new = if *v == loss {
                new_loss
            } else {
                rw.map[v.index()]
            };
            (name.clone(), new)
        })
        .collect();
    if precision != Precision::Fp16 {
        return Ok(MixedPrecision {
            graph: out,
            objective: new_loss,
            loss_scale: None,
        });
    }
    let scale = out
        .add(
            Op::OptimState {
                name: "loss_scale".into(),
                ty: TensorType::new(DType::F32, vec![]),
                init: INITIAL_LOSS_SCALE,
            },
            vec![],
            &origin,
        )
        .map_err(internal)?;
    let objective = out
        .add(Op::Binary(BinaryFn::Mul), vec![new_loss, scale], &origin)
        .map_err(internal)?;
    Ok(MixedPrecision {
        graph: out,
        objective,
        loss_scale: Some(scale),
    })
}
