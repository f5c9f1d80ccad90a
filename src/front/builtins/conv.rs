//! Convolutions over NCL, NCHW and NCDHW tensors: the parameter constructors
//! (`conv1d(I, O, K)` .. `conv3d`, `conv_transpose1d` .. `conv_transpose3d`) and the calls
//! (`conv3d(x, c, stride, padding, dilation)`, `conv_transpose3d(x, c, stride, padding,
//! output_padding, dilation)`), each call adding its group's bias per channel.

use super::{boolean, pads4, per_axis, Args};
use crate::diagnostic::UserError;
use crate::front::ast::Ident;
use crate::front::lower::{Lowerer, R};
use crate::front::value::{Group, GroupKind, Val};
use crate::ir::*;

/// `(transposed, spatial rank)` of a convolution's name (`conv3d`, `conv_transpose2d`).
pub(super) fn conv_kind(name: &str) -> Option<(bool, usize)> {
    let (transposed, rest) = match name.strip_prefix("conv_transpose") {
        Some(rest) => (true, rest),
        None => (false, name.strip_prefix("conv")?),
    };
    let rank = match rest {
        "1d" => 1,
        "2d" => 2,
        "3d" => 3,
        _ => return None,
    };
    Some((transposed, rank))
}

/// The tensor layout of `rank` spatial axes, for messages.
fn layout(rank: usize) -> &'static str {
    ["NCL", "NCHW", "NCDHW"][rank.clamp(1, 3) - 1]
}

impl Lowerer<'_> {
    /// `conv3d(I, O, K, groups = 1, bias = false)` (any rank): an `[O, I/groups, K...]`
    /// weight, or `[I, O/groups, K...]` for a transposed convolution (torch's layouts), drawn
    /// uniformly within `1/sqrt(fan_in)` as torch initializes them.
    pub(super) fn conv_params(
        &mut self,
        name: &Ident,
        ctor: &str,
        args: &mut Args,
        span: Span,
    ) -> R<Group> {
        let (transposed, rank) = conv_kind(ctor).unwrap_or((false, 2));
        let i = self.dim_arg(args, "input channels")?;
        let o = self.dim_arg(args, "output channels")?;
        let kv = args.positional("kernel size")?;
        let k = per_axis(self, Some(kv), 1, "kernel size", rank)?;
        if k.contains(&0) {
            return Err(UserError::at(
                span,
                "kernel size must be at least 1",
                "zero",
                "use 1 or more",
            ));
        }
        let groups = self.dim_or(args, "groups", 1)?;
        if groups == 0 || i % groups != 0 || o % groups != 0 {
            return Err(UserError::at(
                span,
                format!("groups = {groups} must divide both {i} input and {o} output channels"),
                "does not divide",
                "choose groups dividing both channel counts",
            ));
        }
        let has_bias = boolean(args.optional("bias"), false)?;
        let (first, second) = if transposed { (i, o) } else { (o, i) };
        let mut shape = vec![first, second / groups];
        shape.extend_from_slice(&k);
        let fan_in = shape[1..].iter().product::<usize>() as f32;
        let bound = 1.0 / fan_in.sqrt();
        let init = Init::Uniform {
            low: -bound,
            high: bound,
        };
        let weight = self.member(name, "weight", shape, init)?;
        let bias = self.bias_member(name, has_bias, o)?;
        let kind = GroupKind::Conv {
            rank,
            groups,
            transposed,
        };
        Ok(Group {
            kind,
            weight,
            bias,
            running: None,
        })
    }

    /// `conv3d(x, layer, stride, padding, dilation)` (any rank; 2-D padding may also be
    /// `(top, left, bottom, right)`) or `conv_transpose3d(x, layer, stride, padding,
    /// output_padding, dilation)`, with the layer's bias added per channel; or any of them
    /// with a weight tensor in place of the layer (`conv2d(x, w, groups = G, ...)`, no bias).
    pub(super) fn conv(&mut self, name: &str, args: &mut Args, span: Span) -> R<Val> {
        let (transposed, rank) = conv_kind(name).unwrap_or((false, 2));
        let x = self.t(args, "input")?;
        let gv = args.positional("parameter")?;
        let (weight, groups, bias) = match gv.val {
            Val::Tensor(w) => (w, self.groups(args)?, None),
            _ => {
                let g = self.group(&gv, &format!("the second argument of `{name}`"))?;
                let want = GroupKind::Conv {
                    rank,
                    groups: 0,
                    transposed,
                };
                let GroupKind::Conv { groups, .. } = g.kind else {
                    return Err(self.wrong_group(gv.span, name, &g.kind));
                };
                if g.kind.name() != want.name() {
                    return Err(self.wrong_group(gv.span, name, &g.kind));
                }
                (g.weight, groups, g.bias)
            }
        };
        let ty = self.ty(x).clone();
        if ty.shape.len() != rank + 2 {
            let l = layout(rank);
            let have = ty.shape.len().saturating_sub(2);
            let prefix = if transposed { "conv_transpose" } else { "conv" };
            let help = if (1..=3).contains(&have) {
                format!(
                    "pass an {l} tensor, or call {prefix}{have}d for this {} one",
                    layout(have)
                )
            } else {
                format!("pass an {l} tensor")
            };
            return Err(UserError::at(
                span,
                format!("{name} needs an {l} tensor (rank {}), got {ty}", rank + 2),
                format!("not {l}"),
                help,
            ));
        }
        let padding = args.optional("padding");
        let (x, padding) = if rank == 2 && !transposed {
            let pads = pads4(self, padding)?;
            let (x, p) = self.pad_for(x, pads, 0.0, span)?;
            (x, p.to_vec())
        } else {
            (x, per_axis(self, padding, 0, "padding", rank)?)
        };
        let conv = ConvParams {
            stride: per_axis(self, args.optional("stride"), 1, "stride", rank)?,
            padding,
            dilation: per_axis(self, args.optional("dilation"), 1, "dilation", rank)?,
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
        let y = if transposed {
            let extra = per_axis(
                self,
                args.optional("output_padding"),
                0,
                "output_padding",
                rank,
            )?;
            let output =
                self.transposed_size(&ty.shape, &self.ty(weight).shape, &conv, &extra, span)?;
            self.add(Op::ConvTranspose { conv, output }, vec![x, weight], span)?
        } else {
            self.add(Op::Conv(conv), vec![x, weight], span)?
        };
        match bias {
            Some(b) => {
                let c = self.ty(b).shape[0];
                let mut shape = vec![c];
                shape.extend(std::iter::repeat_n(1, rank));
                let b = self.add(Op::Reshape { shape }, vec![b], span)?;
                self.op(Op::Binary(BinaryFn::Add), vec![y, b], span)
            }
            None => Ok(Val::Tensor(y)),
        }
    }

    /// The `groups` argument of a convolution by a weight tensor: 1 when absent; a
    /// diagnostic unless a whole number of at least 1.
    fn groups(&mut self, args: &mut Args) -> R<usize> {
        let Some(v) = args.optional("groups") else {
            return Ok(1);
        };
        match usize::try_from(self.int(&v, "groups")?) {
            Ok(g) if g > 0 => Ok(g),
            _ => Err(UserError::at(
                v.span,
                "groups must be at least 1",
                "not a group count",
                "give the number of channel groups, 1 or more",
            )),
        }
    }

    /// The spatial size a transposed convolution of `x` by `w` writes:
    /// `(in - 1) * stride - 2 * padding + dilation * (k - 1) + 1 + output_padding` per axis,
    /// with `output_padding` below the stride or the dilation (so the size is the one whose
    /// convolution gives back `in`).
    fn transposed_size(
        &self,
        x: &[usize],
        w: &[usize],
        c: &ConvParams,
        extra: &[usize],
        span: Span,
    ) -> R<Vec<usize>> {
        let mut out = Vec::new();
        for d in 0..c.rank() {
            if extra[d] >= c.stride[d].max(c.dilation[d]) {
                return Err(UserError::at(
                    span,
                    format!(
                        "output_padding {} must be smaller than the stride {} or the dilation {}",
                        extra[d], c.stride[d], c.dilation[d]
                    ),
                    "too large",
                    "use an output_padding below the stride",
                ));
            }
            let full = x[2 + d].saturating_sub(1) * c.stride[d]
                + c.dilation[d] * (w[2 + d] - 1)
                + 1
                + extra[d];
            match full.checked_sub(2 * c.padding[d]) {
                Some(o) if o > 0 && x[2 + d] > 0 => out.push(o),
                _ => {
                    return Err(UserError::at(
                        span,
                        format!(
                            "padding {} leaves no output along spatial axis {d} of {:?}",
                            c.padding[d],
                            &x[2..]
                        ),
                        "too much padding",
                        "reduce the padding",
                    ))
                }
            }
        }
        Ok(out)
    }

    /// A call's parameter group is of the wrong kind.
    fn wrong_group(&self, at: Span, name: &str, got: &GroupKind) -> UserError {
        UserError::at(
            at,
            format!("expected a `{name}` parameter group, got `{}`", got.name()),
            "wrong parameter kind",
            format!("declare it as `param c: {name}(in, out, k)`"),
        )
    }
}
