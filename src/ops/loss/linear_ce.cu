// The fused linear cross-entropy's elementwise stages between its cuBLASLt GEMMs: hidden
// states x [N, D], weight W [D, V] (C::TR false) or an embedding table E [V, D] read as its
// transpose (C::TR true), targets [N]. The logits z = x @ W never exist whole: a GEMM writes
// one chunk of them in fp32 into the workspace (C::CHUNK rows of all V columns, row stride
// C::VLD, for the forward and the input gradient; all N rows of a tile of C::VT columns,
// row stride C::VTLD, for the weight gradient; both strides padded for aligned rows).
// These kernels turn it into per-row losses (through partial log-sum-exps at byte C::LOFF)
// or into the logits' gradient p = (exp(z - lse) - [v == t]) * g in T (row stride as z's)
// at byte C::POFF, which the next GEMM consumes. The weight gradient's tiles read each
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

// Each row's log-sum-exp in C::SPLITS column slices, so a chunk's few rows still fill the GPU:
// block b takes row b / SPLITS, slice b % SPLITS, and writes its max and its sum of exp(z - max)
// to the partials at byte C::LOFF (two floats per row and slice; an empty slice -inf, 0).
template <typename C> __device__ void lce_row_partials(const float* z, float* part, u64 chunk) {
    u64 r0;
    const u64 rn = lce_rows_in<C>(chunk, &r0);
    const u64 span = (C::V + C::SPLITS - 1) / C::SPLITS;
    for (u64 b = blockIdx.x; b < rn * C::SPLITS; b += gridDim.x) {
        const float* zr = z + (b / C::SPLITS) * C::VLD;
        const u64 v0 = (b % C::SPLITS) * span, v1 = v0 + span < C::V ? v0 + span : C::V;
        float m = MEMC_NEG_INF;
        for (u64 v = v0 + threadIdx.x; v < v1; v += blockDim.x) m = fmaxf(m, zr[v]);
        m = block_max(m);
        float s = 0.0f;
        for (u64 v = v0 + threadIdx.x; v < v1; v += blockDim.x) s += expf(zr[v] - m);
        s = block_sum(s);
        if (threadIdx.x == 0) {
            part[2 * b] = m;
            part[2 * b + 1] = s;
        }
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
        const int t = tg[r0 + i];
        out[r0 + i] = !ce_kept<C>(t) ? 0.0f : lce_ok<C>(t) ? m + logf(l) - z[i * C::VLD + t] : MEMC_NAN;
    }
}

// The logits' gradient of one element of a row of target t: 0 when the row is dropped.
template <typename C> __device__ __forceinline__ float lce_grad(float z, float lse, int t, u64 v, float g) {
    return ce_kept<C>(t) ? (expf(z - lse) - (v == (u64)t ? 1.0f : 0.0f)) * g : 0.0f;
}

// p for the rows of the chunk (all V columns), its log-sum-exp rows[r] + z[r, t[r]] read
// from the chunk: grid-stride over the chunk's elements.
template <typename T, typename C>
__device__ void lce_probs_rows(const float* z, T* p, const int* tg, const float* rows, const float* dr, u64 chunk) {
    u64 r0;
    const u64 rn = lce_rows_in<C>(chunk, &r0);
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < rn * C::V; e += (u64)gridDim.x * blockDim.x) {
        const u64 i = e / C::V, v = e % C::V, r = r0 + i;
        const int t = tg[r];
        const float lse = lce_ok<C>(t) ? rows[r] + z[i * C::VLD + t] : MEMC_NAN;
        st(p, i * C::VLD + v, lce_grad<C>(z[i * C::VLD + v], lse, t, v, dr[r]));
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

// p for all rows of column tile `tile` (C::VT columns, the last one narrower): grid-stride.
template <typename T, typename C>
__device__ void lce_probs_tile(const float* z, T* p, const int* tg, const float* lse, const float* dr, u64 tile) {
    const u64 v0 = tile * C::VT;
    const u64 width = C::V - v0 < C::VT ? C::V - v0 : C::VT;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < C::N * width; i += (u64)gridDim.x * blockDim.x) {
        const u64 r = i / width, j = i % width;
        st(p, r * C::VTLD + j, lce_grad<C>(z[r * C::VTLD + j], lse[r], tg[r], v0 + j, dr[r]));
    }
}

// The forward's stages for chunk `chunk`: phase 0 the rows' partials, phase 1 their losses.
template <typename T, typename C> __device__ void lce_forward_kernel(char* arena, u64 o_x, u64 o_w, u64 o_t, u64 o_out, u64 o_ws, u64 phase, u64 chunk) {
    const float* z = tensor_at<float>(arena, o_ws);
    float* part = tensor_at<float>(arena, o_ws + C::LOFF);
    if (phase == 0) lce_row_partials<C>(z, part, chunk);
    else lce_rows<C>(z, part, tensor_at<int>(arena, o_t), tensor_at<float>(arena, o_out), chunk);
}

// The input gradient's stage: p of chunk `chunk`.
template <typename T, typename C>
__device__ void lce_backward_input_kernel(char* arena, u64 o_x, u64 o_w, u64 o_t, u64 o_rows, u64 o_dr, u64 o_dx, u64 o_ws, u64 phase, u64 chunk) {
    lce_probs_rows<T, C>(tensor_at<float>(arena, o_ws), tensor_at<T>(arena, o_ws + C::POFF), tensor_at<int>(arena, o_t),
                         tensor_at<float>(arena, o_rows), tensor_at<float>(arena, o_dr), chunk);
}

// The weight gradient's stages: phase 0 every row's log-sum-exp, phase 1 p of tile `chunk`.
template <typename T, typename C>
__device__ void lce_backward_weight_kernel(char* arena, u64 o_x, u64 o_w, u64 o_t, u64 o_rows, u64 o_dr, u64 o_dw, u64 o_ws, u64 phase, u64 chunk) {
    float* lse = tensor_at<float>(arena, o_ws + C::LOFF);
    if (phase == 0) {
        lce_lse<T, C>(tensor_at<T>(arena, o_x), tensor_at<T>(arena, o_w), tensor_at<int>(arena, o_t), tensor_at<float>(arena, o_rows), lse);
    } else {
        lce_probs_tile<T, C>(tensor_at<float>(arena, o_ws), tensor_at<T>(arena, o_ws + C::POFF), tensor_at<int>(arena, o_t), lse,
                             tensor_at<float>(arena, o_dr), chunk);
    }
}
