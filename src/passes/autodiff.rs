//! Reverse-mode autodiff as a graph rewrite: appends, for every forward node on a path from
//! a parameter to the loss, the backward ops of its vector-Jacobian product. Backward values
//! are ordinary graph values; integer values never get gradients; a value used several times
//! (tied embeddings) gets the sum of its gradients.

use super::StageError;
use crate::ir::*;
use std::collections::HashMap;

/// The graph extended with backward nodes, and each parameter's gradient value.
#[derive(Debug, Clone)]
pub struct Differentiated {
    pub graph: Graph,
    /// `(parameter, gradient)` for every parameter the loss depends on, in parameter order.
    pub grads: Vec<(ValueId, ValueId)>,
}

/// The graph being extended with backward nodes; backward rules add their ops through it.
pub struct Rewriter {
    graph: Graph,
    origin: Origin,
}

impl Rewriter {
    fn add(&mut self, op: Op, inputs: Vec<ValueId>) -> Result<ValueId, StageError> {
        self.graph
            .add(op, inputs, &self.origin)
            .map_err(|e| StageError::internal("autodiff", e.message))
    }

    fn shape(&self, v: ValueId) -> Vec<usize> {
        self.graph.node(v).ty.shape.clone()
    }

    /// Reduces a broadcast gradient back to `like`'s shape (no node when already equal).
    fn sum_to(&mut self, g: ValueId, like: ValueId) -> Result<ValueId, StageError> {
        let target = self.shape(like);
        if self.shape(g) == target {
            return Ok(g);
        }
        let summed_shape = {
            let gs = self.shape(g);
            let pad = gs.len() - target.len();
            gs.iter()
                .enumerate()
                .map(|(i, &d)| {
                    if i < pad || target[i - pad] == 1 {
                        1
                    } else {
                        d
                    }
                })
                .collect::<Vec<_>>()
        };
        let s = self.add(
            Op::SumTo {
                shape: summed_shape.clone(),
            },
            vec![g],
        )?;
        if summed_shape == target {
            Ok(s)
        } else {
            self.add(Op::Reshape { shape: target }, vec![s])
        }
    }

    /// Gradient of a rank-2 weight used by a batched matmul, computed as one 2-D product.
    fn flat_matmul(&mut self, op: Op, a: ValueId, b: ValueId) -> Result<ValueId, StageError> {
        let flat = |r: &mut Rewriter, v: ValueId| -> Result<ValueId, StageError> {
            let s = r.shape(v);
            if s.len() == 2 {
                return Ok(v);
            }
            let last = s[s.len() - 1];
            let rows = s[..s.len() - 1].iter().product();
            r.add(
                Op::Reshape {
                    shape: vec![rows, last],
                },
                vec![v],
            )
        };
        let a = flat(self, a)?;
        let b = flat(self, b)?;
        self.add(op, vec![a, b])
    }

    /// Input gradients of one node given its output gradient `dy`; `None` where an input needs none.
    pub(crate) fn vjp_legacy(
        &mut self,
        y: ValueId,
        dy: ValueId,
        wants: &[bool],
    ) -> Result<Vec<Option<ValueId>>, StageError> {
        let node = self.graph.node(y).clone();
        let x = &node.inputs;
        let mut out: Vec<Option<ValueId>> = vec![None; x.len()];
        let want = |i: usize| wants.get(i).copied().unwrap_or(false);
        macro_rules! set {
            ($i:expr, $e:expr) => {
                if want($i) {
                    out[$i] = Some($e);
                }
            };
        }
        use Op::*;
        match &node.op {
            Input { .. } | Param { .. } | OptimState { .. } | Fill { .. } => {}
            Unary(f) => set!(0, self.add(UnaryBackward(*f), vec![x[0], dy])?),
            Binary(f) => {
                let (a, b) = (x[0], x[1]);
                match f {
                    BinaryFn::Add => {
                        set!(0, self.sum_to(dy, a)?);
                        set!(1, self.sum_to(dy, b)?);
                    }
                    BinaryFn::Sub => {
                        set!(0, self.sum_to(dy, a)?);
                        if want(1) {
                            let n = self.add(Unary(UnaryFn::Neg), vec![dy])?;
                            out[1] = Some(self.sum_to(n, b)?);
                        }
                    }
                    BinaryFn::Mul => {
                        if want(0) {
                            let t = self.add(Binary(BinaryFn::Mul), vec![dy, b])?;
                            out[0] = Some(self.sum_to(t, a)?);
                        }
                        if want(1) {
                            let t = self.add(Binary(BinaryFn::Mul), vec![dy, a])?;
                            out[1] = Some(self.sum_to(t, b)?);
                        }
                    }
                    BinaryFn::Div => {
                        if want(0) {
                            let t = self.add(Binary(BinaryFn::Div), vec![dy, b])?;
                            out[0] = Some(self.sum_to(t, a)?);
                        }
                        if want(1) {
                            let t = self.add(Binary(BinaryFn::Mul), vec![dy, y])?;
                            let t = self.add(Binary(BinaryFn::Div), vec![t, b])?;
                            let t = self.add(Unary(UnaryFn::Neg), vec![t])?;
                            out[1] = Some(self.sum_to(t, b)?);
                        }
                    }
                }
            }
            Affine { scale, .. } => set!(
                0,
                self.add(
                    Affine {
                        scale: *scale,
                        shift: 0.0
                    },
                    vec![dy]
                )?
            ),
            SumTo { .. } => {
                let shape = self.shape(x[0]);
                set!(0, self.add(BroadcastTo { shape }, vec![dy])?)
            }
            BroadcastTo { .. } => set!(0, self.sum_to(dy, x[0])?),
            MaxTo { .. } => set!(0, self.add(MaxToBackward, vec![x[0], y, dy])?),
            Softmax { axis } => set!(0, self.add(SoftmaxBackward { axis: *axis }, vec![y, dy])?),
            LogSoftmax { axis } => set!(
                0,
                self.add(LogSoftmaxBackward { axis: *axis }, vec![y, dy])?
            ),
            Norm { kind, eps } => {
                set!(
                    0,
                    self.add(
                        NormBackwardInput {
                            kind: *kind,
                            eps: *eps
                        },
                        vec![x[0], x[1], dy]
                    )?
                );
                set!(
                    1,
                    self.add(
                        NormBackwardWeight {
                            kind: *kind,
                            eps: *eps
                        },
                        vec![x[0], dy]
                    )?
                );
                set!(2, self.add(NormBackwardBias { kind: *kind }, vec![dy])?);
            }
            Embedding => {
                let rows = self.shape(x[0])[0];
                set!(0, self.add(EmbeddingBackward { rows }, vec![x[1], dy])?)
            }
            CrossEntropy => set!(0, self.add(CrossEntropyBackward, vec![x[0], x[1], dy])?),
            Mse => {
                let da = self.add(MseBackward, vec![x[0], x[1], dy])?;
                set!(1, self.add(Unary(UnaryFn::Neg), vec![da])?);
                set!(0, da);
            }
            Reshape { .. } => {
                let shape = self.shape(x[0]);
                set!(0, self.add(Reshape { shape }, vec![dy])?)
            }
            Permute { perm } => {
                let mut inv = vec![0; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inv[p] = i;
                }
                set!(0, self.add(Permute { perm: inv }, vec![dy])?)
            }
            Slice { axis, start, .. } => {
                let full = self.shape(x[0])[*axis];
                set!(
                    0,
                    self.add(
                        PadSlice {
                            axis: *axis,
                            start: *start,
                            full
                        },
                        vec![dy]
                    )?
                )
            }
            PadSlice { axis, start, .. } => {
                let len = self.shape(x[0])[*axis];
                set!(
                    0,
                    self.add(
                        Slice {
                            axis: *axis,
                            start: *start,
                            end: start + len
                        },
                        vec![dy]
                    )?
                )
            }
            Concat { axis } => {
                let mut start = 0;
                for (i, &part) in x.iter().enumerate() {
                    let len = self.shape(part)[*axis];
                    set!(
                        i,
                        self.add(
                            Slice {
                                axis: *axis,
                                start,
                                end: start + len
                            },
                            vec![dy]
                        )?
                    );
                    start += len;
                }
            }
            MatMul { ta, tb } => {
                let (a, b) = (x[0], x[1]);
                if want(0) {
                    let g = if *ta {
                        self.add(MatMul { ta: *tb, tb: true }, vec![b, dy])?
                    } else {
                        self.add(
                            MatMul {
                                ta: false,
                                tb: !*tb,
                            },
                            vec![dy, b],
                        )?
                    };
                    out[0] = Some(self.sum_to(g, a)?);
                }
                if want(1) {
                    let flat = self.shape(b).len() == 2 && self.shape(a).len() > 2;
                    let g = match (*tb, flat && !*ta) {
                        (false, true) => self.flat_matmul(
                            MatMul {
                                ta: true,
                                tb: false,
                            },
                            a,
                            dy,
                        )?,
                        (true, true) => self.flat_matmul(
                            MatMul {
                                ta: true,
                                tb: false,
                            },
                            dy,
                            a,
                        )?,
                        (false, false) => self.add(
                            MatMul {
                                ta: !*ta,
                                tb: false,
                            },
                            vec![a, dy],
                        )?,
                        (true, false) => self.add(MatMul { ta: true, tb: *ta }, vec![dy, a])?,
                    };
                    out[1] = Some(self.sum_to(g, b)?);
                }
            }
            Conv2d(conv) => {
                let xs = self.shape(x[0]);
                let ws = self.shape(x[1]);
                set!(
                    0,
                    self.add(
                        Conv2dBackwardInput {
                            conv: *conv,
                            input: [xs[2], xs[3]]
                        },
                        vec![dy, x[1]]
                    )?
                );
                set!(
                    1,
                    self.add(
                        Conv2dBackwardWeight {
                            conv: *conv,
                            kernel: [ws[2], ws[3]]
                        },
                        vec![x[0], dy]
                    )?
                );
            }
            MaxPool2d(p) => set!(0, self.add(MaxPool2dBackward(*p), vec![x[0], dy])?),
            AvgPool2d(p) => {
                let xs = self.shape(x[0]);
                set!(
                    0,
                    self.add(
                        AvgPool2dBackward {
                            pool: *p,
                            input: [xs[2], xs[3]]
                        },
                        vec![dy]
                    )?
                )
            }
            Dropout { p, seed } => set!(0, self.add(Dropout { p: *p, seed: *seed }, vec![dy])?),
            Attention(attn) => {
                for (i, which) in [AttnInput::Q, AttnInput::K, AttnInput::V]
                    .into_iter()
                    .enumerate()
                {
                    set!(
                        i,
                        self.add(
                            AttentionBackward { attn: *attn, which },
                            vec![x[0], x[1], x[2], dy]
                        )?
                    );
                }
            }
            Cast { .. } => {
                let to = self.graph.node(x[0]).ty.dtype;
                set!(0, self.add(Cast { to }, vec![dy])?)
            }
            Rope {
                heads,
                base,
                inverse,
            } => set!(
                0,
                self.add(
                    Rope {
                        heads: *heads,
                        base: *base,
                        inverse: !inverse
                    },
                    vec![dy]
                )?
            ),
            UnaryBackward(_)
            | SoftmaxBackward { .. }
            | LogSoftmaxBackward { .. }
            | MaxToBackward
            | NormBackwardInput { .. }
            | NormBackwardWeight { .. }
            | NormBackwardBias { .. }
            | EmbeddingBackward { .. }
            | CrossEntropyBackward
            | MseBackward
            | Conv2dBackwardInput { .. }
            | Conv2dBackwardWeight { .. }
            | MaxPool2dBackward(_)
            | AvgPool2dBackward { .. }
            | AttentionBackward { .. }
            | ClipCoefficient { .. }
            | UnscaleGrads
            | LossScaleUpdate { .. }
            | AccumulateGrad { .. }
            | AdamW(_)
            | Sgd(_) => {
                return Err(StageError::internal(
                    "autodiff",
                    format!(
                        "{y}: cannot differentiate `{}` (not a forward op)",
                        node.op.name()
                    ),
                ))
            }
        }
        Ok(out)
    }
}

/// Differentiates `loss` with respect to every parameter it depends on.
pub fn run(graph: &Graph, loss: ValueId) -> Result<Differentiated, StageError> {
    let n = graph.len();
    let mut requires = vec![false; n];
    for v in graph.values() {
        let node = graph.node(v);
        requires[v.index()] = node.ty.dtype.is_float()
            && (matches!(node.op, Op::Param { .. })
                || node.inputs.iter().any(|i| requires[i.index()]));
    }
    let mut rw = Rewriter {
        graph: graph.clone(),
        origin: Origin {
            span: Span::default(),
            scope: String::new(),
            phase: Phase::Backward,
        },
    };
    let mut grads: HashMap<ValueId, ValueId> = HashMap::new();
    if requires[loss.index()] {
        let seed_ty = graph.node(loss).ty.clone();
        rw.origin.span = graph.node(loss).span;
        let seed = rw.add(
            Op::Fill {
                value: 1.0,
                ty: seed_ty,
            },
            vec![],
        )?;
        grads.insert(loss, seed);
    }
    for y in (0..=loss.index()).rev().map(|i| ValueId(i as u32)) {
        let Some(&dy) = grads.get(&y) else { continue };
        let node = graph.node(y);
        if node.inputs.is_empty() {
            continue;
        }
        rw.origin.span = node.span;
        rw.origin.scope = node.scope.clone();
        let wants: Vec<bool> = node.inputs.iter().map(|i| requires[i.index()]).collect();
        let input_grads = { crate::ops::family(&node.op).vjp(&node.op, &mut rw, y, dy, &wants)? };
        for (&x, g) in node.inputs.iter().zip(input_grads) {
            let Some(g) = g else { continue };
            let total = match grads.get(&x) {
                Some(&prev) => rw.add(Op::Binary(BinaryFn::Add), vec![prev, g])?,
                None => g,
            };
            grads.insert(x, total);
        }
    }
    let grads = graph
        .params()
        .into_iter()
        .filter_map(|p| grads.get(&p).map(|&g| (p, g)))
        .collect();
    Ok(Differentiated {
        graph: rw.graph,
        grads,
    })
}
