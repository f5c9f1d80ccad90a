//! FlashAttention-2's backward on tensor cores for 16-bit operands (after `attention.cu`,
//! `mma.cu` and `attention_mma.cu`), one op per gradient (C::WHICH: 0 dq in one launch, 1 dk
//! and 2 dv in two), or the packed op's three in three, or two with dk and dv together
//! (C::DKV) (`packed_attention_backward_mma_kernel`), 128 threads a block, no scores in
//! memory:
//! - phase 0, the row statistics (grid (ceil(TQ / 64), H, B), as the forward): one online pass
//!   over the keys each row sees gives its log-sum-exp L = m + log l of the scaled, capped,
//!   masked scores (+inf for a row that sees no key) and, for dq and dk, D = sum_j p_j dp_j
//!   with dp = dout v^T (which is dout . out); fp32 in the workspace, [B, H, TQ] L at byte 0,
//!   D at byte C::DOFF. dq's block then goes on to the gradient of the same rows;
//! - the gradient from p = exp(s - L) and ds = SCALE p (dp - D) (times the cap's slope
//!   1 - (cap(s) / SOFTCAP)^2): dq (in phase 0) per 64 query rows of a head over the key
//!   tiles they see, dq = sum_j ds_j k_j; dk or dv (phase 1) per 64 keys of a kv head (grid (ceil(TK / 64), KVH, B))
//!   over its group's query heads and the C::BK-row query tiles that see the keys,
//!   dv = sum_i p_i dout_i, dk = sum_i ds_i q_i. With C::QSPLIT > 1 (dk or dv over keys too
//!   few to fill the GPU) each 64 keys take QSPLIT blocks, each over its share of the query
//!   tiles, writing fp32 partials at byte C::POFF; phase 2 sums them in split order
//!   (grid (ceil(TK DH / 128), KVH, B)) and stores the gradient.
//! Every gradient sums in fp32 registers in a fixed order and is stored once: deterministic,
//! no atomics. C::BK is the looped tile (keys for dq and the statistics, query rows for dk
//! and dv).

// The softmax gradient of one score: p (dp - D), times SCALE and, with a soft cap, the cap's
// slope at the capped score `capped`.
template <typename C> __device__ __forceinline__ float attb_ds(float p, float dp, float d, float capped) {
    if (p == 0.0f) return 0.0f;
    const float slope = C::SOFTCAP > 0.0f ? 1.0f - (capped / C::SOFTCAP) * (capped / C::SOFTCAP) : 1.0f;
    return p * (dp - d) * slope * C::SCALE;
}

// Shared memory of both phases: two tiles of C::BK rows (keys, or query rows and their
// output gradients), the query rows' L and D, and the keys' mask entries.
template <typename T, typename C> struct AttbShared {
    T* x;
    T* y;
    float* l;
    float* d;
    bool* kept;
};

// Phase 0: L (and, WITH_D, D) of the block's 64 query rows.
template <typename T, typename C, bool WITH_D> __device__ void attb_mma_stats(char* arena, u64 o_q, u64 o_k, u64 o_v, u64 o_dout, u64 o_mask, char* ws, AttbShared<T, C> sh) {
    constexpr int DH = (int)C::DH, BK = (int)C::BK, LD = DH + 8, KS = DH / 16, ST = BK / 8;
    T* Ks = sh.x;
    T* Vs = sh.y;
    bool* Ms = sh.kept;
    const u64 b = blockIdx.z, h = blockIdx.y, kh = h / (C::H / C::KVH);
    const int lane = threadIdx.x & 31;
    const AttnRows<C> w((u64)blockIdx.x * 64, threadIdx.x >> 5, lane >> 2);
    const bool ok0 = w.rows[0] < C::TQ, ok1 = w.rows[1] < C::TQ;
    unsigned qa[KS][4], da[KS][4];
    mma_load_rows<T, KS>(qa, tensor_at<T>(arena, o_q), attn_q<C>(b, w.rows[0], h), ok0, attn_q<C>(b, w.rows[1], h), ok1);
    if constexpr (WITH_D) mma_load_rows<T, KS>(da, tensor_at<T>(arena, o_dout), attn_o<C>(b, w.rows[0], h), ok0, attn_o<C>(b, w.rows[1], h), ok1);
    float m[2] = {MEMC_NEG_INF, MEMC_NEG_INF}, l[2] = {0.0f, 0.0f}, dsum[2] = {0.0f, 0.0f};
    for (u64 j0 = w.kmin; j0 < w.kmax; j0 += BK) {
        attn_load_keys<T, C, BK, LD>(Ks, Vs, Ms, arena, o_mask, tensor_at<T>(arena, o_k), tensor_at<T>(arena, o_v), b, kh, j0);
        if (w.sees(j0, BK)) {
            float s[ST][4], dp[ST][4], corr[2];
            attn_score_tile<T, C, KS, ST, LD>(s, qa, Ks, Ms, j0, w);
            if constexpr (WITH_D) mma_rows_times_t<T, KS, ST, LD>(dp, da, Vs);
            attn_online<ST>(s, m, l, corr);
            if constexpr (WITH_D) {
#pragma unroll
                for (int r = 0; r < 2; ++r) dsum[r] *= corr[r];
#pragma unroll
                for (int nt = 0; nt < ST; ++nt)
#pragma unroll
                    for (int c = 0; c < 4; ++c) dsum[c >> 1] += s[nt][c] * dp[nt][c];
            }
        }
        __syncthreads();
    }
    float* lse = reinterpret_cast<float*>(ws);
    float* dd = reinterpret_cast<float*>(ws + C::DOFF);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] = mma_quad_sum(l[r]);
        dsum[r] = mma_quad_sum(dsum[r]);
        if (w.rows[r] < C::TQ && (lane & 3) == 0) {
            const u64 at = (b * C::H + h) * C::TQ + w.rows[r];
            lse[at] = l[r] > 0.0f ? m[r] + logf(l[r]) : MEMC_INF;
            if (WITH_D) dd[at] = l[r] > 0.0f ? dsum[r] / l[r] : 0.0f;
        }
    }
}

// Phase 1 of dq: the block's 64 query rows of head h over the key tiles they see.
template <typename T, typename C> __device__ void attb_mma_dq(char* arena, u64 o_q, u64 o_k, u64 o_v, u64 o_dout, u64 o_mask, u64 o_out, char* ws, AttbShared<T, C> sh) {
    constexpr int DH = (int)C::DH, BK = (int)C::BK, LD = DH + 8, KS = DH / 16, NT = DH / 8, ST = BK / 8;
    T* Ks = sh.x;
    T* Vs = sh.y;
    bool* Ms = sh.kept;
    const u64 b = blockIdx.z, h = blockIdx.y, kh = h / (C::H / C::KVH);
    const int lane = threadIdx.x & 31, t = lane & 3;
    const AttnRows<C> w((u64)blockIdx.x * 64, threadIdx.x >> 5, lane >> 2);
    const bool ok0 = w.rows[0] < C::TQ, ok1 = w.rows[1] < C::TQ;
    unsigned qa[KS][4], da[KS][4];
    mma_load_rows<T, KS>(qa, tensor_at<T>(arena, o_q), attn_q<C>(b, w.rows[0], h), ok0, attn_q<C>(b, w.rows[1], h), ok1);
    mma_load_rows<T, KS>(da, tensor_at<T>(arena, o_dout), attn_o<C>(b, w.rows[0], h), ok0, attn_o<C>(b, w.rows[1], h), ok1);
    float lse[2], dd[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const u64 at = (b * C::H + h) * C::TQ + (w.rows[r] < C::TQ ? w.rows[r] : 0);
        lse[r] = reinterpret_cast<const float*>(ws)[at];
        dd[r] = reinterpret_cast<const float*>(ws + C::DOFF)[at];
    }
    float acc[NT][4];
    mma_zero<NT>(acc);
    for (u64 j0 = w.kmin; j0 < w.kmax; j0 += BK) {
        attn_load_keys<T, C, BK, LD>(Ks, Vs, Ms, arena, o_mask, tensor_at<T>(arena, o_k), tensor_at<T>(arena, o_v), b, kh, j0);
        if (w.sees(j0, BK)) {
            float s[ST][4], dp[ST][4];
            attn_score_tile<T, C, KS, ST, LD>(s, qa, Ks, Ms, j0, w);
            mma_rows_times_t<T, KS, ST, LD>(dp, da, Vs);
#pragma unroll
            for (int nt = 0; nt < ST; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int r = c >> 1;
                    const float p = s[nt][c] == MEMC_NEG_INF ? 0.0f : expf(s[nt][c] - lse[r]);
                    s[nt][c] = attb_ds<C>(p, dp[nt][c], dd[r], s[nt][c]);
                }
            // dq += ds k: the score gradients of 16 keys are the A operand as they lie.
            mma_add_scores_times<T, ST, NT, LD>(acc, s, Ks);
        }
        __syncthreads();
    }
    T* out = tensor_at<T>(arena, o_out);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c)
            if (w.rows[c >> 1] < C::TQ) st(out, attn_q<C>(b, w.rows[c >> 1], h) + nt * 8 + 2 * t + (c & 1), acc[nt][c]);
}

// Stores a warp's accumulated gradient rows of its two keys (those inside the sequence).
template <typename T, typename C, int NT>
__device__ __forceinline__ void attb_store_keys(T* out, const float (&acc)[NT][4], u64 b, const u64 (&keys)[2], u64 kh, int t) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c)
            if (keys[c >> 1] < C::TK) st(out, attn_kv<C>(b, keys[c >> 1], kh) + nt * 8 + 2 * t + (c & 1), acc[nt][c]);
}

// Stores a warp's fp32 partial gradient rows of its two keys (those inside the sequence) at
// part[key DH + column].
template <typename C, int NT>
__device__ __forceinline__ void attb_store_partial(float* part, const float (&acc)[NT][4], const u64 (&keys)[2], int t) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c)
            if (keys[c >> 1] < C::TK) part[keys[c >> 1] * C::DH + nt * 8 + 2 * t + (c & 1)] = acc[nt][c];
}

// Phase 1 of dk (DK) and/or dv (DV), into o_dk and o_dv: the block's 64 keys of kv head
// blockIdx.y, each warp 16 of them, over the query tiles of the group's heads that see
// them; both at once share each tile's scores and probabilities.
template <typename T, typename C, bool DK, bool DV>
__device__ void attb_mma_dkv(char* arena, u64 o_q, u64 o_k, u64 o_v, u64 o_dout, u64 o_mask, u64 o_dk, u64 o_dv, char* ws, AttbShared<T, C> sh) {
    constexpr int DH = (int)C::DH, BQ = (int)C::BK, LD = DH + 8, KS = DH / 16, NT = DH / 8, ST = BQ / 8;
    T* Qs = sh.x;
    T* Os = sh.y;
    float* Ls = sh.l;
    float* Ds = sh.d;
    const u64 b = blockIdx.z, kh = blockIdx.y, group = C::H / C::KVH;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const u64 split = blockIdx.x % C::QSPLIT, kb0 = (u64)(blockIdx.x / C::QSPLIT) * 64, kw0 = kb0 + 16 * (u64)warp;
    // The split's query tiles: an equal share of ceil(TQ / BQ), in order.
    const u64 share = (C::TQ + (u64)BQ * C::QSPLIT - 1) / ((u64)BQ * C::QSPLIT) * BQ;
    const u64 q0 = split * share, q1 = q0 + share < C::TQ ? q0 + share : C::TQ;
    const u64 keys[2] = {kw0 + g, kw0 + g + 8};
    bool kept[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) kept[r] = keys[r] < C::TK && attn_key_kept<C>(arena, o_mask, b, keys[r]);
    unsigned ka[KS][4], va[KS][4];
    mma_load_rows<T, KS>(ka, tensor_at<T>(arena, o_k), attn_kv<C>(b, keys[0], kh), kept[0], attn_kv<C>(b, keys[1], kh), kept[1]);
    if constexpr (DK) mma_load_rows<T, KS>(va, tensor_at<T>(arena, o_v), attn_kv<C>(b, keys[0], kh), kept[0], attn_kv<C>(b, keys[1], kh), kept[1]);
    const T* q = tensor_at<T>(arena, o_q);
    const T* dout = tensor_at<T>(arena, o_dout);
    const T zero = from_f32<T>(0.0f);
    float acck[NT][4], accv[NT][4];
    mma_zero<NT>(acck);
    mma_zero<NT>(accv);
    for (u64 h = kh * group; h < (kh + 1) * group; ++h) {
        for (u64 i0 = q0; i0 < q1; i0 += BQ) {
            // Query rows see keys in ranges that only move forward with the row.
            const u64 ilast = i0 + BQ - 1 < C::TQ ? i0 + BQ - 1 : C::TQ - 1;
            if (attn_kend<C>(ilast) <= kb0 || attn_kfirst<C>(i0) >= kb0 + 64) continue;
            for (u64 e = threadIdx.x; e < (u64)BQ * DH; e += blockDim.x) {
                const u64 ii = e / DH, d = e % DH, i = i0 + ii;
                Qs[ii * LD + d] = i < C::TQ ? q[attn_q<C>(b, i, h) + d] : zero;
                Os[ii * LD + d] = i < C::TQ ? dout[attn_o<C>(b, i, h) + d] : zero;
            }
            for (u64 ii = threadIdx.x; ii < (u64)BQ; ii += blockDim.x) {
                const u64 at = (b * C::H + h) * C::TQ + i0 + ii;
                Ls[ii] = i0 + ii < C::TQ ? reinterpret_cast<const float*>(ws)[at] : MEMC_INF;
                Ds[ii] = i0 + ii < C::TQ && DK ? reinterpret_cast<const float*>(ws + C::DOFF)[at] : 0.0f;
            }
            __syncthreads();
            if (attn_kend<C>(ilast) > kw0 && attn_kfirst<C>(i0) < kw0 + 16) {
                // s^T = k q^T: the warp's 16 keys by the tile's query rows.
                float s[ST][4], dp[ST][4];
                mma_rows_times_t<T, KS, ST, LD>(s, ka, Qs);
                if constexpr (DK) mma_rows_times_t<T, KS, ST, LD>(dp, va, Os);
#pragma unroll
                for (int nt = 0; nt < ST; ++nt)
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        const int r = c >> 1;
                        const u64 ii = nt * 8 + 2 * t + (c & 1), i = i0 + ii, j = keys[r];
                        const bool seen = kept[r] && i < C::TQ && j >= attn_kfirst<C>(i) && j < attn_kend<C>(i);
                        const float capped = attn_cap<C>(s[nt][c] * C::SCALE);
                        const float p = seen ? expf(capped - Ls[ii]) : 0.0f;
                        if constexpr (DK) dp[nt][c] = attb_ds<C>(p, dp[nt][c], Ds[ii], capped);
                        s[nt][c] = p;
                    }
                // dv += p^T dout, dk += ds^T q: 16 query rows at a time as the A operand.
                if constexpr (DV) mma_add_scores_times<T, ST, NT, LD>(accv, s, Os);
                if constexpr (DK) mma_add_scores_times<T, ST, NT, LD>(acck, dp, Qs);
            }
            __syncthreads();
        }
    }
    if constexpr (C::QSPLIT > 1) {
        float* part = reinterpret_cast<float*>(ws + C::POFF) + ((split * C::B + b) * C::KVH + kh) * C::TK * C::DH;
        if constexpr (DK) attb_store_partial<C, NT>(part, acck, keys, t);
        else attb_store_partial<C, NT>(part, accv, keys, t);
        return;
    }
    if constexpr (DK) attb_store_keys<T, C, NT>(tensor_at<T>(arena, o_dk), acck, b, keys, kh, t);
    if constexpr (DV) attb_store_keys<T, C, NT>(tensor_at<T>(arena, o_dv), accv, b, keys, kh, t);
}

// Phase 2 with C::QSPLIT > 1: element e of kv head blockIdx.y's [TK, DH] gradient of batch
// item blockIdx.z, the sum of the splits' partials in split order.
template <typename T, typename C>
__device__ void attb_dkv_finish(char* arena, u64 o_out, const char* ws) {
    const u64 b = blockIdx.z, kh = blockIdx.y, e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= C::TK * C::DH) return;
    const float* part = reinterpret_cast<const float*>(ws + C::POFF) + (b * C::KVH + kh) * C::TK * C::DH + e;
    float acc = 0.0f;
    for (u64 s = 0; s < C::QSPLIT; ++s) acc += part[s * C::B * C::KVH * C::TK * C::DH];
    st(tensor_at<T>(arena, o_out), attn_kv<C>(b, e / C::DH, kh) + e % C::DH, acc);
}

// The shared memory of a block of either phase, declared once per kernel.
#define ATTB_SHARED                                     \
    __shared__ T tile_x[C::BK * (C::DH + 8)];           \
    __shared__ T tile_y[C::BK * (C::DH + 8)];           \
    __shared__ float row_l[C::BK];                      \
    __shared__ float row_d[C::BK];                      \
    __shared__ bool key_kept[C::BK];                    \
    const AttbShared<T, C> sh{tile_x, tile_y, row_l, row_d, key_kept}

template <typename T, typename C>
__device__ void attention_backward_mma_kernel(char* arena, u64 o_q, u64 o_k, u64 o_v, u64 o_dout, u64 o_mask, u64 o_out, u64 o_ws, u64 phase, u64) {
    ATTB_SHARED;
    char* ws = arena + o_ws;
    if (phase == 0) {
        attb_mma_stats<T, C, C::WHICH != 2>(arena, o_q, o_k, o_v, o_dout, o_mask, ws, sh);
        // dq's rows are the statistics' rows: the block goes on to them.
        if constexpr (C::WHICH == 0) {
            __syncthreads();
            attb_mma_dq<T, C>(arena, o_q, o_k, o_v, o_dout, o_mask, o_out, ws, sh);
        }
    } else if (phase == 2) {
        attb_dkv_finish<T, C>(arena, o_out, ws);
    } else if constexpr (C::WHICH != 0) {
        attb_mma_dkv<T, C, C::WHICH == 1, C::WHICH == 2>(arena, o_q, o_k, o_v, o_dout, o_mask, o_out, o_out, ws, sh);
    }
}

// Without a key mask: the entry takes no mask offset.
template <typename T, typename C>
__device__ void attention_backward_mma_kernel(char* arena, u64 o_q, u64 o_k, u64 o_v, u64 o_dout, u64 o_out, u64 o_ws, u64 phase, u64 chunk) {
    attention_backward_mma_kernel<T, C>(arena, o_q, o_k, o_v, o_dout, 0, o_out, o_ws, phase, chunk);
}

// The packed backward: q, k and v are the column blocks of x at o_x, and dq, dk, dv those of
// dx at o_out (C::QROW = C::KVROW = their row). Phase 0 the statistics with D, once for all
// three, then dq over the same rows (grid (ceil(TQ / 64), H, B)); 2 dk and 3 dv (grid
// (ceil(TK / 64), KVH, B)), or with C::DKV both in phase 2.
template <typename T, typename C>
__device__ void packed_attention_backward_mma_kernel(char* arena, u64 o_x, u64 o_dout, u64 o_mask, u64 o_out, u64 o_ws, u64 phase, u64) {
    ATTB_SHARED;
    char* ws = arena + o_ws;
    const u64 o_k = attn_k_at<T, C>(o_x), o_v = attn_v_at<T, C>(o_x);
    if (phase == 0) {
        attb_mma_stats<T, C, true>(arena, o_x, o_k, o_v, o_dout, o_mask, ws, sh);
        __syncthreads();
        attb_mma_dq<T, C>(arena, o_x, o_k, o_v, o_dout, o_mask, o_out, ws, sh);
    } else if (phase == 2) attb_mma_dkv<T, C, true, C::DKV>(arena, o_x, o_k, o_v, o_dout, o_mask, attn_k_at<T, C>(o_out), attn_v_at<T, C>(o_out), ws, sh);
    else attb_mma_dkv<T, C, false, true>(arena, o_x, o_k, o_v, o_dout, o_mask, 0, attn_v_at<T, C>(o_out), ws, sh);
}

// Without a key mask: the entry takes no mask offset.
template <typename T, typename C>
__device__ void packed_attention_backward_mma_kernel(char* arena, u64 o_x, u64 o_dout, u64 o_out, u64 o_ws, u64 phase, u64 chunk) {
    packed_attention_backward_mma_kernel<T, C>(arena, o_x, o_dout, 0, o_out, o_ws, phase, chunk);
}
