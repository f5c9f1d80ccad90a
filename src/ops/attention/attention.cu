//! Flash-style multi-head attention (grouped-query, optional causal mask) that never
//! materializes the TQ x TK score matrix: the forward streams K/V tiles through shared memory
//! with an online softmax; the backward recomputes softmax statistics from q, k, v, dout.
//! q/out/dq: [B, TQ, H*DH]; k/v/dk/dv: [B, TK, KVH*DH]; query head h reads kv head
//! h / (H / KVH). Causal: query i sees keys j <= i + TK - TQ; a query with no visible key
//! outputs zeros. C::BT threads per block, C::BC keys per shared tile.

template <typename C> __device__ __forceinline__ u64 attn_nkeys(u64 i) {
    if (!C::CAUSAL) return C::TK;
    const long long lim = (long long)i + (long long)C::TK - (long long)C::TQ + 1;
    return lim < 0 ? 0 : (lim > (long long)C::TK ? C::TK : (u64)lim);
}
template <typename C> __device__ __forceinline__ u64 attn_q(u64 b, u64 i, u64 h) { return (b * C::TQ + i) * (C::H * C::DH) + h * C::DH; }
template <typename C> __device__ __forceinline__ u64 attn_kv(u64 b, u64 j, u64 kh) { return (b * C::TK + j) * (C::KVH * C::DH) + kh * C::DH; }

// Grid: (ceil(TQ / BT), H, B); one thread per query row.
template <typename T, typename C> __device__ void attention_kernel(char* arena, u64 o_q, u64 o_k, u64 o_v, u64 o_out) {
    const T* q = tensor_at<T>(arena, o_q);
    const T* k = tensor_at<T>(arena, o_k);
    const T* v = tensor_at<T>(arena, o_v);
    T* out = tensor_at<T>(arena, o_out);
    __shared__ float Ks[C::BC][C::DH];
    __shared__ float Vs[C::BC][C::DH];
    const u64 b = blockIdx.z, h = blockIdx.y, kh = h / (C::H / C::KVH);
    const u64 i0 = (u64)blockIdx.x * C::BT, i = i0 + threadIdx.x;
    const bool active = i < C::TQ;
    const u64 nk = active ? attn_nkeys<C>(i) : 0;
    const u64 last = (i0 + C::BT - 1 < C::TQ) ? i0 + C::BT - 1 : C::TQ - 1;
    const u64 kmax = attn_nkeys<C>(last);
    float qr[C::DH], o[C::DH];
#pragma unroll
    for (int d = 0; d < (int)C::DH; ++d) {
        qr[d] = active ? ld(q, attn_q<C>(b, i, h) + d) * C::SCALE : 0.0f;
        o[d] = 0.0f;
    }
    float m = MEMC_NEG_INF, l = 0.0f;
    for (u64 j0 = 0; j0 < kmax; j0 += C::BC) {
        for (u64 e = threadIdx.x; e < C::BC * C::DH; e += blockDim.x) {
            const u64 jj = e / C::DH, d = e % C::DH, j = j0 + jj;
            Ks[jj][d] = j < C::TK ? ld(k, attn_kv<C>(b, j, kh) + d) : 0.0f;
            Vs[jj][d] = j < C::TK ? ld(v, attn_kv<C>(b, j, kh) + d) : 0.0f;
        }
        __syncthreads();
        for (u64 jj = 0; jj < C::BC; ++jj) {
            if (j0 + jj >= nk) break;
            float s = 0.0f;
#pragma unroll
            for (int d = 0; d < (int)C::DH; ++d) s = fmaf(qr[d], Ks[jj][d], s);
            const float mn = fmaxf(m, s);
            const float corr = expf(m - mn), p = expf(s - mn);
            l = l * corr + p;
#pragma unroll
            for (int d = 0; d < (int)C::DH; ++d) o[d] = fmaf(p, Vs[jj][d], o[d] * corr);
            m = mn;
        }
        __syncthreads();
    }
    if (active) {
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
        for (int d = 0; d < (int)C::DH; ++d) st(out, attn_q<C>(b, i, h) + d, o[d] * inv);
    }
}

// Softmax statistics of query row (b, i, h) over its visible keys, recomputed from k and v:
// max score m, normalizer l, and D = sum_j p_j (dout . v_j). qr is pre-scaled.
template <typename T, typename C>
__device__ __forceinline__ void attn_row_stats(const T* k, const T* v, u64 b, u64 i, u64 kh, const float* qr,
                                               const float* dor, float& m, float& l, float& dd) {
    m = MEMC_NEG_INF;
    l = 0.0f;
    float du = 0.0f;
    const u64 nk = attn_nkeys<C>(i);
    for (u64 j = 0; j < nk; ++j) {
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int d = 0; d < (int)C::DH; ++d) {
            s = fmaf(qr[d], ld(k, attn_kv<C>(b, j, kh) + d), s);
            dp = fmaf(dor[d], ld(v, attn_kv<C>(b, j, kh) + d), dp);
        }
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
        du = du * corr + p * dp;
        m = mn;
    }
    dd = l > 0.0f ? du / l : 0.0f;
}

// dq = SCALE * sum_j p_j (dout . v_j - D) k_j. Grid: (ceil(TQ / BT), H, B). The
// accumulator stays in registers (every index unrolled); the thread's scaled query row and
// row of dout in shared memory (padded by one float against bank conflicts), so nothing
// spills at a head dim of 64.
template <typename T, typename C>
__device__ void attention_backward_q_kernel(char* arena, u64 o_q, u64 o_k, u64 o_v, u64 o_do, u64 o_dq) {
    const T* q = tensor_at<T>(arena, o_q);
    const T* k = tensor_at<T>(arena, o_k);
    const T* v = tensor_at<T>(arena, o_v);
    const T* dout = tensor_at<T>(arena, o_do);
    T* dq = tensor_at<T>(arena, o_dq);
    const u64 b = blockIdx.z, h = blockIdx.y, kh = h / (C::H / C::KVH);
    const u64 i = (u64)blockIdx.x * C::BT + threadIdx.x;
    if (i >= C::TQ) return;
    __shared__ float Qs[C::BT][C::DH + 1];
    __shared__ float DOs[C::BT][C::DH + 1];
    float* qr = Qs[threadIdx.x];
    float* dor = DOs[threadIdx.x];
    float acc[C::DH];
#pragma unroll
    for (int d = 0; d < (int)C::DH; ++d) {
        qr[d] = ld(q, attn_q<C>(b, i, h) + d) * C::SCALE;
        dor[d] = ld(dout, attn_q<C>(b, i, h) + d);
        acc[d] = 0.0f;
    }
    float m, l, dd;
    attn_row_stats<T, C>(k, v, b, i, kh, qr, dor, m, l, dd);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const u64 nk = attn_nkeys<C>(i);
    for (u64 j = 0; j < nk; ++j) {
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int d = 0; d < (int)C::DH; ++d) {
            s = fmaf(qr[d], ld(k, attn_kv<C>(b, j, kh) + d), s);
            dp = fmaf(dor[d], ld(v, attn_kv<C>(b, j, kh) + d), dp);
        }
        const float ds = expf(s - m) * inv * (dp - dd);
        // Reload k rather than keep the first loop's DH values live beside acc.
        asm volatile("" ::: "memory");
#pragma unroll
        for (int d = 0; d < (int)C::DH; ++d) acc[d] = fmaf(ds, ld(k, attn_kv<C>(b, j, kh) + d), acc[d]);
    }
#pragma unroll
    for (int d = 0; d < (int)C::DH; ++d) st(dq, attn_q<C>(b, i, h) + d, acc[d] * C::SCALE);
}

// dk_j = SCALE * sum_{h in group, i} p_ij (dout_i . v_j - D_i) q_i;  dv_j = sum p_ij dout_i.
// C::WHICH_V selects dv. Grid: (ceil(TK / BT), KVH, B); one thread per key row; query tiles
// of BT rows are staged in shared memory with their recomputed statistics. The accumulator
// stays in registers; the thread's key row (and for dk its value row) is read from memory
// (cached), so nothing spills at a head dim of 64.
template <typename T, typename C>
__device__ void attention_backward_kv_kernel(char* arena, u64 o_q, u64 o_k, u64 o_v, u64 o_do, u64 o_dst) {
    const T* q = tensor_at<T>(arena, o_q);
    const T* k = tensor_at<T>(arena, o_k);
    const T* v = tensor_at<T>(arena, o_v);
    const T* dout = tensor_at<T>(arena, o_do);
    T* dst = tensor_at<T>(arena, o_dst);
    __shared__ float Qs[C::BT][C::DH];
    __shared__ float DOs[C::BT][C::DH];
    __shared__ float Ms[C::BT], Ls[C::BT], Ds[C::BT];
    const u64 b = blockIdx.z, kh = blockIdx.y, group = C::H / C::KVH;
    const u64 j = (u64)blockIdx.x * C::BT + threadIdx.x;
    const bool active = j < C::TK;
    float acc[C::DH];
#pragma unroll
    for (int d = 0; d < (int)C::DH; ++d) acc[d] = 0.0f;
    for (u64 h = kh * group; h < (kh + 1) * group; ++h) {
        for (u64 i0 = 0; i0 < C::TQ; i0 += C::BT) {
            const u64 i = i0 + threadIdx.x;
            if (i < C::TQ) {
                for (int d = 0; d < (int)C::DH; ++d) {
                    Qs[threadIdx.x][d] = ld(q, attn_q<C>(b, i, h) + d) * C::SCALE;
                    DOs[threadIdx.x][d] = ld(dout, attn_q<C>(b, i, h) + d);
                }
                float m, l, dd;
                attn_row_stats<T, C>(k, v, b, i, kh, Qs[threadIdx.x], DOs[threadIdx.x], m, l, dd);
                Ms[threadIdx.x] = m;
                Ls[threadIdx.x] = l > 0.0f ? 1.0f / l : 0.0f;
                Ds[threadIdx.x] = dd;
            }
            __syncthreads();
            if (active) {
                for (u64 ii = 0; ii < C::BT && i0 + ii < C::TQ; ++ii) {
                    if (j >= attn_nkeys<C>(i0 + ii)) continue;
                    float s = 0.0f;
#pragma unroll
                    for (int d = 0; d < (int)C::DH; ++d) s = fmaf(Qs[ii][d], ld(k, attn_kv<C>(b, j, kh) + d), s);
                    const float p = expf(s - Ms[ii]) * Ls[ii];
                    if (C::WHICH_V) {
#pragma unroll
                        for (int d = 0; d < (int)C::DH; ++d) acc[d] = fmaf(p, DOs[ii][d], acc[d]);
                    } else {
                        float dp = 0.0f;
#pragma unroll
                        for (int d = 0; d < (int)C::DH; ++d) {
                            dp = fmaf(DOs[ii][d], ld(v, attn_kv<C>(b, j, kh) + d), dp);
                        }
                        const float ds = p * (dp - Ds[ii]);
#pragma unroll
                        for (int d = 0; d < (int)C::DH; ++d) acc[d] = fmaf(ds, Qs[ii][d], acc[d]);
                    }
                }
            }
            __syncthreads();
        }
    }
    // Qs holds q * SCALE, so dk = sum ds * (q * SCALE) already carries the scale.
    if (active) {
#pragma unroll
        for (int d = 0; d < (int)C::DH; ++d) st(dst, attn_kv<C>(b, j, kh) + d, acc[d]);
    }
}
