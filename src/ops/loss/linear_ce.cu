// The fused linear cross-entropy's elementwise stages between its cuBLASLt GEMMs: hidden
// states x [N, D], weight W [D, V] (C::TR false) or an embedding table E [V, D] read as its
// transpose (C::TR true), targets [N]. The logits z = x @ W never exist whole: a GEMM writes
// one chunk of them in fp32 into the workspace (C::CHUNK rows of all V columns, row stride
// C::VLD, for the forward and the input gradient; all N rows of a tile of C::VT columns,
// row stride C::VTLD, for the weight gradient; both strides padded for aligned rows).
// These kernels turn it into per-row losses (through partial log-sum-exps at byte C::LOFF)
// or into the logits' gradient p = (exp(z - lse) - [v == t]) * g in T in place of the
// logits (each row of p from its row of z's first byte, so p's row stride is z's in bytes),
// or, where the rows are too few to fill the GPU a block a row (C::APART), at byte C::POFF
// with z's row stride in elements; the next GEMM consumes it. The weight gradient's tiles read each
// row's log-sum-exp from byte C::LOFF (N floats), its phase 0 having written them. A row
// that `ce_kept` (loss.cu) drops has loss 0 and gradient 0; a kept target out of range makes
// its row's results NaN.

// Whether target t names a class.
template <typename C> __device__ __forceinline__ bool lce_ok(int t) { return t >= 0 && (u64)t < C::V; }

// Rows [r0, r0 + rn) of chunk `chunk` of C::CHUNK rows.
template <typename C> __device__ __forceinline__ u64 lce_rows_in(u64 chunk, u64* r0) {
    *r0 = chunk * C::CHUNK;
    return C::N - *r0 < C::CHUNK ? C::N - *r0 : C::CHUNK;
}

// The max of z[v0, v1) and the sum of exp(z - max) over it, in every thread of the block.
template <typename C> __device__ void lce_slice_stats(const float* zr, u64 v0, u64 v1, float* m_out, float* s_out) {
    float m = MEMC_NEG_INF;
    for (u64 v = v0 + threadIdx.x; v < v1; v += blockDim.x) m = fmaxf(m, zr[v]);
    m = block_max(m);
    float s = 0.0f;
    for (u64 v = v0 + threadIdx.x; v < v1; v += blockDim.x) s += expf(zr[v] - m);
    *m_out = m;
    *s_out = block_sum(s);
}

// A row's loss from its logits' max m, its sum l of exp(z - m) and its target's logit.
template <typename C> __device__ __forceinline__ float lce_loss(float m, float l, const float* zr, int t) {
    return !ce_kept<C>(t) ? 0.0f : lce_ok<C>(t) ? m + logf(l) - zr[t] : MEMC_NAN;
}

// Each row's log-sum-exp in C::SPLITS column slices, so a chunk's few rows still fill the GPU:
// block b takes row b / SPLITS, slice b % SPLITS, and writes its max and its sum of exp(z - max)
// to the partials at byte C::LOFF (two floats per row and slice; an empty slice -inf, 0).
template <typename C> __device__ void lce_row_partials(const float* z, float* part, u64 chunk) {
    u64 r0;
    const u64 rn = lce_rows_in<C>(chunk, &r0);
    const u64 span = (C::V + C::SPLITS - 1) / C::SPLITS;
    for (u64 b = blockIdx.x; b < rn * C::SPLITS; b += gridDim.x) {
        const u64 v0 = (b % C::SPLITS) * span, v1 = v0 + span < C::V ? v0 + span : C::V;
        float m, s;
        lce_slice_stats<C>(z + (b / C::SPLITS) * C::VLD, v0, v1, &m, &s);
        if (threadIdx.x == 0) {
            part[2 * b] = m;
            part[2 * b + 1] = s;
        }
    }
}

// One block per row, when a chunk's rows alone fill the GPU (C::SPLITS 1): each row's loss
// in one stage, the same value lce_rows gives from a single slice.
template <typename C> __device__ void lce_row_losses(const float* z, const int* tg, float* out, u64 chunk) {
    u64 r0;
    const u64 rn = lce_rows_in<C>(chunk, &r0);
    for (u64 b = blockIdx.x; b < rn; b += gridDim.x) {
        float m, s;
        lce_slice_stats<C>(z + b * C::VLD, 0, C::V, &m, &s);
        if (threadIdx.x == 0) out[r0 + b] = lce_loss<C>(m, m == MEMC_NEG_INF ? 0.0f : s, z + b * C::VLD, tg[r0 + b]);
    }
}

// out[r] = logsumexp_v z[r, v] - z[r, t[r]] from the row's partials, slices in order: one
// thread per row.
template <typename C> __device__ void lce_rows(const float* z, const float* part, const int* tg, float* out, u64 chunk) {
    u64 r0;
    const u64 rn = lce_rows_in<C>(chunk, &r0);
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < rn; i += (u64)gridDim.x * blockDim.x) {
        const float* pr = part + 2 * i * C::SPLITS;
        float m = MEMC_NEG_INF;
        for (u64 s = 0; s < C::SPLITS; ++s) m = fmaxf(m, pr[2 * s]);
        float l = 0.0f;
        for (u64 s = 0; s < C::SPLITS; ++s) l += pr[2 * s] == MEMC_NEG_INF ? 0.0f : pr[2 * s + 1] * expf(pr[2 * s] - m);
        out[r0 + i] = lce_loss<C>(m, l, z + i * C::VLD, tg[r0 + i]);
    }
}

// The logits' gradient of one element of a row of target t: 0 when the row is dropped.
template <typename C> __device__ __forceinline__ float lce_grad(float z, float lse, int t, u64 v, float g) {
    return ce_kept<C>(t) ? (expf(z - lse) - (v == (u64)t ? 1.0f : 0.0f)) * g : 0.0f;
}

// Turns one row of `width` fp32 logits zr (columns v0 on) into their gradient in place, in
// T from the row's first byte: one block, in segments of blockDim.x columns. A segment's
// logits are all read before any of its gradients is written (a 16-bit gradient lands on
// the bytes of a logit before it), and no segment writes a byte of a logit still unread.
template <typename T, typename C>
__device__ void lce_grad_row(float* zr, float lse, int t, u64 v0, u64 width, float g) {
    T* pr = reinterpret_cast<T*>(zr);
    for (u64 s = 0; s < width; s += blockDim.x) {
        const u64 j = s + threadIdx.x;
        const float d = j < width ? lce_grad<C>(zr[j], lse, t, v0 + j, g) : 0.0f;
        __syncthreads();
        if (j < width) st(pr, j, d);
    }
}

// p for `rn` rows of `width` logits z (row stride ld, columns v0 on) into p (T, row stride
// ld) apart from them (C::APART): a thread an element over the whole grid. lse(i) gives row
// i's log-sum-exp, r0 + i its global row.
template <typename T, typename C, typename Lse>
__device__ void lce_probs_apart(const float* z, T* p, const int* tg, const float* dr, u64 r0, u64 rn, u64 v0, u64 width, u64 ld, Lse lse) {
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < rn * width; e += (u64)gridDim.x * blockDim.x) {
        const u64 i = e / width, j = e % width;
        st(p, i * ld + j, lce_grad<C>(z[i * ld + j], lse(i), tg[r0 + i], v0 + j, dr[r0 + i]));
    }
}

// p for the rows of the chunk (all V columns), their log-sum-exp rows[r] + z[r, t[r]]: in
// place of their logits, read from the chunk before the row is overwritten, a block a row;
// or apart from them (C::APART) at `p`.
template <typename T, typename C>
__device__ void lce_probs_rows(float* z, T* p, const int* tg, const float* rows, const float* dr, u64 chunk) {
    u64 r0;
    const u64 rn = lce_rows_in<C>(chunk, &r0);
    if (C::APART) {
        const auto lse = [&](u64 i) {
            const int t = tg[r0 + i];
            return lce_ok<C>(t) ? rows[r0 + i] + z[i * C::VLD + t] : MEMC_NAN;
        };
        lce_probs_apart<T, C>(z, p, tg, dr, r0, rn, 0, C::V, C::VLD, lse);
        return;
    }
    for (u64 i = blockIdx.x; i < rn; i += gridDim.x) {
        const u64 r = r0 + i;
        const int t = tg[r];
        float* zr = z + i * C::VLD;
        const float lse = lce_ok<C>(t) ? rows[r] + zr[t] : MEMC_NAN;
        lce_grad_row<T, C>(zr, lse, t, 0, C::V, dr[r]);
    }
}

// lse[r] = rows[r] + z[r, t[r]] for every row, z[r, t] recomputed as a D-long fp32 dot
// product in d order: one warp per row.
template <typename T, typename C>
__device__ void lce_lse(const T* x, const T* w, const int* tg, const float* rows, float* lse) {
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    const u64 warps = (u64)gridDim.x * blockDim.x / 32;
    for (u64 r = warp; r < C::N; r += warps) {
        const int t = tg[r];
        float acc = 0.0f;
        if (lce_ok<C>(t)) {
            for (u64 d = lane; d < C::D; d += 32) acc += ld(x, r * C::D + d) * (C::TR ? ld(w, (u64)t * C::D + d) : ld(w, d * C::V + t));
        }
        for (int o = 16; o > 0; o /= 2) acc += __shfl_down_sync(0xffffffffu, acc, o);
        if (lane == 0) lse[r] = lce_ok<C>(t) ? rows[r] + acc : MEMC_NAN;
    }
}

// p for all rows of column tile `tile` (C::VT columns, the last one narrower): in place of
// their logits, a block a row, or apart from them (C::APART) at `p`.
template <typename T, typename C>
__device__ void lce_probs_tile(float* z, T* p, const int* tg, const float* lse, const float* dr, u64 tile) {
    const u64 v0 = tile * C::VT;
    const u64 width = C::V - v0 < C::VT ? C::V - v0 : C::VT;
    if (C::APART) {
        lce_probs_apart<T, C>(z, p, tg, dr, 0, C::N, v0, width, C::VTLD, [&](u64 i) { return lse[i]; });
        return;
    }
    for (u64 r = blockIdx.x; r < C::N; r += gridDim.x) lce_grad_row<T, C>(z + r * C::VTLD, lse[r], tg[r], v0, width, dr[r]);
}

// The forward's stages for chunk `chunk`: phase 0 the rows' partials, phase 1 their losses;
// one stage when a row is one slice.
template <typename T, typename C> __device__ void lce_forward_kernel(char* arena, u64 o_x, u64 o_w, u64 o_t, u64 o_out, u64 o_ws, u64 phase, u64 chunk) {
    const float* z = tensor_at<float>(arena, o_ws);
    float* part = tensor_at<float>(arena, o_ws + C::LOFF);
    const int* tg = tensor_at<int>(arena, o_t);
    float* out = tensor_at<float>(arena, o_out);
    if (C::SPLITS == 1) lce_row_losses<C>(z, tg, out, chunk);
    else if (phase == 0) lce_row_partials<C>(z, part, chunk);
    else lce_rows<C>(z, part, tg, out, chunk);
}

// The input gradient's stage: p of chunk `chunk`.
template <typename T, typename C>
__device__ void lce_backward_input_kernel(char* arena, u64 o_x, u64 o_w, u64 o_t, u64 o_rows, u64 o_dr, u64 o_dx, u64 o_ws, u64 phase, u64 chunk) {
    lce_probs_rows<T, C>(tensor_at<float>(arena, o_ws), tensor_at<T>(arena, o_ws + C::POFF), tensor_at<int>(arena, o_t),
                         tensor_at<float>(arena, o_rows), tensor_at<float>(arena, o_dr), chunk);
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
        lce_probs_tile<T, C>(tensor_at<float>(arena, o_ws), tensor_at<T>(arena, o_ws + C::POFF), tensor_at<int>(arena, o_t), lse,
                             tensor_at<float>(arena, o_dr), chunk);
    }
}
