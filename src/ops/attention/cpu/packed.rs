//! Packed attention on the CPU: the column blocks of `x[rows, q | k | v]` copied out into
//! separate q, k and v, the separate operands' kernels run on them, and the backward's three
//! gradients copied back into `dx`'s blocks. The same sums run in the same order, so the
//! results are bitwise those of the separate ops.

use super::kernels::{attention_backward, attention_forward, AttnGeom, Operands};
use crate::ir::AttnInput;

/// Columns of q, k and v in a packed row, in that order.
fn widths(g: &AttnGeom) -> [usize; 3] {
    let kv = g.attn.kv_heads * g.head_dim;
    [g.attn.heads * g.head_dim, kv, kv]
}

/// The q, k and v blocks of the packed rows of `x`, each as its own row-major tensor.
fn unpack(g: &AttnGeom, x: &[f32]) -> [Vec<f32>; 3] {
    let w = widths(g);
    let row: usize = w.iter().sum();
    let mut at = 0;
    w.map(|cols| {
        let part = x
            .chunks_exact(row.max(1))
            .flat_map(|r| &r[at..at + cols])
            .copied()
            .collect();
        at += cols;
        part
    })
}

/// Writes row-major blocks `parts` (q, k, v widths) side by side into the packed rows of `dst`.
fn pack(g: &AttnGeom, parts: [&[f32]; 3], dst: &mut [f32]) {
    let w = widths(g);
    let row: usize = w.iter().sum();
    for (r, out) in dst.chunks_exact_mut(row.max(1)).enumerate() {
        let mut at = 0;
        for (part, cols) in parts.iter().zip(w) {
            out[at..at + cols].copy_from_slice(&part[r * cols..(r + 1) * cols]);
            at += cols;
        }
    }
}

/// The forward of attention over the packed `x` (and the key mask, if any) into `out`,
/// equal to [`attention_forward`] on x's q, k and v blocks.
pub fn packed_forward(g: &AttnGeom, x: &[f32], mask: Option<&[i32]>, out: &mut [f32]) {
    let [q, k, v] = unpack(g, x);
    attention_forward(
        g,
        Operands {
            q: &q,
            k: &k,
            v: &v,
            mask,
        },
        out,
    );
}

/// The gradient `dq | dk | dv` of the packed attention, written over `dx` (x's shape), each
/// block equal to [`attention_backward`] of that operand.
pub fn packed_backward(
    g: &AttnGeom,
    x: &[f32],
    mask: Option<&[i32]>,
    dout: &[f32],
    dx: &mut [f32],
) {
    let [q, k, v] = unpack(g, x);
    let operands = Operands {
        q: &q,
        k: &k,
        v: &v,
        mask,
    };
    let grads = [AttnInput::Q, AttnInput::K, AttnInput::V].map(|which| {
        let mut d = vec![
            0.0;
            if which == AttnInput::Q {
                q.len()
            } else {
                k.len()
            }
        ];
        attention_backward(g, operands, dout, which, &mut d);
        d
    });
    pack(g, [&grads[0], &grads[1], &grads[2]], dx);
}
