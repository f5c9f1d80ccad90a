//! `kernel_for`: the per-op choice of template, constants and launch geometry.

use super::build::*;
use super::{ctype, CodegenError, Kernel, KernelParam};
use crate::ir::infer::{infer, norm_channels};
use crate::ir::{
    AttnInput, AttnParams, BinaryFn, ConvParams, DType, NormKind, Op, PoolParams, TensorType,
    UnaryFn,
};

type Result<T> = std::result::Result<T, CodegenError>;

use KernelParam::{Input as In, MicroStep, Output as Out, Step, Stream};

/// Checked accessors over an op's input types.
pub struct Args<'a> {
    pub op: &'a Op,
    pub inputs: &'a [TensorType],
    pub output: &'a TensorType,
}

impl Args<'_> {
    fn name(&self) -> &'static str {
        self.op.name()
    }

    fn err(&self, message: impl Into<String>) -> CodegenError {
        CodegenError::Type {
            op: self.name(),
            message: message.into(),
        }
    }

    fn at(&self, i: usize) -> Result<&TensorType> {
        self.inputs
            .get(i)
            .ok_or_else(|| self.err(format!("missing input {i}")))
    }

    fn rank(&self, i: usize, rank: usize) -> Result<&TensorType> {
        let t = self.at(i)?;
        if t.shape.len() != rank {
            return Err(self.err(format!("input {i} needs rank {rank}, found {t}")));
        }
        Ok(t)
    }

    fn ty(&self, i: usize) -> Result<&'static str> {
        Ok(ctype(self.at(i)?.dtype))
    }

    fn out_ty(&self) -> &'static str {
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

    fn unsupported(&self, message: impl Into<String>) -> CodegenError {
        CodegenError::Unsupported {
            op: self.name(),
            message: message.into(),
        }
    }
}

fn u(v: usize) -> u64 {
    v as u64
}

fn numel(shape: &[usize]) -> u64 {
    shape.iter().map(|&d| u(d)).product()
}

/// Row-major strides of `shape`, in elements.
fn contiguous(shape: &[usize]) -> Vec<u64> {
    let mut s = vec![1u64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * u(shape[d + 1]);
    }
    s
}

/// Strides of contiguous `shape` viewed (numpy broadcasting, right-aligned) at `out` rank:
/// 0 on missing and size-1 dims.
fn bcast_strides(shape: &[usize], out: &[usize]) -> Vec<u64> {
    let cs = contiguous(shape);
    let pad = out.len().saturating_sub(shape.len());
    (0..out.len())
        .map(|d| {
            if d < pad {
                0
            } else {
                let k = d - pad;
                if shape[k] == 1 {
                    0
                } else {
                    cs[k]
                }
            }
        })
        .collect()
}

/// Splits `shape` around `axis` into (outer, extent, inner).
fn axis_split(shape: &[usize], axis: usize) -> (u64, u64, u64) {
    let outer = numel(&shape[..axis.min(shape.len())]);
    let n = shape.get(axis).map_or(1, |&d| u(d));
    let inner = numel(shape.get(axis + 1..).unwrap_or(&[]));
    (outer, n, inner)
}

fn pow2_block(n: u64, lo: u32, hi: u32) -> u32 {
    let mut b = lo;
    while u64::from(b) < n && b < hi {
        b *= 2;
    }
    b
}

/// Reduction geometry of `x` onto the dims where `keep` is true: OUT/OST map an output
/// index to its group base, RSH/RST walk the group. Returns (lines, groups, group size).
fn reduce_cfg(x: &[usize], keep: &[bool]) -> (Vec<String>, u64, u64) {
    let xs = contiguous(x);
    let out: Vec<u64> = x
        .iter()
        .zip(keep)
        .map(|(&d, &k)| if k { u(d) } else { 1 })
        .collect();
    let ost: Vec<u64> = xs
        .iter()
        .zip(keep)
        .map(|(&s, &k)| if k { s } else { 0 })
        .collect();
    let rsh: Vec<u64> = x
        .iter()
        .zip(keep)
        .filter(|(_, &k)| !k)
        .map(|(&d, _)| u(d))
        .collect();
    let rst: Vec<u64> = xs
        .iter()
        .zip(keep)
        .filter(|(_, &k)| !k)
        .map(|(&s, _)| s)
        .collect();
    let (n, r) = (out.iter().product::<u64>(), rsh.iter().product::<u64>());
    let lines = vec![
        c_u64("N", n),
        c_u64("R", r),
        c_dims("OUT", &out),
        c_dims("OST", &ost),
        c_dims("RSH", &rsh),
        c_dims("RST", &rst),
    ];
    (lines, n, r)
}

fn unary_code(f: UnaryFn) -> i64 {
    match f {
        UnaryFn::Neg => 0,
        UnaryFn::Exp => 1,
        UnaryFn::Log => 2,
        UnaryFn::Sqrt => 3,
        UnaryFn::Rsqrt => 4,
        UnaryFn::Tanh => 5,
        UnaryFn::Sigmoid => 6,
        UnaryFn::Relu => 7,
        UnaryFn::GeluTanh => 8,
        UnaryFn::GeluErf => 9,
        UnaryFn::Silu => 10,
        UnaryFn::Erf => 11,
    }
}

fn binary_code(f: BinaryFn) -> i64 {
    match f {
        BinaryFn::Add => 0,
        BinaryFn::Sub => 1,
        BinaryFn::Mul => 2,
        BinaryFn::Div => 3,
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

pub(crate) fn build_legacy(a: &Args) -> Result<Kernel> {
    use Launch::{Elementwise, Grid, PerBlock};
    use Op::*;
    let out = a.output;
    let n_out = out.numel();
    match a.op {
        Input { .. } | Param { .. } | OptimState { .. } => Err(a.err("source ops have no kernel")),
        Fill { value, .. } => Ok(templated(
            "fill",
            &[POINTWISE],
            vec![c_u64("N", n_out), c_f32("VALUE", *value)],
            ("fill_kernel", &[a.out_ty()], 0),
            Elementwise(n_out),
        )),
        Unary(f) => Ok(templated(
            "unary",
            &[POINTWISE],
            vec![c_u64("N", n_out), c_int("OP", unary_code(*f))],
            ("unary_kernel", &[a.ty(0)?], 1),
            Elementwise(n_out),
        )),
        UnaryBackward(f) => Ok(templated(
            "unary_backward",
            &[POINTWISE],
            vec![c_u64("N", n_out), c_int("OP", unary_code(*f))],
            ("unary_backward_kernel", &[a.ty(0)?, a.ty(1)?], 2),
            Elementwise(n_out),
        )),
        Binary(f) => {
            let (x, y) = (a.at(0)?, a.at(1)?);
            let lines = vec![
                c_u64("N", n_out),
                c_int("OP", binary_code(*f)),
                c_dims("OUT", &dims(&out.shape)),
                c_dims("SA", &bcast_strides(&x.shape, &out.shape)),
                c_dims("SB", &bcast_strides(&y.shape, &out.shape)),
            ];
            let entry = ("binary_kernel", &[a.out_ty()][..], 2);
            Ok(templated(
                "binary",
                &[POINTWISE],
                lines,
                entry,
                Elementwise(n_out),
            ))
        }
        Affine { scale, shift } => Ok(templated(
            "affine",
            &[POINTWISE],
            vec![
                c_u64("N", n_out),
                c_f32("SCALE", *scale),
                c_f32("SHIFT", *shift),
            ],
            ("affine_kernel", &[a.out_ty()], 1),
            Elementwise(n_out),
        )),
        SumTo { shape } => {
            let x = a.at(0)?;
            let pad = x.shape.len().saturating_sub(shape.len());
            let keep: Vec<bool> = (0..x.shape.len())
                .map(|d| d >= pad && shape[d - pad] == x.shape[d])
                .collect();
            reduce(a, "sum_to", &x.shape, &keep, false)
        }
        MaxTo { shape } => {
            let x = a.at(0)?;
            let keep: Vec<bool> = shape.iter().zip(&x.shape).map(|(s, d)| s == d).collect();
            reduce(a, "max_to", &x.shape, &keep, true)
        }
        MaxToBackward => {
            let (x, y) = (a.at(0)?, a.at(1)?);
            let keep: Vec<bool> = y.shape.iter().zip(&x.shape).map(|(s, d)| s == d).collect();
            let (lines, groups, r) = reduce_cfg(&x.shape, &keep);
            Ok(templated(
                "max_to_backward",
                &[REDUCE],
                lines,
                ("max_to_backward_kernel", &[a.ty(0)?, a.ty(1)?, a.ty(2)?], 3),
                PerBlock(groups, pow2_block(r, 32, 256)),
            ))
        }
        BroadcastTo { shape } => {
            let x = a.at(0)?;
            gather(
                a,
                "broadcast_to",
                &dims(shape),
                &bcast_strides(&x.shape, shape),
                0,
            )
        }
        Reshape { .. } => gather(a, "reshape", &[n_out], &[1], 0),
        Permute { perm } => {
            let xs = contiguous(&a.at(0)?.shape);
            let st: Vec<u64> = perm.iter().map(|&p| xs[p]).collect();
            gather(a, "permute", &dims(&out.shape), &st, 0)
        }
        Slice { axis, start, .. } => {
            let xs = contiguous(&a.at(0)?.shape);
            gather(a, "slice", &dims(&out.shape), &xs, u(*start) * xs[*axis])
        }
        PadSlice { axis, start, full } => {
            let x = a.at(0)?;
            let (outer, len, inner) = axis_split(&x.shape, *axis);
            Ok(templated(
                "pad_slice",
                &[MOVEMENT],
                vec![
                    c_u64("N", n_out),
                    c_u64("OUTER", outer),
                    c_u64("LEN", len),
                    c_u64("INNER", inner),
                    c_u64("FULL", u(*full)),
                    c_u64("START", u(*start)),
                ],
                ("pad_slice_kernel", &[a.out_ty()], 1),
                Elementwise(n_out),
            ))
        }
        Concat { axis } => {
            let (_, total, inner) = axis_split(&out.shape, *axis);
            let mut k = Gen::new("concat", &[MOVEMENT]);
            let mut at = 0u64;
            for (i, t) in a.inputs.iter().enumerate() {
                let w = u(t.shape[*axis]) * inner;
                k.cfg(
                    &format!("Cfg{i}"),
                    vec![
                        c_u64("N", t.numel()),
                        c_u64("WIDTH", w),
                        c_u64("TOTAL", total * inner),
                        c_u64("AT", at),
                    ],
                );
                k.call(format!(
                    "concat_part<{}, Cfg{i}>(arena, in{i}, out)",
                    a.out_ty()
                ));
                k.params(&[In(i)]);
                at += w;
            }
            k.params(&[Out]);
            k.elementwise(n_out);
            Ok(k.finish())
        }
        Softmax { axis } | LogSoftmax { axis } => {
            let log = matches!(a.op, LogSoftmax { .. });
            let (lines, launch) = softmax_cfg(&out.shape, *axis, log);
            let family = if log { "log_softmax" } else { "softmax" };
            let entry = ("softmax_kernel", &[a.out_ty()][..], 1);
            Ok(templated(family, &[SOFTMAX], lines, entry, launch))
        }
        SoftmaxBackward { axis } | LogSoftmaxBackward { axis } => {
            let log = matches!(a.op, LogSoftmaxBackward { .. });
            let (lines, launch) = softmax_cfg(&out.shape, *axis, log);
            let family = if log {
                "log_softmax_backward"
            } else {
                "softmax_backward"
            };
            let entry = ("softmax_backward_kernel", &[a.ty(0)?, a.ty(1)?][..], 2);
            Ok(templated(family, &[SOFTMAX], lines, entry, launch))
        }
        Norm { kind, eps } => {
            let x = a.at(0)?;
            let has_bias = a.inputs.len() == 3;
            let (lines, groups, gsize) = norm_cfg(*kind, *eps, &x.shape, has_bias);
            let b = if has_bias { "in2" } else { "in1" };
            let call = format!(
                "norm_kernel<{}, {}, Cfg>(arena, in0, in1, {b}, out)",
                a.ty(0)?,
                a.ty(1)?
            );
            let mut p = vec![In(0), In(1)];
            if has_bias {
                p.push(In(2));
            }
            p.push(Out);
            let launch = PerBlock(groups, pow2_block(gsize, 32, 512));
            Ok(single("norm", &[NORM], lines, call, &p, launch))
        }
        NormBackwardInput { kind, eps } => {
            let x = a.at(0)?;
            let (lines, groups, gsize) = norm_cfg(*kind, *eps, &x.shape, false);
            Ok(templated(
                "norm_backward_input",
                &[NORM],
                lines,
                (
                    "norm_backward_input_kernel",
                    &[a.ty(0)?, a.ty(1)?, a.ty(2)?],
                    3,
                ),
                PerBlock(groups, pow2_block(gsize, 32, 512)),
            ))
        }
        NormBackwardWeight { kind, eps } => {
            let x = a.at(0)?;
            let (lines, _, gsize) = norm_cfg(*kind, *eps, &x.shape, false);
            let ch = u(norm_channels(*kind, &x.shape));
            let launch = match kind {
                NormKind::Layer | NormKind::Rms => {
                    let block = pow2_block(ch, 32, 256);
                    Grid([ch.div_ceil(u64::from(block)), 1, 1], block)
                }
                NormKind::Batch | NormKind::Group(_) => PerBlock(ch, pow2_block(gsize, 32, 256)),
            };
            Ok(templated(
                "norm_backward_weight",
                &[NORM],
                lines,
                (
                    "norm_backward_weight_kernel",
                    &[a.ty(0)?, a.ty(1)?, a.out_ty()],
                    2,
                ),
                launch,
            ))
        }
        NormBackwardBias { kind } => {
            let x = a.at(0)?;
            let keep: Vec<bool> = (0..x.shape.len())
                .map(|d| match kind {
                    NormKind::Layer | NormKind::Rms => d + 1 == x.shape.len(),
                    NormKind::Batch | NormKind::Group(_) => d == 1,
                })
                .collect();
            reduce(a, "norm_backward_bias", &x.shape, &keep, false)
        }
        Embedding => {
            let table = a.rank(0, 2)?;
            Ok(templated(
                "embedding",
                &[EMBEDDING],
                vec![
                    c_u64("N", n_out),
                    c_u64("D", u(table.shape[1])),
                    c_u64("ROWS", u(table.shape[0])),
                ],
                ("embedding_kernel", &[a.out_ty()], 2),
                Elementwise(n_out),
            ))
        }
        EmbeddingBackward { rows } => {
            let (ids, dy) = (a.at(0)?, a.at(1)?);
            let d = u(out.shape[1]);
            if numel(&ids.shape) * d != dy.numel() {
                return Err(a.err(format!("dy {dy} does not match ids {ids}")));
            }
            let block = pow2_block(d, 32, 256);
            Ok(templated(
                "embedding_backward",
                &[EMBEDDING],
                vec![
                    c_u64("D", d),
                    c_u64("ROWS", u(*rows)),
                    c_u64("NIDS", ids.numel()),
                ],
                ("embedding_backward_kernel", &[a.ty(1)?, a.out_ty()], 2),
                Grid(
                    [d.div_ceil(u64::from(block)), u(*rows).min(65535), 1],
                    block,
                ),
            ))
        }
        CrossEntropy => {
            let (rows, cl) = rows_classes(&a.at(0)?.shape);
            Ok(templated(
                "cross_entropy",
                &[LOSS],
                vec![c_u64("ROWS", rows), c_u64("CL", cl)],
                ("cross_entropy_kernel", &[a.ty(0)?], 2),
                Grid([1, 1, 1], pow2_block(cl, 32, 1024)),
            ))
        }
        CrossEntropyBackward => {
            let (rows, cl) = rows_classes(&a.at(0)?.shape);
            Ok(templated(
                "cross_entropy_backward",
                &[LOSS],
                vec![c_u64("ROWS", rows), c_u64("CL", cl), c_type("TL", a.ty(2)?)],
                ("cross_entropy_backward_kernel", &[a.ty(0)?], 3),
                PerBlock(rows, pow2_block(cl, 32, 256)),
            ))
        }
        Mse => Ok(templated(
            "mse",
            &[LOSS],
            vec![c_u64("N", a.at(0)?.numel())],
            ("mse_kernel", &[a.ty(0)?], 2),
            Grid([1, 1, 1], 1024),
        )),
        MseBackward => Ok(templated(
            "mse_backward",
            &[LOSS],
            vec![c_u64("N", n_out), c_type("TL", a.ty(2)?)],
            ("mse_backward_kernel", &[a.ty(0)?], 3),
            Elementwise(n_out),
        )),
        MatMul { ta, tb } => matmul(a, *ta, *tb),
        Conv2d(c) => {
            let (x, w) = (a.at(0)?, a.at(1)?);
            conv(a, "conv2d", c, &x.shape, &w.shape, &out.shape)
        }
        Conv2dBackwardInput { conv: c, .. } => {
            let (dy, w) = (a.at(0)?, a.at(1)?);
            conv(
                a,
                "conv2d_backward_input",
                c,
                &out.shape,
                &w.shape,
                &dy.shape,
            )
        }
        Conv2dBackwardWeight { conv: c, .. } => {
            let (x, dy) = (a.at(0)?, a.at(1)?);
            conv(
                a,
                "conv2d_backward_weight",
                c,
                &x.shape,
                &out.shape,
                &dy.shape,
            )
        }
        MaxPool2d(p) | AvgPool2d(p) => {
            let max = matches!(a.op, MaxPool2d(_));
            let x = a.at(0)?;
            Ok(templated(
                if max { "max_pool2d" } else { "avg_pool2d" },
                &[POOL],
                pool_cfg(p, &x.shape, &out.shape, max, n_out),
                ("pool_kernel", &[a.ty(0)?], 1),
                Elementwise(n_out),
            ))
        }
        MaxPool2dBackward(p) => {
            let (x, dy) = (a.at(0)?, a.at(1)?);
            Ok(templated(
                "max_pool2d_backward",
                &[POOL],
                pool_cfg(p, &x.shape, &dy.shape, true, n_out),
                ("pool_backward_kernel", &[a.ty(0)?, a.ty(1)?], 2),
                Elementwise(n_out),
            ))
        }
        AvgPool2dBackward { pool, .. } => {
            let dy = a.at(0)?;
            // The template's first input (the forward x) is unread for average pooling.
            let call = format!(
                "pool_backward_kernel<{}, {}, Cfg>(arena, in0, in0, out)",
                a.out_ty(),
                a.ty(0)?
            );
            Ok(single(
                "avg_pool2d_backward",
                &[POOL],
                pool_cfg(pool, &out.shape, &dy.shape, false, n_out),
                call,
                &[In(0), Out],
                Elementwise(n_out),
            ))
        }
        Dropout { p, seed } => Ok(single(
            "dropout",
            &[RNG],
            vec![c_u64("N", n_out), c_f32("P", *p), c_u64("SEED", *seed)],
            format!(
                "dropout_kernel<{}, Cfg>(arena, in0, out, stream)",
                a.out_ty()
            ),
            &[In(0), Out, Stream],
            Elementwise(n_out),
        )),
        Attention(p) => attention(a, p, None),
        AttentionBackward { attn, which } => attention(a, attn, Some(*which)),
        Rope {
            heads,
            base,
            inverse,
        } => {
            let x = a.rank(0, 3)?;
            let (b, t, w) = (u(x.shape[0]), u(x.shape[1]), u(x.shape[2]));
            let hd = w / u(*heads);
            Ok(templated(
                "rope",
                &[ROPE],
                vec![
                    c_u64("ROWS", b * t),
                    c_u64("T", t),
                    c_u64("HEADS", u(*heads)),
                    c_u64("HD", hd),
                    c_f32("BASE", *base),
                    c_bool("INVERSE", *inverse),
                ],
                ("rope_kernel", &[a.out_ty()], 1),
                Elementwise(b * t * w / 2),
            ))
        }
        ClipCoefficient { max_norm, scaled } => {
            let grads = a.inputs.len() - usize::from(*scaled);
            let mut k = multi_tensor_reduce(a, "clip_coefficient", "clip_accum", 0..grads);
            k.cfg(
                "Cfg",
                vec![c_f32("MAX_NORM", *max_norm), c_bool("SCALED", *scaled)],
            );
            let mul = if *scaled {
                k.params(&[In(grads)]);
                format!("in{grads}")
            } else {
                "0ull".to_string()
            };
            k.call(format!("clip_finish<Cfg>(arena, {mul}, out, acc)"));
            k.params(&[Out]);
            Ok(k.finish())
        }
        UnscaleGrads => {
            let mut k = multi_tensor_reduce(a, "unscale_grads", "unscale_accum", 1..a.inputs.len());
            k.params(&[In(0), Out]);
            k.call("unscale_finish(arena, in0, out, acc)".to_string());
            Ok(k.finish())
        }
        LossScaleUpdate { growth_interval } => Ok(single(
            "loss_scale_update",
            &[OPTIM],
            vec![c_u64("GROWTH", u64::from(*growth_interval))],
            "loss_scale_update_kernel<Cfg>(arena, in0, in1, in2)".to_string(),
            &[In(0), In(1), In(2)],
            Launch::Grid([1, 1, 1], 32),
        )),
        Cast { to } => Ok(super::cast_kernel(a.at(0)?.dtype, *to, n_out)),
        AccumulateGrad { micro_steps } => {
            let g = a.at(1)?;
            Ok(single(
                "accumulate_grad",
                &[OPTIM],
                vec![
                    c_u64("N", g.numel()),
                    c_f32("SCALE", 1.0 / *micro_steps as f32),
                ],
                format!(
                    "accumulate_grad_kernel<{}, Cfg>(arena, in0, in1, micro)",
                    ctype(g.dtype)
                ),
                &[In(0), In(1), MicroStep],
                Elementwise(g.numel()),
            ))
        }
        AdamW(h) => {
            let (tm, tv) = (a.ty(2)?, a.ty(3)?);
            if tm != tv {
                return Err(a.err("m and v must share a dtype"));
            }
            let hyper = vec![
                c_f32("LR", h.lr),
                c_f32("B1", h.beta1),
                c_f32("B2", h.beta2),
                c_f32("EPS", h.eps),
                c_f32("WD", h.weight_decay),
            ];
            optimizer(a, "adamw", 2, hyper, [a.ty(0)?, a.ty(1)?, tm])
        }
        Sgd(h) => {
            let hyper = vec![
                c_f32("LR", h.lr),
                c_f32("MOMENTUM", h.momentum),
                c_f32("WD", h.weight_decay),
            ];
            optimizer(a, "sgd", 1, hyper, [a.ty(0)?, a.ty(1)?, a.ty(2)?])
        }
    }
}

/// How a kernel is launched: the `Gen` method of the same name, or `Gen::launch`.
enum Launch {
    Elementwise(u64),
    PerBlock(u64, u32),
    Grid([u64; 3], u32),
}

/// A kernel with one `Cfg` struct of `lines` and the one entry statement `call`, taking
/// `params` after the arena.
fn single(
    family: &'static str,
    files: &[&'static str],
    lines: Vec<String>,
    call: String,
    params: &[KernelParam],
    launch: Launch,
) -> Kernel {
    let mut k = Gen::new(family, files);
    k.cfg("Cfg", lines);
    k.call(call);
    k.params(params);
    match launch {
        Launch::Elementwise(n) => k.elementwise(n),
        Launch::PerBlock(items, block) => k.per_block(items, block),
        Launch::Grid(grid, block) => k.launch(grid, block),
    }
    k.finish()
}

/// Entry arguments `in0` .. `in{n-1}`.
fn in_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("in{i}")).collect()
}

/// [`single`] whose statement is `template<types, Cfg>(arena, in0, .., out)` over the first
/// `n_in` inputs, for `entry = (template, types, n_in)`.
fn templated(
    family: &'static str,
    files: &[&'static str],
    lines: Vec<String>,
    (template, types, n_in): (&str, &[&str], usize),
    launch: Launch,
) -> Kernel {
    let mut args = in_names(n_in);
    args.push("out".to_string());
    let mut params: Vec<KernelParam> = (0..n_in).map(In).collect();
    params.push(Out);
    let call = format!(
        "{template}<{}, Cfg>(arena, {})",
        types.join(", "),
        args.join(", ")
    );
    single(family, files, lines, call, &params, launch)
}

/// An optimizer step updating `p` in place from `g` and `states` state tensors, with the
/// clip coefficient as an optional last input; `hyper` are its constants after `N`.
fn optimizer(
    a: &Args,
    family: &'static str,
    states: usize,
    hyper: Vec<String>,
    types: [&str; 3],
) -> Result<Kernel> {
    let n = a.at(0)?.numel();
    let n_in = 2 + states;
    let clip = a.inputs.len() == n_in + 1;
    if clip && a.at(n_in)?.dtype != DType::F32 {
        return Err(a.err("the clip coefficient must be f32 (the kernel reads it as float)"));
    }
    let mut lines = vec![c_u64("N", n)];
    lines.extend(hyper);
    lines.push(c_bool("HAS_CLIP", clip));
    let mut args = in_names(n_in);
    args.push(if clip {
        format!("in{n_in}")
    } else {
        "0ull".to_string()
    });
    let call = format!(
        "{family}_kernel<{}, Cfg>(arena, {}, step)",
        types.join(", "),
        args.join(", ")
    );
    let mut params: Vec<KernelParam> = (0..n_in + usize::from(clip)).map(In).collect();
    params.push(Step);
    Ok(single(
        family,
        &[OPTIM],
        lines,
        call,
        &params,
        Launch::Elementwise(n),
    ))
}

/// A single-block kernel that accumulates `accum<T, CfgI>(arena, inI, acc)` over the inputs
/// in `range` (each becomes a parameter); the caller adds the finishing call.
fn multi_tensor_reduce(
    a: &Args,
    family: &'static str,
    accum: &str,
    range: std::ops::Range<usize>,
) -> Gen {
    let mut k = Gen::new(family, &[OPTIM]);
    k.call("double acc = 0.0".to_string());
    for i in range {
        k.cfg(&format!("Cfg{i}"), vec![c_u64("N", a.inputs[i].numel())]);
        k.call(format!(
            "{accum}<{}, Cfg{i}>(arena, in{i}, acc)",
            ctype(a.inputs[i].dtype)
        ));
        k.params(&[In(i)]);
    }
    k.launch([1, 1, 1], 1024);
    k
}

/// `shape` as u64 dims.
fn dims(shape: &[usize]) -> Vec<u64> {
    shape.iter().map(|&d| u(d)).collect()
}

/// Softmax constants over `axis` of `shape` and the launch: a block per row.
fn softmax_cfg(shape: &[usize], axis: usize, log: bool) -> (Vec<String>, Launch) {
    let (outer, n, inner) = axis_split(shape, axis);
    let lines = vec![
        c_u64("OUTER", outer),
        c_u64("N", n),
        c_u64("INNER", inner),
        c_bool("LOG", log),
    ];
    (
        lines,
        Launch::PerBlock(outer * inner, pow2_block(n, 32, 256)),
    )
}

fn rows_classes(shape: &[usize]) -> (u64, u64) {
    let cl = shape.last().map_or(1, |&c| u(c));
    (numel(shape).checked_div(cl).unwrap_or(0), cl)
}

fn reduce(a: &Args, family: &'static str, x: &[usize], keep: &[bool], max: bool) -> Result<Kernel> {
    let (mut lines, groups, r) = reduce_cfg(x, keep);
    lines.push(c_bool("MAX", max));
    Ok(templated(
        family,
        &[REDUCE],
        lines,
        ("reduce_kernel", &[a.ty(0)?], 1),
        Launch::PerBlock(groups, pow2_block(r, 32, 256)),
    ))
}

fn gather(
    a: &Args,
    family: &'static str,
    dims: &[u64],
    strides: &[u64],
    base: u64,
) -> Result<Kernel> {
    let n = a.output.numel();
    Ok(templated(
        family,
        &[MOVEMENT],
        vec![
            c_u64("N", n),
            c_u64("BASE", base),
            c_dims("OUT", dims),
            c_dims("SX", strides),
        ],
        ("gather_kernel", &[a.out_ty()], 1),
        Launch::Elementwise(n),
    ))
}

/// Norm geometry constants; returns (lines, statistics groups, group size).
fn norm_cfg(kind: NormKind, eps: f32, x: &[usize], has_bias: bool) -> (Vec<String>, u64, u64) {
    let total = numel(x);
    let ch = u(norm_channels(kind, x));
    let (code, nb, s, ng) = match kind {
        NormKind::Layer => (0, 1, 1, 1),
        NormKind::Rms => (1, 1, 1, 1),
        NormKind::Batch => (2, u(x[0]), numel(&x[2..]), 1),
        NormKind::Group(g) => (3, u(x[0]), numel(&x[2..]), u(g)),
    };
    let cpg = ch.checked_div(ng).unwrap_or(1);
    let (groups, gsize) = match kind {
        NormKind::Layer | NormKind::Rms => (total.checked_div(ch).unwrap_or(0), ch),
        NormKind::Batch => (ch, nb * s),
        NormKind::Group(_) => (nb * ng, cpg * s),
    };
    let lines = vec![
        c_int("KIND", code),
        c_u64("GROUPS", groups),
        c_u64("GSIZE", gsize),
        c_u64("CH", ch),
        c_u64("NB", nb),
        c_u64("S", s),
        c_u64("NG", ng),
        c_u64("CPG", cpg),
        c_f32("EPS", eps),
        c_bool("HAS_BIAS", has_bias),
    ];
    (lines, groups, gsize)
}

fn pool_cfg(p: &PoolParams, x: &[usize], y: &[usize], max: bool, n: u64) -> Vec<String> {
    vec![
        c_u64("N", n),
        c_u64("H", u(x[2])),
        c_u64("W", u(x[3])),
        c_u64("HO", u(y[2])),
        c_u64("WO", u(y[3])),
        c_u64("KH", u(p.kernel[0])),
        c_u64("KW", u(p.kernel[1])),
        c_u64("SH", u(p.stride[0])),
        c_u64("SW", u(p.stride[1])),
        c_u64("PH", u(p.padding[0])),
        c_u64("PW", u(p.padding[1])),
        c_bool("MAX", max),
    ]
}

const GEMM_TILE: u64 = 64;

/// The tiled GEMM launch for an `m` x `n` output per batch.
fn gemm_launch(a: &Args, m: u64, n: u64, batch: u64) -> Result<Launch> {
    let (gx, gy) = (n.div_ceil(GEMM_TILE), m.div_ceil(GEMM_TILE));
    if gx > u64::from(u32::MAX >> 1) || gy > 65535 || batch > 65535 {
        return Err(a.unsupported(format!(
            "GEMM grid {gx} x {gy} x {batch} exceeds CUDA limits"
        )));
    }
    Ok(Launch::Grid([gx, gy, batch], 256))
}

fn matmul(a: &Args, ta: bool, tb: bool) -> Result<Kernel> {
    let (x, y, out) = (a.at(0)?, a.at(1)?, a.output);
    let (rx, ry, ro) = (x.shape.len(), y.shape.len(), out.shape.len());
    let (m, n) = (u(out.shape[ro - 2]), u(out.shape[ro - 1]));
    let kd = u(if ta { x.shape[rx - 2] } else { x.shape[rx - 1] });
    let batch = &out.shape[..ro - 2];
    let launch = gemm_launch(a, m, n, numel(batch))?;
    Ok(templated(
        "matmul",
        &[MATMUL],
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
        ("matmul_kernel", &[a.out_ty()], 2),
        launch,
    ))
}

/// A convolution-family implicit GEMM; `x`, `w`, `y` are the forward geometry's shapes. The
/// entry is `{family}_kernel`, templated on the first input's type (and the second's for the
/// backward kernels).
fn conv(
    a: &Args,
    family: &'static str,
    c: &ConvParams,
    x: &[usize],
    w: &[usize],
    y: &[usize],
) -> Result<Kernel> {
    let g = u(c.groups.max(1));
    let (nb, ci, h, wd) = (u(x[0]), u(x[1]), u(x[2]), u(x[3]));
    let (co, cig, kh, kw) = (u(w[0]), u(w[1]), u(w[2]), u(w[3]));
    let (ho, wo) = (u(y[2]), u(y[3]));
    if ci != cig * g || co % g != 0 || u(y[1]) != co || u(y[0]) != nb || c.stride.contains(&0) {
        return Err(a.err("inconsistent convolution shapes"));
    }
    let cog = co / g;
    let (m, n) = match family {
        "conv2d" => (cog, nb * ho * wo),
        "conv2d_backward_input" => (cig, nb * h * wd),
        _ => (cog, cig * kh * kw),
    };
    let launch = gemm_launch(a, m, n, g)?;
    let types = if family == "conv2d" {
        vec![a.ty(0)?]
    } else {
        vec![a.ty(0)?, a.ty(1)?]
    };
    Ok(templated(
        family,
        &[MATMUL, CONV],
        vec![
            c_u64("NB", nb),
            c_u64("CI", ci),
            c_u64("H", h),
            c_u64("W", wd),
            c_u64("CO", co),
            c_u64("CIG", cig),
            c_u64("COG", cog),
            c_u64("KH", kh),
            c_u64("KW", kw),
            c_u64("HO", ho),
            c_u64("WO", wo),
            c_u64("SH", u(c.stride[0])),
            c_u64("SW", u(c.stride[1])),
            c_u64("PH", u(c.padding[0])),
            c_u64("PW", u(c.padding[1])),
            c_u64("DH", u(c.dilation[0])),
            c_u64("DW", u(c.dilation[1])),
        ],
        (&format!("{family}_kernel"), &types, 2),
        launch,
    ))
}

fn attention(a: &Args, p: &AttnParams, which: Option<AttnInput>) -> Result<Kernel> {
    let (q, kt) = (a.rank(0, 3)?, a.rank(1, 3)?);
    let (b, tq, tk) = (u(q.shape[0]), u(q.shape[1]), u(kt.shape[1]));
    let (h, kvh) = (u(p.heads), u(p.kv_heads));
    let dh = u(q.shape[2]) / h.max(1);
    if dh == 0 || dh > 256 {
        return Err(a.unsupported(format!("head dim {dh} (supported 1..=256)")));
    }
    if h > 65535 || b > 65535 {
        return Err(a.unsupported("more than 65535 heads or batches"));
    }
    // Shared tiles stay within 32 KiB: BT query/key rows, BC keys per K/V tile.
    let bt = (4096 / dh).clamp(16, 64);
    let bc = (4096 / dh).clamp(1, 64);
    let (family, call, rows, heads_grid) = match which {
        None => ("attention", "attention_kernel", tq, h),
        Some(AttnInput::Q) => ("attention_backward_q", "attention_backward_q_kernel", tq, h),
        Some(AttnInput::K) => (
            "attention_backward_k",
            "attention_backward_kv_kernel",
            tk,
            kvh,
        ),
        Some(AttnInput::V) => (
            "attention_backward_v",
            "attention_backward_kv_kernel",
            tk,
            kvh,
        ),
    };
    let lines = vec![
        c_u64("TQ", tq),
        c_u64("TK", tk),
        c_u64("H", h),
        c_u64("KVH", kvh),
        c_u64("DH", dh),
        c_bool("CAUSAL", p.causal),
        c_f32("SCALE", p.scale),
        c_u64("BT", bt),
        c_u64("BC", bc),
        c_bool("WHICH_V", matches!(which, Some(AttnInput::V))),
    ];
    // The backward kernels also read dout (in3).
    let n_in = if which.is_none() { 3 } else { 4 };
    let launch = Launch::Grid(
        [rows.div_ceil(bt), heads_grid, b],
        u32::try_from(bt).unwrap_or(64),
    );
    Ok(templated(
        family,
        &[ATTENTION],
        lines,
        (call, &[a.ty(0)?], n_in),
        launch,
    ))
}
