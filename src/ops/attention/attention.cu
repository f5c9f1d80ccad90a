//! Flash-style multi-head attention (grouped-query, optional causal mask) that never
//! materializes the TQ x TK score matrix: the forward streams K/V tiles through shared memory
//! with an online softmax.
//! q/out/dq: [B, TQ, H*DH]; k/v/dk/dv: [B, TK, KVH*DH], or q, k, v (dq, dk, dv) the column
//! blocks of one packed [B, T, (H + 2 KVH) * DH] (`attn_q`, `attn_kv`); query head h reads kv head
//! h / (H / KVH). Query i sees keys [attn_kfirst(i), attn_kend(i)), AttnParams::visible_keys's
//! rule: causal, keys j <= i + TK - TQ; with a window (C::WINDOW > 0) also j > i + TK - TQ -
//! WINDOW. With a key mask (C::KEY_MASK; i32 [B, TK]) a query also skips key j of its batch
//! item b when mask[b * TK + j] == 0 (`attn_key_kept`). With C::SOFTCAP > 0 each scaled score
//! s becomes SOFTCAP tanh(s / SOFTCAP) (`attn_cap`). A query with no visible key outputs
//! zeros. C::BT threads per block, C::BC keys per shared tile (with the tile's mask entries); a
//! block loads only the tiles its queries see.

template <typename C> __device__ __forceinline__ u64 attn_kend(u64 i) {
    if (!C::CAUSAL) return C::TK;
    const long long lim = (long long)i + (long long)C::TK - (long long)C::TQ + 1;
    return lim < 0 ? 0 : (lim > (long long)C::TK ? C::TK : (u64)lim);
}
template <typename C> __device__ __forceinline__ u64 attn_kfirst(u64 i) {
    const u64 end = attn_kend<C>(i);
    return (C::WINDOW == 0 || end < C::WINDOW) ? 0 : end - C::WINDOW;
}
// The scaled score s after the soft cap C::SOFTCAP (none when 0): C tanh(s / C).
template <typename C> __device__ __forceinline__ float attn_cap(float s) {
    return C::SOFTCAP > 0.0f ? C::SOFTCAP * tanhf(s / C::SOFTCAP) : s;
}
// Whether the key mask at `o_mask` (none unless C::KEY_MASK) lets batch item b attend key j.
template <typename C> __device__ __forceinline__ bool attn_key_kept(char* arena, u64 o_mask, u64 b, u64 j) {
    return !C::KEY_MASK || tensor_at<int>(arena, o_mask)[b * C::TK + j] != 0;
}
// Element offsets of head h of query row i in q (and dq), row stride C::QROW; in out (and
// dout), row stride H * DH; of kv head kh of key j in k, v (and dk, dv), row stride C::KVROW.
// Separate operands have rows of their own heads; packed ones, columns of one
// x[B, T, (H + 2 KVH) * DH] with QROW = KVROW = its row and k, v at `attn_k_at`, `attn_v_at`.
template <typename C> __device__ __forceinline__ u64 attn_q(u64 b, u64 i, u64 h) { return (b * C::TQ + i) * C::QROW + h * C::DH; }
template <typename C> __device__ __forceinline__ u64 attn_o(u64 b, u64 i, u64 h) { return (b * C::TQ + i) * (C::H * C::DH) + h * C::DH; }
template <typename C> __device__ __forceinline__ u64 attn_kv(u64 b, u64 j, u64 kh) { return (b * C::TK + j) * C::KVROW + kh * C::DH; }
// Byte offsets of the k and v blocks of a packed x at byte o_x.
template <typename T, typename C> __device__ __forceinline__ u64 attn_k_at(u64 o_x) { return o_x + C::H * C::DH * sizeof(T); }
template <typename T, typename C> __device__ __forceinline__ u64 attn_v_at(u64 o_x) { return o_x + (C::H + C::KVH) * C::DH * sizeof(T); }

// Grid: (ceil(TQ / BT), H, B); one thread per query row. `o_mask` is read only with C::KEY_MASK.
template <typename T, typename C> __device__ void attention_kernel(char* arena, u64 o_q, u64 o_k, u64 o_v, u64 o_mask, u64 o_out) {
    const T* q = tensor_at<T>(arena, o_q);
    const T* k = tensor_at<T>(arena, o_k);
    const T* v = tensor_at<T>(arena, o_v);
    T* out = tensor_at<T>(arena, o_out);
    // Each thread's scaled query row lives in shared memory (a row padded by one float, so
    // the threads of a warp read different banks): in registers beside its output row it
    // spills at a head dim of 128.
    __shared__ float Qs[C::BT][C::DH + 1];
    __shared__ float Ks[C::BC][C::DH];
    __shared__ float Vs[C::BC][C::DH];
    __shared__ bool Ms[C::BC];
    const u64 b = blockIdx.z, h = blockIdx.y, kh = h / (C::H / C::KVH);
    const u64 i0 = (u64)blockIdx.x * C::BT, i = i0 + threadIdx.x;
    const bool active = i < C::TQ;
    const u64 nk = active ? attn_kend<C>(i) : 0, k0 = active ? attn_kfirst<C>(i) : 0;
    const u64 last = (i0 + C::BT - 1 < C::TQ) ? i0 + C::BT - 1 : C::TQ - 1;
    const u64 kmin = attn_kfirst<C>(i0), kmax = attn_kend<C>(last);
    float* qr = Qs[threadIdx.x];
    float o[C::DH];
#pragma unroll
    for (int d = 0; d < (int)C::DH; ++d) {
        qr[d] = active ? ld(q, attn_q<C>(b, i, h) + d) * C::SCALE : 0.0f;
        o[d] = 0.0f;
    }
    float m = MEMC_NEG_INF, l = 0.0f;
    for (u64 j0 = kmin; j0 < kmax; j0 += C::BC) {
        for (u64 e = threadIdx.x; e < C::BC * C::DH; e += blockDim.x) {
            const u64 jj = e / C::DH, d = e % C::DH, j = j0 + jj;
            Ks[jj][d] = j < C::TK ? ld(k, attn_kv<C>(b, j, kh) + d) : 0.0f;
            Vs[jj][d] = j < C::TK ? ld(v, attn_kv<C>(b, j, kh) + d) : 0.0f;
        }
        for (u64 jj = threadIdx.x; jj < C::BC; jj += blockDim.x) Ms[jj] = j0 + jj < C::TK && attn_key_kept<C>(arena, o_mask, b, j0 + jj);
        __syncthreads();
        for (u64 jj = 0; jj < C::BC; ++jj) {
            if (j0 + jj >= nk) break;
            if (j0 + jj < k0 || !Ms[jj]) continue;
            float s = 0.0f;
#pragma unroll
            for (int d = 0; d < (int)C::DH; ++d) s = fmaf(qr[d], Ks[jj][d], s);
            s = attn_cap<C>(s);
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
        for (int d = 0; d < (int)C::DH; ++d) st(out, attn_o<C>(b, i, h) + d, o[d] * inv);
    }
}

// Without a key mask: the entry takes no mask offset.
template <typename T, typename C> __device__ void attention_kernel(char* arena, u64 o_q, u64 o_k, u64 o_v, u64 o_out) {
    attention_kernel<T, C>(arena, o_q, o_k, o_v, 0, o_out);
}

// Packed operands: q, k and v are the column blocks of x at o_x.
template <typename T, typename C> __device__ void packed_attention_kernel(char* arena, u64 o_x, u64 o_mask, u64 o_out) {
    attention_kernel<T, C>(arena, o_x, attn_k_at<T, C>(o_x), attn_v_at<T, C>(o_x), o_mask, o_out);
}
template <typename T, typename C> __device__ void packed_attention_kernel(char* arena, u64 o_x, u64 o_out) {
    packed_attention_kernel<T, C>(arena, o_x, 0, o_out);
}
