//! Built-in functions over NCHW (and NCDHW) tensors: 2-D and 3-D pooling, local response
//! normalization, padding and nearest-neighbour upsampling.

use super::{boolean, pads4, per_axis, Args};
use crate::diagnostic::UserError;
use crate::front::lower::{Lowerer, R};
use crate::front::value::Val;
use crate::ir::*;

impl Lowerer<'_> {
    /// `max_pool2d` or `avg_pool2d` of `x` over `kernel` (`stride` defaults to the kernel);
    /// `count_pad = false` averages over the window's share inside the input. Padding wider
    /// than half the kernel is written out (`-inf` for max, 0 for average) before the pool.
    pub(super) fn pool(&mut self, name: &str, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let [k, s] = self.pool_window(args, 2, span)?;
        let (kernel, stride) = ([k[0], k[1]], [s[0], s[1]]);
        let pads = pads4(self, args.optional("padding"))?;
        let count_pad = boolean(args.optional("count_pad"), true)?;
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

    /// A pooling call's `kernel` (positional) and `stride` (the kernel when absent), one entry
    /// per each of `rank` axes, every entry at least 1.
    fn pool_window(&self, args: &mut Args, rank: usize, span: Span) -> R<[Vec<usize>; 2]> {
        let kv = args.positional("kernel")?;
        let kernel = per_axis(self, Some(kv), 1, "kernel", rank)?;
        let stride = match args.optional("stride") {
            Some(v) => per_axis(self, Some(v), 1, "stride", rank)?,
            None => kernel.clone(),
        };
        if kernel.contains(&0) || stride.contains(&0) {
            return Err(UserError::at(
                span,
                "kernel and stride must be at least 1",
                "zero",
                "use 1 or more",
            ));
        }
        Ok([kernel, stride])
    }

    /// Local response normalization across channels (ONNX `LRN`):
    /// `x / (bias + alpha / size * sum of x^2 over the size-channel window)^beta`, lowered to
    /// square, an average pool over channels, affine, log, scale, exp and multiply. Channel
    /// `c` sums channels `c - (size-1)/2 ..= c + size/2` (integer division): ONNX's LRN window;
    /// PyTorch's `LocalResponseNorm` starts an even window one channel earlier.
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
    pub(super) fn pad_for(
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

    /// `global_avg_pool(x)`: the mean over the spatial axes of an NCL, NCHW or NCDHW
    /// tensor, as `[N, C]`.
    pub(super) fn global_avg_pool(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let shape = self.spatial(x, "global_avg_pool", span)?;
        let mut kept = vec![shape[0], shape[1]];
        kept.extend(std::iter::repeat_n(1, shape.len() - 2));
        let s = self.add(Op::sum_to(kept), vec![x], span)?;
        let count: usize = shape[2..].iter().product();
        let m = self.add(
            Op::Affine {
                scale: 1.0 / count as f32,
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

    /// `upsample(x, f)`: each element of an NCL, NCHW or NCDHW tensor repeated `f` times
    /// along every spatial axis (nearest neighbour), as a reshape and a broadcast.
    pub(super) fn upsample(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let fv = args.positional("factor")?;
        let f = self.dim(&fv, "the upsample factor")?;
        let s = self.spatial(x, "upsample", span)?;
        let (mut split, mut wide) = (s[..2].to_vec(), s[..2].to_vec());
        for &d in &s[2..] {
            split.extend([d, 1]);
            wide.extend([d, f]);
        }
        let r = self.add(Op::Reshape { shape: split }, vec![x], span)?;
        let b = self.add(Op::BroadcastTo { shape: wide }, vec![r], span)?;
        let mut out = s[..2].to_vec();
        out.extend(s[2..].iter().map(|d| d * f));
        self.op(Op::Reshape { shape: out }, vec![b], span)
    }

    /// `max_pool3d` or `avg_pool3d` of an NCDHW `x` over `kernel` (`stride` defaults to the
    /// kernel; symmetric `padding` per axis; `count_pad = false` averages over the window's
    /// share inside the input). A box window is separable, so this is the 2-D pooling of
    /// every depth slice over (H, W) followed by a pooling over D: the max of maxes and the
    /// mean of means are exactly the 3-D results, the intermediate (the input with H and W
    /// pooled) being the only extra tensor.
    pub(super) fn pool3d(&mut self, name: &str, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let [kernel, stride] = self.pool_window(args, 3, span)?;
        let padding = per_axis(self, args.optional("padding"), 0, "padding", 3)?;
        let count_pad = boolean(args.optional("count_pad"), true)?;
        let shape = self.ty(x).shape.clone();
        if shape.len() != 5 {
            return Err(UserError::at(
                span,
                format!("{name} needs an NCDHW tensor, got {}", self.ty(x)),
                "not NCDHW",
                "pass a [N, C, D, H, W] tensor (max_pool2d pools NCHW)",
            ));
        }
        let window = [kernel, stride, padding];
        let is_max = name == "max_pool3d";
        let y = self.pool_separable(x, &window, is_max, span)?;
        if is_max || count_pad || window[2] == [0; 3] {
            return Ok(Val::Tensor(y));
        }
        let ty = TensorType::new(DType::F32, [vec![1, 1], shape[2..].to_vec()].concat());
        let ones = self.add(Op::Fill { value: 1.0, ty }, vec![], span)?;
        let share = self.pool_separable(ones, &window, false, span)?;
        self.op(Op::Binary(BinaryFn::Div), vec![y, share], span)
    }

    /// The 3-D pooling of NCDHW `x` with `[kernel, stride, padding]` (one entry per axis),
    /// as a 2-D pooling over (H, W) and one over D.
    fn pool_separable(
        &mut self,
        x: ValueId,
        [k, s, p]: &[Vec<usize>; 3],
        is_max: bool,
        span: Span,
    ) -> R<ValueId> {
        let pool = |p: PoolParams| {
            if is_max {
                Op::MaxPool2d(p)
            } else {
                Op::AvgPool2d(p)
            }
        };
        let [n, c, d, h, w] = self.ty(x).shape[..] else {
            return Err(UserError::at(
                span,
                "3-D pooling needs an NCDHW tensor",
                "not NCDHW",
                "pass a [N, C, D, H, W] tensor",
            ));
        };
        let planes = self.add(
            Op::Reshape {
                shape: vec![n, c * d, h, w],
            },
            vec![x],
            span,
        )?;
        let plane = PoolParams {
            kernel: [k[1], k[2]],
            stride: [s[1], s[2]],
            padding: [p[1], p[2]],
        };
        let hw = self.add(pool(plane), vec![planes], span)?;
        let (ho, wo) = (self.ty(hw).shape[2], self.ty(hw).shape[3]);
        let columns = self.add(
            Op::Reshape {
                shape: vec![n, c, d, ho * wo],
            },
            vec![hw],
            span,
        )?;
        let depth = PoolParams {
            kernel: [k[0], 1],
            stride: [s[0], 1],
            padding: [p[0], 0],
        };
        let y = self.add(pool(depth), vec![columns], span)?;
        let dout = self.ty(y).shape[2];
        self.add(
            Op::Reshape {
                shape: vec![n, c, dout, ho, wo],
            },
            vec![y],
            span,
        )
    }
}
