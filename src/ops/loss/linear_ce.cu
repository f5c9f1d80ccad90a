// The fused linear cross-entropy's elementwise stages between its cuBLASLt GEMMs: hidden
// states x [N, D], weight W [D, V] (C::TR false) or an embedding table E [V, D] read as its
// transpose (C::TR true), targets [N]. The logits z = x @ W never exist whole: a GEMM writes
// one chunk of them into the workspace in T, the operands' type, as a T matmul rounds its
// output (C::CHUNK rows of all V columns, row stride C::VLD, for the forward and the input
// gradient; all N rows of a tile of C::VT columns, row stride C::VTLD, for the weight
// gradient; both strides padded for aligned rows). A row's target logit z[r, t] is never read
// from a GEMM: it is always lce_target_logit, one dot product in a fixed order rounded to T,
// so the backward gets the forward's log-sum-exp back from its loss exactly (GEMMs of other
// shapes may round an element to a neighbouring T). These kernels turn a chunk into per-row
// losses (through partial log-sum-exps at byte C::LOFF) or into the logits' gradient
// p = (exp(z - lse) - [v == t]) * g in T, in place of the logits, or, where the rows are too
// few to fill the GPU a block a row (C::APART), at byte C::POFF with the logits' row stride;
// the next GEMM consumes it. A backward's phase 0 writes every row's log-sum-exp at byte
// C::LOFF (N floats), which its later phases read. A row that `ce_kept` (loss.cu) drops has
// loss 0 and gradient 0; a kept target out of range makes its row's results NaN.

// Whether target t names a class.
template <typename C> __device__ __forceinline__ bool lce_ok(int t) { return t >= 0 && (u64)t < C::V; }

// Rows [r0, r0 + rn) of chunk `chunk` of C::CHUNK rows.
template <typename C> __device__ __forceinline__ u64 lce_rows_in(u64 chunk, u64* r0) {
    *r0 = chunk * C::CHUNK;
    return C::N - *r0 < C::CHUNK ? C::N - *r0 : C::CHUNK;
}

// Row r's target logit z[r, t] (0 for a target out of range): the D-long fp32 dot product
// x[r] . W[:, t], each lane fusing the multiply-adds of d = lane, lane + 32, ... in order, the
// lanes summed by shuffles (lane l adds lane l + o for o = 16, 8, 4, 2, 1), rounded to T: the
// order of the CPU backend's `target_logit`. All 32 lanes of a warp call it; every lane gets
// the value.
template <typename T, typename C> __device__ float lce_target_logit(const T* x, const T* w, u64 r, int t) {
    float acc = 0.0f;
    if (lce_ok<C>(t)) {
        for (u64 d = threadIdx.x % 32; d < C::D; d += 32) acc = fmaf(ld(x, r * C::D + d), C::TR ? ld(w, (u64)t * C::D + d) : ld(w, d * C::V + t), acc);
    }
    for (int o = 16; o > 0; o /= 2) acc += __shfl_down_sync(0xffffffffu, acc, o);
    return to_f32(from_f32<T>(__shfl_sync(0xffffffffu, acc, 0)));
}

// The max of z[v0, v1) and the sum of exp(z - max) over it, in every thread of the block.
template <typename T> __device__ void lce_slice_stats(const T* zr, u64 v0, u64 v1, float* m_out, float* s_out) {
    float m = MEMC_NEG_INF;
    for (u64 v = v0 + threadIdx.x; v < v1; v += blockDim.x) m = fmaxf(m, ld(zr, v));
    m = block_max(m);
    float s = 0.0f;
    for (u64 v = v0 + threadIdx.x; v < v1; v += blockDim.x) s += expf(ld(zr, v) - m);
    *m_out = m;
    *s_out = block_sum(s);
}

// A row's loss from its logits' max m, its sum l of exp(z - m) and its target's logit zt.
template <typename C> __device__ __forceinline__ float lce_loss(float m, float l, float zt, int t) {
    return !ce_kept<C>(t) ? 0.0f : lce_ok<C>(t) ? m + logf(l) - zt : MEMC_NAN;
}

// Each row's log-sum-exp in C::SPLITS column slices, so a chunk's few rows still fill the GPU:
// block b takes row b / SPLITS, slice b % SPLITS, and writes its max and its sum of exp(z - max)
// to the partials at byte C::LOFF (two floats per row and slice; an empty slice -inf, 0).
template <typename T, typename C> __device__ void lce_row_partials(const T* z, float* part, u64 chunk) {
    u64 r0;
    const u64 rn = lce_rows_in<C>(chunk, &r0);
    const u64 span = (C::V + C::SPLITS - 1) / C::SPLITS;
    for (u64 b = blockIdx.x; b < rn * C::SPLITS; b += gridDim.x) {
        const u64 v0 = (b % C::SPLITS) * span, v1 = v0 + span < C::V ? v0 + span : C::V;
        float m, s;
        lce_slice_stats(z + (b / C::SPLITS) * C::VLD, v0, v1, &m, &s);
        if (threadIdx.x == 0) {
            part[2 * b] = m;
            part[2 * b + 1] = s;
        }
    }
}

// One block per row, when a chunk's rows alone fill the GPU (C::SPLITS 1): each row's loss
// in one stage, the same value lce_rows gives from a single slice.
template <typename T, typename C> __device__ void lce_row_losses(const T* z, const T* x, const T* w, const int* tg, float* out, u64 chunk) {
    u64 r0;
    const u64 rn = lce_rows_in<C>(chunk, &r0);
    for (u64 b = blockIdx.x; b < rn; b += gridDim.x) {
        float m, s;
        lce_slice_stats(z + b * C::VLD, 0, C::V, &m, &s);
        if (threadIdx.x < 32) {
            const int t = tg[r0 + b];
            const float zt = lce_target_logit<T, C>(x, w, r0 + b, t);
            if (threadIdx.x == 0) out[r0 + b] = lce_loss<C>(m, m == MEMC_NEG_INF ? 0.0f : s, zt, t);
        }
    }
}

// out[r] = logsumexp_v z[r, v] - z[r, t[r]] from the row's partials, slices in order: one
// warp per row.
template <typename T, typename C> __device__ void lce_rows(const float* part, const T* x, const T* w, const int* tg, float* out, u64 chunk) {
    u64 r0;
    const u64 rn = lce_rows_in<C>(chunk, &r0);
    const u64 warps = (u64)gridDim.x * blockDim.x / 32;
    for (u64 i = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32; i < rn; i += warps) {
        const int t = tg[r0 + i];
        const float zt = lce_target_logit<T, C>(x, w, r0 + i, t);
        if (threadIdx.x % 32 != 0) continue;
        const float* pr = part + 2 * i * C::SPLITS;
        float m = MEMC_NEG_INF;
        for (u64 s = 0; s < C::SPLITS; ++s) m = fmaxf(m, pr[2 * s]);
        float l = 0.0f;
        for (u64 s = 0; s < C::SPLITS; ++s) l += pr[2 * s] == MEMC_NEG_INF ? 0.0f : pr[2 * s + 1] * expf(pr[2 * s] - m);
        out[r0 + i] = lce_loss<C>(m, l, zt, t);
    }
}

// The logits' gradient of one element of a row of target t: 0 when the row is dropped.
template <typename C> __device__ __forceinline__ float lce_grad(float z, float lse, int t, u64 v, float g) {
    return ce_kept<C>(t) ? (expf(z - lse) - (v == (u64)t ? 1.0f : 0.0f)) * g : 0.0f;
}

// Turns one row of `width` logits zr (columns v0 on) into their gradient in place: one block,
// each thread rewriting the elements it reads.
template <typename T, typename C>
__device__ void lce_grad_row(T* zr, float lse, int t, u64 v0, u64 width, float g) {
    for (u64 j = threadIdx.x; j < width; j += blockDim.x) st(zr, j, lce_grad<C>(ld(zr, j), lse, t, v0 + j, g));
}

// p for `rn` rows of `width` logits z (row stride ld, columns v0 on, first row r0) into p
// (row stride ld) apart from them (C::APART): a thread an element over the whole grid.
template <typename T, typename C>
__device__ void lce_probs_apart(const T* z, T* p, const int* tg, const float* lse, const float* dr, u64 r0, u64 rn, u64 v0, u64 width, u64 ld_) {
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < rn * width; e += (u64)gridDim.x * blockDim.x) {
        const u64 i = e / width, j = e % width, r = r0 + i;
        st(p, i * ld_ + j, lce_grad<C>(ld(z, i * ld_ + j), lse[r], tg[r], v0 + j, dr[r]));
    }
}

// p for the rows of the chunk (all V columns): in place of their logits, a block a row; or
// apart from them (C::APART) at `p`.
template <typename T, typename C>
__device__ void lce_probs_rows(T* z, T* p, const int* tg, const float* lse, const float* dr, u64 chunk) {
    u64 r0;
    const u64 rn = lce_rows_in<C>(chunk, &r0);
    if (C::APART) {
        lce_probs_apart<T, C>(z, p, tg, lse, dr, r0, rn, 0, C::V, C::VLD);
        return;
    }
    for (u64 i = blockIdx.x; i < rn; i += gridDim.x) lce_grad_row<T, C>(z + i * C::VLD, lse[r0 + i], tg[r0 + i], 0, C::V, dr[r0 + i]);
}

// lse[r] = rows[r] + z[r, t[r]] for every row: one warp per row.
template <typename T, typename C>
__device__ void lce_lse(const T* x, const T* w, const int* tg, const float* rows, float* lse) {
    const u64 warps = (u64)gridDim.x * blockDim.x / 32;
    for (u64 r = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < C::N; r += warps) {
        const int t = tg[r];
        const float zt = lce_target_logit<T, C>(x, w, r, t);
        if (threadIdx.x % 32 == 0) lse[r] = lce_ok<C>(t) ? rows[r] + zt : MEMC_NAN;
    }
}

// p for all rows of column tile `tile` (C::VT columns, the last one narrower): in place of
// their logits, a block a row, or apart from them (C::APART) at `p`.
template <typename T, typename C>
__device__ void lce_probs_tile(T* z, T* p, const int* tg, const float* lse, const float* dr, u64 tile) {
    const u64 v0 = tile * C::VT;
    const u64 width = C::V - v0 < C::VT ? C::V - v0 : C::VT;
    if (C::APART) {
        lce_probs_apart<T, C>(z, p, tg, lse, dr, 0, C::N, v0, width, C::VTLD);
        return;
    }
    for (u64 r = blockIdx.x; r < C::N; r += gridDim.x) lce_grad_row<T, C>(z + r * C::VTLD, lse[r], tg[r], v0, width, dr[r]);
}

// The forward's stages for chunk `chunk`: phase 0 the rows' partials, phase 1 their losses;
// one stage when a row is one slice.
template <typename T, typename C> __device__ void lce_forward_kernel(char* arena, u64 o_x, u64 o_w, u64 o_t, u64 o_out, u64 o_ws, u64 phase, u64 chunk) {
    const T* z = tensor_at<T>(arena, o_ws);
    const T* x = tensor_at<T>(arena, o_x);
    const T* w = tensor_at<T>(arena, o_w);
    float* part = tensor_at<float>(arena, o_ws + C::LOFF);
    const int* tg = tensor_at<int>(arena, o_t);
    float* out = tensor_at<float>(arena, o_out);
    if (C::SPLITS == 1) lce_row_losses<T, C>(z, x, w, tg, out, chunk);
    else if (phase == 0) lce_row_partials<T, C>(z, part, chunk);
    else lce_rows<T, C>(part, x, w, tg, out, chunk);
}

// The input gradient's stages: phase 0 every row's log-sum-exp, phase 1 p of chunk `chunk`.
template <typename T, typename C>
__device__ void lce_backward_input_kernel(char* arena, u64 o_x, u64 o_w, u64 o_t, u64 o_rows, u64 o_dr, u64 o_dx, u64 o_ws, u64 phase, u64 chunk) {
    float* lse = tensor_at<float>(arena, o_ws + C::LOFF);
    const int* tg = tensor_at<int>(arena, o_t);
    if (phase == 0) {
        lce_lse<T, C>(tensor_at<T>(arena, o_x), tensor_at<T>(arena, o_w), tg, tensor_at<float>(arena, o_rows), lse);
    } else {
        lce_probs_rows<T, C>(tensor_at<T>(arena, o_ws), tensor_at<T>(arena, o_ws + C::POFF), tg, lse, tensor_at<float>(arena, o_dr), chunk);
    }
}

// The weight gradient's stages: phase 0 every row's log-sum-exp, phase 1 p of tile `chunk`;
// in a merged backward, phase 2 rounds the fp32 input gradient the tiles summed at byte
// C::AOFF into the output's first N x D elements, and zeroes the gap up to the weight's
// gradient at element C::WAT.
template <typename T, typename C>
__device__ void lce_backward_weight_kernel(char* arena, u64 o_x, u64 o_w, u64 o_t, u64 o_rows, u64 o_dr, u64 o_dw, u64 o_ws, u64 phase, u64 chunk) {
    float* lse = tensor_at<float>(arena, o_ws + C::LOFF);
    if (phase == 2) {
        const float* acc = tensor_at<float>(arena, o_ws + C::AOFF);
        T* dx = tensor_at<T>(arena, o_dw);
        for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < C::WAT; i += (u64)gridDim.x * blockDim.x) st(dx, i, i < C::N * C::D ? acc[i] : 0.0f);
    } else if (phase == 0) {
        lce_lse<T, C>(tensor_at<T>(arena, o_x), tensor_at<T>(arena, o_w), tensor_at<int>(arena, o_t), tensor_at<float>(arena, o_rows), lse);
    } else {
        lce_probs_tile<T, C>(tensor_at<T>(arena, o_ws), tensor_at<T>(arena, o_ws + C::POFF), tensor_at<int>(arena, o_t), lse,
                             tensor_at<float>(arena, o_dr), chunk);
    }
}
