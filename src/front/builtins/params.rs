//! Parameter constructors (`param ln: layernorm(D)`, `linear(I, O)`, `conv3d(I, O, K)`,
//! `embedding(V, D)`): each creates the tensors of one parameter group.

use super::{boolean, conv, Args};
use crate::diagnostic::UserError;
use crate::front::ast::{Call, Ident};
use crate::front::lower::{Lowerer, R};
use crate::front::value::{Group, GroupKind, Spanned, Val};
use crate::ir::*;
use std::collections::HashMap;

impl Lowerer<'_> {
    /// Creates the tensors of a parameter constructor such as `linear(I, O)`.
    pub(in crate::front) fn param_group(
        &mut self,
        name: &Ident,
        call: &Call,
        env: &HashMap<String, Spanned>,
    ) -> R<Val> {
        let mut args = self.args(call, env)?;
        let ctor = call.name.name.as_str();
        let group = match ctor {
            "layernorm" | "batchnorm" | "rmsnorm" | "groupnorm" => {
                self.norm_params(name, ctor, &mut args)?
            }
            "linear" => self.linear_params(name, &mut args)?,
            c if conv::conv_kind(c).is_some() => {
                self.conv_params(name, c, &mut args, call.span)?
            }
            "embedding" => self.embedding_params(name, &mut args)?,
            _ => {
                return Err(UserError::at(
                    call.name.span,
                    format!("unknown parameter constructor `{ctor}`"),
                    "not a constructor",
                    "use layernorm, rmsnorm, batchnorm, groupnorm, linear, conv1d, conv2d, conv3d, conv_transpose2d, conv_transpose3d, embedding, or a shape like `[D, D]`",
                ))
            }
        };
        args.done()?;
        Ok(Val::Group(group))
    }

    /// The f32 parameter `<group>.<suffix>` of `shape`.
    pub(super) fn member(
        &mut self,
        group: &Ident,
        suffix: &str,
        shape: Vec<usize>,
        init: Init,
    ) -> R<ValueId> {
        let name = Ident {
            name: format!("{}.{suffix}", group.name),
            span: group.span,
        };
        self.new_param(&name, TensorType::new(DType::F32, shape), init)
    }

    /// The zero-initialized `<group>.bias` of `width` elements when `has` is set.
    pub(super) fn bias_member(
        &mut self,
        group: &Ident,
        has: bool,
        width: usize,
    ) -> R<Option<ValueId>> {
        if !has {
            return Ok(None);
        }
        Ok(Some(self.member(
            group,
            "bias",
            vec![width],
            Init::Zeros,
        )?))
    }

    /// `layernorm(C)`, `batchnorm(C)`, `rmsnorm(C)` (no bias) or `groupnorm(G, C)`.
    fn norm_params(&mut self, name: &Ident, ctor: &str, args: &mut Args) -> R<Group> {
        let groups = if ctor == "groupnorm" {
            self.dim_arg(args, "group count")?
        } else {
            0
        };
        let c = self.dim_arg(args, "channel count")?;
        let bias = ctor != "rmsnorm" && boolean(args.optional("bias"), true)?;
        let kind = match ctor {
            "layernorm" => GroupKind::LayerNorm,
            "batchnorm" => GroupKind::BatchNorm,
            "rmsnorm" => GroupKind::RmsNorm,
            _ => GroupKind::GroupNorm(groups),
        };
        let weight = self.member(name, "weight", vec![c], Init::Ones)?;
        let bias = self.bias_member(name, bias, c)?;
        // A batch norm's running statistics, as torch.nn.BatchNorm's buffers: mean 0, var 1.
        let running = match kind {
            GroupKind::BatchNorm => Some([
                self.running_member(name, "running_mean", c, Init::Zeros)?,
                self.running_member(name, "running_var", c, Init::Ones)?,
            ]),
            _ => None,
        };
        Ok(Group {
            kind,
            weight,
            bias,
            running,
        })
    }

    /// The f32 running statistic `<group>.<suffix>` of `c` channels: model state, not a
    /// parameter (see [`Op::Param`]).
    fn running_member(&mut self, group: &Ident, suffix: &str, c: usize, init: Init) -> R<ValueId> {
        let name = Ident {
            name: format!("{}.{suffix}", group.name),
            span: group.span,
        };
        self.new_state(&name, TensorType::new(DType::F32, vec![c]), init, true)
    }

    /// `linear(I, O, std, bias = true, layout = in_out)`: a uniform(±1/√I) or normal(std)
    /// weight, `[I, O]`, or `[O, I]` with `layout = out_in` (PyTorch's `nn.Linear`).
    fn linear_params(&mut self, name: &Ident, args: &mut Args) -> R<Group> {
        let i = self.dim_arg(args, "input width")?;
        let o = self.dim_arg(args, "output width")?;
        let out_in =
            match args.optional("layout") {
                None => false,
                Some(Spanned {
                    val: Val::Symbol(s),
                    ..
                }) if s == "in_out" || s == "out_in" => s == "out_in",
                Some(v) => return Err(UserError::at(
                    v.span,
                    "`layout` is `in_out` or `out_in`",
                    "not a layout",
                    "write `layout = out_in` for a weight stored [out, in] as PyTorch's nn.Linear",
                )),
            };
        let bound = 1.0 / (i as f32).sqrt();
        let init = match args.optional("std") {
            Some(v) => Init::Normal {
                std: self.float(&v, "std")? as f32,
            },
            None => Init::Uniform {
                low: -bound,
                high: bound,
            },
        };
        let has_bias = boolean(args.optional("bias"), true)?;
        let shape = if out_in { vec![o, i] } else { vec![i, o] };
        let weight = self.member(name, "weight", shape, init)?;
        let bias = self.bias_member(name, has_bias, o)?;
        Ok(Group {
            kind: GroupKind::Linear { out_in },
            weight,
            bias,
            running: None,
        })
    }

    /// `embedding(V, D, std = 1)`: a normal `[V, D]` table.
    fn embedding_params(&mut self, name: &Ident, args: &mut Args) -> R<Group> {
        let v = self.dim_arg(args, "row count")?;
        let d = self.dim_arg(args, "width")?;
        let std = self.float_or(args, "std", 1.0)?;
        let weight = self.member(name, "weight", vec![v, d], Init::Normal { std })?;
        Ok(Group {
            kind: GroupKind::Embedding,
            weight,
            bias: None,
            running: None,
        })
    }
}
