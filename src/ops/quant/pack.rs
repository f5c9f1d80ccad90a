//! The packed layouts of quantized weights, and packing (quantization, on the host) and
//! unpacking (dequantization, the arithmetic the CPU and CUDA kernels share).
//!
//! **int8** (LLM.int8()'s vector-wise weight quantization), `n` weights, `C` output channels:
//! bytes `[0, n)` hold one signed code per weight in storage order; at `align4(n)` follow `C`
//! f32 scales, `scale_c = absmax_c / 127` over channel `c`'s weights. A weight is
//! `round(w / scale_c)` (half away from zero, clamped to ±127; 0 where the scale is 0) and
//! dequantizes to `code * scale_c`, so its error is at most `absmax_c / 127 / 2`.
//! Bytes: `align4(n) + 4 C`.
//!
//! **nf4** (QLoRA's 4-bit NormalFloat with double quantization), `n` weights in storage order
//! cut into `B = ceil(n / 64)` blocks of 64 (the last may be shorter):
//! - bytes `[0, ceil(n / 2))`: two 4-bit codes per byte, weight `2k` in the high nibble of byte
//!   `k` and weight `2k + 1` in the low nibble (bitsandbytes' order); a code indexes
//!   [`NF4`], the nearest level to `w / absmax_b` (ties to the lower level), `absmax_b` the
//!   block's largest magnitude;
//! - at `align4(ceil(n / 2))`: `B` signed 8-bit codes of the block absmaxes after subtracting
//!   their mean `m`, in groups of 256 blocks: `code_b = round((absmax_b - m) / s_g)`,
//!   `s_g = max |absmax_b - m| / 127` over group `g` (symmetric linear 8-bit codes, where
//!   bitsandbytes uses its dynamic 8-bit map);
//! - at `align4(align4(ceil(n / 2)) + B)`: the `ceil(B / 256)` f32 group scales `s_g`, then
//!   the f32 mean `m`.
//!
//! A weight dequantizes to `NF4[q] * a_b` with `a_b = code_b * s_g + m` (an f32 product, then
//! an f32 sum: no fused multiply-add). Its error is at most half the gap between the two
//! levels around `w / absmax_b`, times `absmax_b`, plus `|absmax_b - a_b| <= s_g / 2` (the
//! double quantization's). Bytes: `align4(align4(ceil(n / 2)) + B) + 4 (ceil(B / 256) + 1)`,
//! about 0.516 per weight.

use super::{Quantized, Scheme};

/// The 16 NormalFloat4 levels of the QLoRA paper, exactly the f32 values bitsandbytes stores
/// (-1, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
/// -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0, 0.07958029955625534,
/// 0.16093020141124725, 0.24611230194568634, 0.33791524171829224, 0.44070982933044434,
/// 0.5626170039176941, 0.7229568362236023, 1), given by their bits.
pub const NF4: [f32; 16] = [
    f32::from_bits(0xbf800000),
    f32::from_bits(0xbf3239b1),
    f32::from_bits(0xbf066b30),
    f32::from_bits(0xbeca32a0),
    f32::from_bits(0xbe91a24d),
    f32::from_bits(0xbe3d353f),
    f32::from_bits(0xbdba7871),
    f32::from_bits(0x00000000),
    f32::from_bits(0x3da2faff),
    f32::from_bits(0x3e24cae3),
    f32::from_bits(0x3e7c04dd),
    f32::from_bits(0x3ead033a),
    f32::from_bits(0x3ee1a4b8),
    f32::from_bits(0x3f1007ab),
    f32::from_bits(0x3f3913b3),
    f32::from_bits(0x3f800000),
];

/// The midpoints between neighbouring [`NF4`] levels: a value above `MID[k]` is nearer
/// level `k + 1` than level `k`.
const MID: [f32; 15] = {
    let mut mid = [0f32; 15];
    let mut k = 0;
    while k < 15 {
        mid[k] = (NF4[k] + NF4[k + 1]) / 2.0;
        k += 1;
    }
    mid
};

/// Weights per nf4 block (one absmax each).
pub const NF4_BLOCK: usize = 64;
/// Block absmaxes per group of the double quantization (one f32 scale each).
pub const ABSMAX_GROUP: usize = 256;

fn align4(n: u64) -> u64 {
    n.div_ceil(4) * 4
}

/// Where each part of a packed buffer starts (byte offsets) and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// nf4: the block absmaxes' 8-bit codes; int8: equal to `scales` (there are none).
    pub absmax_codes: u64,
    /// The f32 scales: per output channel (int8) or per group of absmaxes (nf4).
    pub scales: u64,
    /// nf4: the f32 mean of the block absmaxes; int8: equal to `bytes` (there is none).
    pub mean: u64,
    /// The whole buffer, a multiple of 4.
    pub bytes: u64,
}

impl Layout {
    /// The layout of `q`'s packed buffer (see the module comment).
    pub fn of(q: &Quantized) -> Layout {
        let n = q.numel();
        match q.scheme {
            Scheme::Int8 => {
                let scales = align4(n);
                let bytes = scales + 4 * q.channels();
                Layout {
                    absmax_codes: scales,
                    scales,
                    mean: bytes,
                    bytes,
                }
            }
            Scheme::Nf4 => {
                let blocks = n.div_ceil(NF4_BLOCK as u64);
                let absmax_codes = align4(n.div_ceil(2));
                let scales = align4(absmax_codes + blocks);
                let mean = scales + 4 * blocks.div_ceil(ABSMAX_GROUP as u64);
                Layout {
                    absmax_codes,
                    scales,
                    mean,
                    bytes: mean + 4,
                }
            }
        }
    }
}

/// The output channel of flat storage index `i` of `q`.
fn channel(q: &Quantized, i: usize) -> usize {
    if q.out_axis == 0 {
        i / q.shape[1]
    } else {
        i % q.shape[1]
    }
}

/// `round(x / scale)` as a signed 8-bit code (0 where the scale is 0 or `x` not finite).
fn code8(x: f32, scale: f32) -> i8 {
    if scale > 0.0 {
        (x / scale).round().clamp(-127.0, 127.0) as i8
    } else {
        0
    }
}

fn put_f32(out: &mut [u8], at: u64, v: f32) {
    let at = at as usize;
    out[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn get_f32(bytes: &[u8], at: u64) -> f32 {
    let at = at as usize;
    f32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// The index of the [`NF4`] level nearest to `x` (ties to the lower level).
pub fn nf4_code(x: f32) -> u8 {
    MID.partition_point(|&m| x > m) as u8
}

/// `values` (`q.numel()` of them, in storage order) packed in `q`'s layout; errs on a count
/// that differs.
pub fn pack(q: &Quantized, values: &[f32]) -> Result<Vec<u8>, String> {
    if values.len() as u64 != q.numel() {
        return Err(format!(
            "a {}x{} weight takes {} values, got {}",
            q.shape[0],
            q.shape[1],
            q.numel(),
            values.len()
        ));
    }
    let layout = Layout::of(q);
    let mut out = vec![0u8; layout.bytes as usize];
    match q.scheme {
        Scheme::Int8 => {
            let mut absmax = vec![0f32; q.channels() as usize];
            for (i, &w) in values.iter().enumerate() {
                let c = channel(q, i);
                absmax[c] = absmax[c].max(w.abs());
            }
            let scales: Vec<f32> = absmax.iter().map(|a| a / 127.0).collect();
            for (i, &w) in values.iter().enumerate() {
                out[i] = code8(w, scales[channel(q, i)]) as u8;
            }
            for (c, &s) in scales.iter().enumerate() {
                put_f32(&mut out, layout.scales + 4 * c as u64, s);
            }
        }
        Scheme::Nf4 => {
            let absmax: Vec<f32> = values
                .chunks(NF4_BLOCK)
                .map(|b| b.iter().fold(0f32, |m, w| m.max(w.abs())))
                .collect();
            for (i, &w) in values.iter().enumerate() {
                let a = absmax[i / NF4_BLOCK];
                let code = nf4_code(if a > 0.0 { w / a } else { 0.0 });
                out[i / 2] |= if i.is_multiple_of(2) { code << 4 } else { code };
            }
            let mean =
                (absmax.iter().map(|&a| f64::from(a)).sum::<f64>() / absmax.len() as f64) as f32;
            for (g, group) in absmax.chunks(ABSMAX_GROUP).enumerate() {
                let s = group.iter().fold(0f32, |m, a| m.max((a - mean).abs())) / 127.0;
                for (k, &a) in group.iter().enumerate() {
                    let at = layout.absmax_codes as usize + g * ABSMAX_GROUP + k;
                    out[at] = code8(a - mean, s) as u8;
                }
                put_f32(&mut out, layout.scales + 4 * g as u64, s);
            }
            put_f32(&mut out, layout.mean, mean);
        }
    }
    Ok(out)
}

/// The weights `bytes` (a buffer packed in `q`'s layout) dequantize to, in storage order, as
/// f32 (before any rounding to the compute precision); `out` holds `q.numel()` of them.
pub fn unpack_into(q: &Quantized, bytes: &[u8], out: &mut [f32]) {
    let layout = Layout::of(q);
    match q.scheme {
        Scheme::Int8 => {
            for (i, w) in out.iter_mut().enumerate() {
                let scale = get_f32(bytes, layout.scales + 4 * channel(q, i) as u64);
                *w = f32::from(bytes[i] as i8) * scale;
            }
        }
        Scheme::Nf4 => {
            let mean = get_f32(bytes, layout.mean);
            for (b, block) in out.chunks_mut(NF4_BLOCK).enumerate() {
                let code = bytes[layout.absmax_codes as usize + b] as i8;
                let s = get_f32(bytes, layout.scales + 4 * (b / ABSMAX_GROUP) as u64);
                let a = f32::from(code) * s + mean;
                for (k, w) in block.iter_mut().enumerate() {
                    let i = b * NF4_BLOCK + k;
                    let byte = bytes[i / 2];
                    let q = if i.is_multiple_of(2) {
                        byte >> 4
                    } else {
                        byte & 15
                    };
                    *w = NF4[q as usize] * a;
                }
            }
        }
    }
}

/// [`unpack_into`] into a new vector.
pub fn unpack(q: &Quantized, bytes: &[u8]) -> Vec<f32> {
    let mut out = vec![0f32; q.numel() as usize];
    unpack_into(q, bytes, &mut out);
    out
}

/// How far dequantized weights lie from the f32 ones they were packed from, summed over one
/// or more weights.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ErrorSums {
    /// Weights counted.
    pub weights: u64,
    /// Their packed bytes.
    pub packed_bytes: u64,
    /// The sum of `(w - dequantized w)^2`.
    pub squared_error: f64,
    /// The sum of `w^2`.
    pub squared_values: f64,
    /// The largest `|w - dequantized w|`.
    pub max_abs_error: f64,
}

impl ErrorSums {
    /// The sums of one weight packed as `bytes` from `values`.
    pub fn of(q: &Quantized, values: &[f32], bytes: &[u8]) -> ErrorSums {
        let back = unpack(q, bytes);
        let mut sums = ErrorSums {
            weights: q.numel(),
            packed_bytes: bytes.len() as u64,
            ..ErrorSums::default()
        };
        for (&w, &d) in values.iter().zip(&back) {
            let e = f64::from(w) - f64::from(d);
            sums.squared_error += e * e;
            sums.squared_values += f64::from(w) * f64::from(w);
            sums.max_abs_error = sums.max_abs_error.max(e.abs());
        }
        sums
    }

    /// The sums over both.
    pub fn combine(self, other: ErrorSums) -> ErrorSums {
        ErrorSums {
            weights: self.weights + other.weights,
            packed_bytes: self.packed_bytes + other.packed_bytes,
            squared_error: self.squared_error + other.squared_error,
            squared_values: self.squared_values + other.squared_values,
            max_abs_error: self.max_abs_error.max(other.max_abs_error),
        }
    }

    /// The RMS relative error `sqrt(sum (w - dequantized)^2 / sum w^2)` (0 for all-zero
    /// weights).
    pub fn rms_relative(&self) -> f64 {
        if self.squared_values > 0.0 {
            (self.squared_error / self.squared_values).sqrt()
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests;
