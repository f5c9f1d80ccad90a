//! FlashAttention-2's forward on tensor cores for 16-bit q/k/v (after `attention.cu`, whose
//! mask, cap and addressing helpers it shares, and `mma.cu`): one block of four warps per 64 query rows of
//! one head, each warp owning 16 rows. Key/value tiles of C::BK keys stream through shared
//! memory; per tile a warp computes its 16 x BK scores with `mma.sync.m16n8k16` (fp32
//! accumulators), scales, caps and masks them, updates its rows' running maximum and sum
//! (online softmax, fp32, in registers), rescales its 16 x DH output accumulators and adds
//! P V with P as the A operand of the same MMA, split into a rounded part and the rounded
//! remainder (two MMAs), so that the output is as close to fp32 softmax weights as the
//! 16-bit V allows. The sum uses the fp32 probabilities. A warp skips the tiles none of its rows sees; a query with no visible
//! key outputs zeros. C::DH is a multiple of 16, at most 128.

// Loads rows [j0, j0 + BK) of kv head `kh` of batch item `b` of `x` and `y` into the shared
// arrays X and Y (row stride LD), zeros past TK; every thread of the block takes part.
template <typename T, typename C, int BK, int LD>
__device__ __forceinline__ void attn_load_keys(T* X, T* Y, const T* x, const T* y, u64 b, u64 kh, u64 j0) {
    const T zero = from_f32<T>(0.0f);
    for (u64 e = threadIdx.x; e < (u64)BK * C::DH; e += blockDim.x) {
        const u64 jj = e / C::DH, d = e % C::DH, j = j0 + jj;
        X[jj * LD + d] = j < C::TK ? x[attn_kv<C>(b, j, kh) + d] : zero;
        Y[jj * LD + d] = j < C::TK ? y[attn_kv<C>(b, j, kh) + d] : zero;
    }
}

// A warp's 16 query rows of a block of 64 (warp w of blockIdx.x) and the keys they see: the
// lane's two rows (g and g + 8) with their visible ranges, the keys any row of the block
// sees [kmin, kmax), and those any of the warp's rows sees [wmin, wmax).
template <typename C> struct AttnRows {
    u64 rows[2], kfirst[2], kend[2], kmin, kmax, wmin, wmax;
    __device__ __forceinline__ AttnRows(u64 i0, int warp, int g) {
        const u64 w0 = i0 + 16 * (u64)warp;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            rows[r] = w0 + (u64)g + 8 * (u64)r;
            kend[r] = rows[r] < C::TQ ? attn_kend<C>(rows[r]) : 0;
            kfirst[r] = rows[r] < C::TQ ? attn_kfirst<C>(rows[r]) : 0;
        }
        const u64 last = (i0 + 63 < C::TQ) ? i0 + 63 : C::TQ - 1;
        kmin = attn_kfirst<C>(i0);
        kmax = attn_kend<C>(last);
        const u64 wlast = (w0 + 15 < C::TQ) ? w0 + 15 : C::TQ - 1;
        wmin = w0 < C::TQ ? attn_kfirst<C>(w0) : 0;
        wmax = w0 < C::TQ ? attn_kend<C>(wlast) : 0;
    }
    // Whether any of the warp's rows sees a key in [j0, j0 + n).
    __device__ __forceinline__ bool sees(u64 j0, u64 n) const { return j0 < wmax && j0 + n > wmin; }
};

// The warp's scores against the BK keys from j0 in shared memory (Ks, with their mask
// entries Ms): SCALE q k^T capped, -inf where a row does not see the key.
template <typename T, typename C, int KS, int ST, int LD>
__device__ __forceinline__ void attn_score_tile(float (&s)[ST][4], const unsigned (&qa)[KS][4], const T* Ks, const bool* Ms, u64 j0, const AttnRows<C>& w) {
    const int t = (threadIdx.x & 31) & 3;
    mma_rows_times_t<T, KS, ST, LD>(s, qa, Ks);
#pragma unroll
    for (int nt = 0; nt < ST; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int r = c >> 1;
            const u64 jj = nt * 8 + 2 * t + (c & 1), j = j0 + jj;
            const bool seen = Ms[jj] && j >= w.kfirst[r] && j < w.kend[r];
            s[nt][c] = seen ? attn_cap<C>(s[nt][c] * C::SCALE) : MEMC_NEG_INF;
        }
}

// One tile of the online softmax: the rows' running maxima m move to include the tile's
// scores s, which become exp(s - m) (0 where -inf); returns in corr the factor by which
// every earlier sum over the row scales, and adds the tile's probabilities to l.
template <int ST> __device__ __forceinline__ void attn_online(float (&s)[ST][4], float (&m)[2], float (&l)[2], float (&corr)[2]) {
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < ST; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) mx[c >> 1] = fmaxf(mx[c >> 1], s[nt][c]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = mma_quad_max(mx[r]);
        corr[r] = mx[r] == MEMC_NEG_INF ? 1.0f : expf(m[r] - mx[r]);
        m[r] = mx[r];
        l[r] *= corr[r];
    }
#pragma unroll
    for (int nt = 0; nt < ST; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int r = c >> 1;
            s[nt][c] = s[nt][c] == MEMC_NEG_INF ? 0.0f : expf(s[nt][c] - m[r]);
            l[r] += s[nt][c];
        }
}

// Loads the keys of the tile from j0 (kv head kh of batch item b) of `x` and `y` into the
// shared arrays X and Y (row stride LD), zeros past TK, and their key-mask entries into Ms;
// every thread of the block takes part, and the block waits for the tile.
template <typename T, typename C, int BK, int LD>
__device__ __forceinline__ void attn_load_keys(T* X, T* Y, bool* Ms, char* arena, u64 o_mask, const T* x, const T* y, u64 b, u64 kh, u64 j0) {
    const T zero = from_f32<T>(0.0f);
    for (u64 e = threadIdx.x; e < (u64)BK * C::DH; e += blockDim.x) {
        const u64 jj = e / C::DH, d = e % C::DH, j = j0 + jj;
        X[jj * LD + d] = j < C::TK ? x[attn_kv<C>(b, j, kh) + d] : zero;
        Y[jj * LD + d] = j < C::TK ? y[attn_kv<C>(b, j, kh) + d] : zero;
    }
    for (u64 jj = threadIdx.x; jj < (u64)BK; jj += blockDim.x) Ms[jj] = j0 + jj < C::TK && attn_key_kept<C>(arena, o_mask, b, j0 + jj);
    __syncthreads();
}

// Grid: (ceil(TQ / 64), H, B), 128 threads. `o_mask` is read only with C::KEY_MASK.
template <typename T, typename C> __device__ void attention_mma_kernel(char* arena, u64 o_q, u64 o_k, u64 o_v, u64 o_mask, u64 o_out) {
    constexpr int DH = (int)C::DH, BK = (int)C::BK, LD = DH + 8;
    constexpr int KS = DH / 16, NT = DH / 8, ST = BK / 8, PK = BK / 16;
    __shared__ T Ks[BK * LD];
    __shared__ T Vs[BK * LD];
    __shared__ bool Ms[BK];
    const u64 b = blockIdx.z, h = blockIdx.y, kh = h / (C::H / C::KVH);
    const int lane = threadIdx.x & 31, t = lane & 3;
    const AttnRows<C> w((u64)blockIdx.x * 64, threadIdx.x >> 5, lane >> 2);
    unsigned qa[KS][4];
    mma_load_rows<T, KS>(qa, tensor_at<T>(arena, o_q), attn_q<C>(b, w.rows[0], h), w.rows[0] < C::TQ, attn_q<C>(b, w.rows[1], h), w.rows[1] < C::TQ);
    float o[NT][4], m[2] = {MEMC_NEG_INF, MEMC_NEG_INF}, l[2] = {0.0f, 0.0f};
    mma_zero<NT>(o);
    for (u64 j0 = w.kmin; j0 < w.kmax; j0 += BK) {
        attn_load_keys<T, C, BK, LD>(Ks, Vs, Ms, arena, o_mask, tensor_at<T>(arena, o_k), tensor_at<T>(arena, o_v), b, kh, j0);
        if (w.sees(j0, BK)) {
            float s[ST][4], corr[2];
            attn_score_tile<T, C, KS, ST, LD>(s, qa, Ks, Ms, j0, w);
            attn_online<ST>(s, m, l, corr);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) o[nt][c] *= corr[c >> 1];
            // O += P V: the probabilities of 16 keys are the A operand as they lie, split in
            // two 16-bit parts so that P keeps about fp32's precision.
#pragma unroll
            for (int kk = 0; kk < PK; ++kk) {
                unsigned pa[4], pl[4];
                mma_split_scores<T, ST>(pa, pl, s, kk);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    unsigned vb[2];
                    mma_b<T, LD>(vb, Vs, kk * 16, nt * 8);
                    mma_16816<T>(o[nt], pa, vb);
                    mma_16816<T>(o[nt], pl, vb);
                }
            }
        }
        __syncthreads();
    }
    T* out = tensor_at<T>(arena, o_out);
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = mma_quad_sum(l[r]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int r = c >> 1;
            if (w.rows[r] < C::TQ) {
                const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
                st(out, attn_o<C>(b, w.rows[r], h) + nt * 8 + 2 * t + (c & 1), o[nt][c] * inv);
            }
        }
}

// Without a key mask: the entry takes no mask offset.
template <typename T, typename C> __device__ void attention_mma_kernel(char* arena, u64 o_q, u64 o_k, u64 o_v, u64 o_out) {
    attention_mma_kernel<T, C>(arena, o_q, o_k, o_v, 0, o_out);
}

// Packed operands: q, k and v are the column blocks of x at o_x.
template <typename T, typename C> __device__ void packed_attention_mma_kernel(char* arena, u64 o_x, u64 o_mask, u64 o_out) {
    attention_mma_kernel<T, C>(arena, o_x, attn_k_at<T, C>(o_x), attn_v_at<T, C>(o_x), o_mask, o_out);
}
template <typename T, typename C> __device__ void packed_attention_mma_kernel(char* arena, u64 o_x, u64 o_out) {
    packed_attention_mma_kernel<T, C>(arena, o_x, 0, o_out);
}
