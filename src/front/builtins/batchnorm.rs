//! `batchnorm(x, bn, eps = 1e-5, momentum = 0.1)` as `torch.nn.BatchNorm`: in a model that
//! trains, the batch's statistics normalize and the running statistics move towards them (an
//! in-place step beside the norm); in a model without `train { }` (eval mode) the running
//! statistics normalize, as a per-channel scale and shift.

use crate::diagnostic::UserError;
use crate::front::lower::{Lowerer, R};
use crate::front::value::Val;
use crate::ir::*;

impl Lowerer<'_> {
    /// Batch norm of `x` with `weight` and `bias` and the `running` mean and variance, by
    /// `eps` and `momentum`: training or eval mode as the model is.
    pub(super) fn batch_norm(
        &mut self,
        x: ValueId,
        (weight, bias): (ValueId, Option<ValueId>),
        running: [ValueId; 2],
        (eps, momentum): (f32, f32),
        span: Span,
    ) -> R<Val> {
        if !self.training {
            return self.batch_norm_eval(x, (weight, bias), running, eps, span);
        }
        let mut inputs = vec![x, weight];
        inputs.extend(bias);
        let y = self.add(Op::norm(NormKind::Batch, eps), inputs, span)?;
        self.add(
            Op::BatchNormStats { momentum },
            vec![running[0], running[1], x],
            span,
        )?;
        Ok(Val::Tensor(y))
    }

    /// `x * scale + shift` per channel, `scale = weight / sqrt(var + eps)` and `shift = bias -
    /// mean * scale` computed on the `[C]` statistics, then viewed as `[C, 1, ...]` against
    /// `x`'s channel axis.
    fn batch_norm_eval(
        &mut self,
        x: ValueId,
        (weight, bias): (ValueId, Option<ValueId>),
        [mean, var]: [ValueId; 2],
        eps: f32,
        span: Span,
    ) -> R<Val> {
        let (xt, c) = (self.ty(x).clone(), self.ty(weight).shape[0]);
        if xt.shape.len() < 2 || xt.shape[1] != c || !xt.dtype.is_float() {
            return Err(UserError::at(
                span,
                format!("batchnorm of {c} channels does not match {xt}"),
                "here",
                format!("batch norm takes a float [N, {c}, ...] tensor, channels on axis 1"),
            ));
        }
        let rank = xt.shape.len();
        let var_eps = self.add(
            Op::Affine {
                scale: 1.0,
                shift: eps,
            },
            vec![var],
            span,
        )?;
        let rstd = self.add(Op::Unary(UnaryFn::Rsqrt), vec![var_eps], span)?;
        let scale = self.add(Op::Binary(BinaryFn::Mul), vec![weight, rstd], span)?;
        let moved = self.add(Op::Binary(BinaryFn::Mul), vec![mean, scale], span)?;
        let shift = match bias {
            Some(b) => self.add(Op::Binary(BinaryFn::Sub), vec![b, moved], span)?,
            None => self.add(
                Op::Affine {
                    scale: -1.0,
                    shift: 0.0,
                },
                vec![moved],
                span,
            )?,
        };
        let mut per_channel = vec![c];
        per_channel.resize(rank.saturating_sub(1).max(1), 1);
        let [scale, shift] = [scale, shift].map(|v| {
            self.add(
                Op::Reshape {
                    shape: per_channel.clone(),
                },
                vec![v],
                span,
            )
        });
        let scaled = self.add(Op::Binary(BinaryFn::Mul), vec![x, scale?], span)?;
        Ok(Val::Tensor(self.add(
            Op::Binary(BinaryFn::Add),
            vec![scaled, shift?],
            span,
        )?))
    }
}
