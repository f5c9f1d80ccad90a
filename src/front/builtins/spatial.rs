//! Built-in functions over NCHW tensors: convolution, pooling, local response
//! normalization, padding and nearest-neighbour upsampling.

use super::{boolean, pads4, pair, Args};
use crate::diagnostic::UserError;
use crate::front::lower::{Lowerer, R};
use crate::front::value::{GroupKind, Val};
use crate::ir::*;

impl Lowerer<'_> {
    /// `conv2d(x, layer, stride, padding, dilation)` with the layer's bias added per channel;
    /// `conv2d(x, w, groups = G, ...)` with a weight tensor `[OUT, IN / G, KH, KW]` and no
    /// bias.
    pub(super) fn conv2d(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let gv = args.positional("parameter")?;
        let (weight, groups, bias) = match gv.val {
            Val::Tensor(t) => {
                let groups = match args.optional("groups") {
                    Some(v) => match usize::try_from(self.int(&v, "groups")?) {
                        Ok(g) if g > 0 => g,
                        _ => {
                            return Err(UserError::at(
                                v.span,
                                "groups must be at least 1",
                                "not a group count",
                                "give the number of channel groups, 1 or more",
                            ))
                        }
                    },
                    None => 1,
                };
                (t, groups, None)
            }
            _ => {
                let g = self.group(&gv, "the second argument of `conv2d`")?;
                let GroupKind::Conv2d { groups } = g.kind else {
                    return Err(UserError::at(
                        gv.span,
                        format!(
                            "expected a `conv2d` parameter group, got `{}`",
                            g.kind.name()
                        ),
                        "wrong parameter kind",
                        "declare it as `param c: conv2d(in, out, k)`",
                    ));
                };
                (g.weight, groups, g.bias)
            }
        };
        let pads = pads4(self, args.optional("padding"))?;
        let (x, padding) = self.pad_for(x, pads, 0.0, span)?;
        let conv = ConvParams {
            stride: pair(self, args.optional("stride"), 1, "stride")?,
            padding,
            dilation: pair(self, args.optional("dilation"), 1, "dilation")?,
            groups,
        };
        if conv.stride.contains(&0) || conv.dilation.contains(&0) {
            return Err(UserError::at(
                span,
                "stride and dilation must be at least 1",
                "zero",
                "use 1 or more",
            ));
        }
        let y = self.add(Op::Conv2d(conv), vec![x, weight], span)?;
        match bias {
            Some(b) => {
                let c = self.ty(b).shape[0];
                let b4 = self.add(
                    Op::Reshape {
                        shape: vec![c, 1, 1],
                    },
                    vec![b],
                    span,
                )?;
                self.op(Op::Binary(BinaryFn::Add), vec![y, b4], span)
            }
            None => Ok(Val::Tensor(y)),
        }
    }

    /// `max_pool2d` or `avg_pool2d` of `x` over `kernel` (`stride` defaults to the kernel);
    /// `count_pad = false` averages over the window's share inside the input. Padding wider
    /// than half the kernel is written out (`-inf` for max, 0 for average) before the pool.
    pub(super) fn pool(&mut self, name: &str, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let kv = args.positional("kernel")?;
        let kernel = pair(self, Some(kv), 1, "kernel")?;
        let stride = pair(self, args.optional("stride"), 0, "stride")?;
        let stride = if stride == [0, 0] { kernel } else { stride };
        let pads = pads4(self, args.optional("padding"))?;
        let count_pad = boolean(args.optional("count_pad"), true)?;
        if kernel.contains(&0) || stride.contains(&0) {
            return Err(UserError::at(
                span,
                "kernel and stride must be at least 1",
                "zero",
                "use 1 or more",
            ));
        }
        let shape = self.nchw(x, name, span)?;
        let is_max = name == "max_pool2d";
        let fill = if is_max { f32::NEG_INFINITY } else { 0.0 };
        // The pool kernels pad by at most half the kernel; wider padding is explicit.
        let wide = pads[0].max(pads[2]) * 2 > kernel[0] || pads[1].max(pads[3]) * 2 > kernel[1];
        let pad_pool = |l: &mut Self, v: ValueId, value: f32| {
            if wide {
                Ok((l.pad(v, pads, value, span)?, [0, 0]))
            } else {
                l.pad_for(v, pads, value, span)
            }
        };
        let (xp, padding) = pad_pool(self, x, fill)?;
        let p = PoolParams {
            kernel,
            stride,
            padding,
        };
        if is_max {
            return self.op(Op::MaxPool2d(p), vec![xp], span);
        }
        let y = self.add(Op::AvgPool2d(p), vec![xp], span)?;
        if count_pad || pads == [0; 4] {
            return Ok(Val::Tensor(y));
        }
        // Padding not counted: divide by the share of each window inside the input.
        let ones = self.add(
            Op::Fill {
                value: 1.0,
                ty: TensorType::new(DType::F32, vec![1, 1, shape[2], shape[3]]),
            },
            vec![],
            span,
        )?;
        let (ones, _) = pad_pool(self, ones, 0.0)?;
        let share = self.add(Op::AvgPool2d(p), vec![ones], span)?;
        self.op(Op::Binary(BinaryFn::Div), vec![y, share], span)
    }

    /// Local response normalization across channels (ONNX `LRN`):
    /// `x / (bias + alpha / size * sum of x^2 over the size-channel window)^beta`, lowered to
    /// square, an average pool over channels, affine, log, scale, exp and multiply.
    pub(super) fn lrn(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let s = self.nchw(x, "lrn", span)?;
        let size = self.dim_or(args, "size", 5)?;
        let alpha = self.float_or(args, "alpha", 1e-4)?;
        let beta = self.float_or(args, "beta", 0.75)?;
        let bias = self.float_or(args, "bias", 1.0)?;
        let sq = self.add(Op::Binary(BinaryFn::Mul), vec![x, x], span)?;
        let r = self.add(
            Op::Reshape {
                shape: vec![s[0], 1, s[1], s[2] * s[3]],
            },
            vec![sq],
            span,
        )?;
        let before = (size - 1) / 2;
        let (rp, padding) = self.pad_for(r, [before, 0, size - 1 - before, 0], 0.0, span)?;
        let pool = PoolParams {
            kernel: [size, 1],
            stride: [1, 1],
            padding,
        };
        let mut d = self.add(Op::AvgPool2d(pool), vec![rp], span)?;
        for op in [
            Op::Affine {
                scale: alpha,
                shift: bias,
            },
            Op::Unary(UnaryFn::Log),
            Op::Affine {
                scale: -beta,
                shift: 0.0,
            },
            Op::Unary(UnaryFn::Exp),
            Op::Reshape { shape: s },
        ] {
            d = self.add(op, vec![d], span)?;
        }
        self.op(Op::Binary(BinaryFn::Mul), vec![x, d], span)
    }

    /// `pad(x, padding, value = 0)` of H and W.
    pub(super) fn pad_call(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let pv = args.positional("padding")?;
        let pads = pads4(self, Some(pv))?;
        let value = self.float_or(args, "value", 0.0)?;
        self.nchw(x, "pad", span)?;
        Ok(Val::Tensor(self.pad(x, pads, value, span)?))
    }

    /// `(x, pads)` ready for a conv or pool: symmetric padding stays with the op; asymmetric
    /// `(top, left, bottom, right)` becomes explicit rows and columns of `value` around x.
    fn pad_for(
        &mut self,
        x: ValueId,
        pads: [usize; 4],
        value: f32,
        span: Span,
    ) -> R<(ValueId, [usize; 2])> {
        let [top, left, bottom, right] = pads;
        if top == bottom && left == right {
            return Ok((x, [top, left]));
        }
        Ok((self.pad(x, pads, value, span)?, [0, 0]))
    }

    /// `x` (NCHW) with `(top, left, bottom, right)` rows and columns of `value` around it,
    /// concatenated from filled tensors.
    fn pad(&mut self, x: ValueId, pads: [usize; 4], value: f32, span: Span) -> R<ValueId> {
        let [top, left, bottom, right] = pads;
        let mut y = x;
        for (axis, before, after) in [(2, top, bottom), (3, left, right)] {
            let shape = self.nchw(y, "padding", span)?;
            let fill = |l: &mut Self, rows: usize| {
                let mut s = shape.clone();
                s[axis] = rows;
                let ty = TensorType::new(DType::F32, s);
                l.add(Op::Fill { value, ty }, vec![], span)
            };
            let mut parts = Vec::new();
            if before > 0 {
                parts.push(fill(self, before)?);
            }
            parts.push(y);
            if after > 0 {
                parts.push(fill(self, after)?);
            }
            if parts.len() > 1 {
                y = self.add(Op::Concat { axis }, parts, span)?;
            }
        }
        Ok(y)
    }

    /// `global_avg_pool(x)`: the mean over H and W, as `[N, C]`.
    pub(super) fn global_avg_pool(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let shape = self.nchw(x, "global_avg_pool", span)?;
        let s = self.add(
            Op::SumTo {
                shape: vec![shape[0], shape[1], 1, 1],
            },
            vec![x],
            span,
        )?;
        let m = self.add(
            Op::Affine {
                scale: 1.0 / (shape[2] * shape[3]) as f32,
                shift: 0.0,
            },
            vec![s],
            span,
        )?;
        self.op(
            Op::Reshape {
                shape: vec![shape[0], shape[1]],
            },
            vec![m],
            span,
        )
    }

    /// `upsample(x, f)`: each pixel repeated `f x f` times.
    pub(super) fn upsample(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let fv = args.positional("factor")?;
        let f = self.dim(&fv, "the upsample factor")?;
        let s = self.nchw(x, "upsample", span)?;
        let r = self.add(
            Op::Reshape {
                shape: vec![s[0], s[1], s[2], 1, s[3], 1],
            },
            vec![x],
            span,
        )?;
        let b = self.add(
            Op::BroadcastTo {
                shape: vec![s[0], s[1], s[2], f, s[3], f],
            },
            vec![r],
            span,
        )?;
        self.op(
            Op::Reshape {
                shape: vec![s[0], s[1], s[2] * f, s[3] * f],
            },
            vec![b],
            span,
        )
    }
}
