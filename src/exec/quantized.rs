//! The parameters a plan stores quantized, as both executors write them: f32 values in,
//! packed bytes out (`crate::ops::quant::pack`), with the quantization error of every weight
//! written so far.

use crate::ir::Quantized;
use crate::ops::quant::pack::{self, ErrorSums};
use crate::plan::{BufferId, Plan};
use std::collections::BTreeMap;

use super::ExecError;

/// Which buffers of a plan hold quantized weights, and how far each one's last written values
/// lie from their dequantized form.
#[derive(Debug, Clone, Default)]
pub struct QuantizedParams {
    packing: BTreeMap<BufferId, Quantized>,
    errors: BTreeMap<BufferId, ErrorSums>,
}

impl QuantizedParams {
    /// The quantized parameters of `plan` (none written yet).
    pub fn of(plan: &Plan) -> QuantizedParams {
        QuantizedParams {
            packing: (plan.params.iter())
                .filter_map(|p| Some((p.buffer, p.quant?)))
                .collect(),
            errors: BTreeMap::new(),
        }
    }

    /// How buffer `b` is packed, when it holds a quantized weight.
    pub fn packing(&self, b: BufferId) -> Option<Quantized> {
        self.packing.get(&b).copied()
    }

    /// `values` packed for buffer `b` (quantized as `q`), recording their error (replacing
    /// what an earlier write of `b` recorded). Errs on a count that differs from the weight's.
    pub fn pack(
        &mut self,
        b: BufferId,
        q: &Quantized,
        values: &[f32],
    ) -> Result<Vec<u8>, ExecError> {
        let bytes = pack::pack(q, values).map_err(ExecError::Shape)?;
        self.errors.insert(b, ErrorSums::of(q, values, &bytes));
        Ok(bytes)
    }

    /// The error sums over every quantized weight written so far (None before any).
    pub fn errors(&self) -> Option<ErrorSums> {
        self.errors.values().copied().reduce(ErrorSums::combine)
    }
}
