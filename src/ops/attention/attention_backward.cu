// The attention backward's elementwise stages between its cuBLASLt GEMMs. For a unit of
// C::HC query heads (batch items, stride C::RC * C::TKLD in the workspace) and C::RC query
// rows from r0, a GEMM has written the scaled scores s = SCALE * q k^T in fp32 at byte 0 of
// the workspace (row stride C::TKLD, TK padded for aligned rows); for the q and k gradients
// another the fp32 dp = dout v^T at byte C::DPOFF. These kernels turn s into the
// probabilities p (fp32 in place, and in T at byte C::POFF for the next GEMM), and p, dp
// into ds = SCALE * p (dp - D), D = sum_j p dp, in T at byte C::DSOFF. The key gradients sum over row chunks (and a group's query heads)
// in an fp32 accumulator at byte C::ACCOFF ([C::HC, TK, DH]) that the last stage stores.
// A unit is named by `chunk` = (b * H + h0) * TQ + r0. Query i sees the keys
// [attn_kfirst(i), attn_kend(i)) of attention.cu that its batch item's key mask keeps (with
// C::KEY_MASK, `attn_key_kept`); a query with no such key has p = 0, so ds = 0. With a soft
// cap (C::SOFTCAP > 0) the softmax reads attn_cap(s), and with C::SLOPES keeps the cap's slope
// 1 - tanh(s / SOFTCAP)^2 in fp32 at byte C::SLOPEOFF (laid out as s), by which ds is multiplied.
// Without a window a unit's score rows hold all TK keys; with one (C::WINDOW > 0) only the
// kn keys from k0 that its rows see (`attb_keys`), and the GEMMs span just those.

// The unit's first query row, first head, and how many rows and heads it has.
template <typename C> __device__ __forceinline__ void attb_unit(u64 chunk, u64* r0, u64* h0, u64* rows, u64* heads) {
    *r0 = chunk % C::TQ;
    *h0 = (chunk / C::TQ) % C::H;
    *rows = C::TQ - *r0 < C::RC ? C::TQ - *r0 : C::RC;
    *heads = C::H - *h0 < C::HC ? C::H - *h0 : C::HC;
}

// The first key of the score rows of the unit of query rows [r0, r0 + rows) and how many
// keys they hold: with a window those the rows see, at least one; else all TK.
template <typename C> __device__ __forceinline__ void attb_keys(u64 r0, u64 rows, u64* k0, u64* kn) {
    if (C::WINDOW == 0) {
        *k0 = 0;
        *kn = C::TK;
        return;
    }
    const u64 first = attn_kfirst<C>(r0), end = attn_kend<C>(r0 + rows - 1);
    *k0 = first;
    *kn = end > first ? end - first : 1;
}

// p = softmax over the visible keys of each row of s, in place and in T: one block per row.
template <typename T, typename C> __device__ void attb_probs(char* arena, u64 o_mask, char* ws, u64 chunk) {
    u64 r0, h0, rows, heads, k0, kn;
    attb_unit<C>(chunk, &r0, &h0, &rows, &heads);
    attb_keys<C>(r0, rows, &k0, &kn);
    const u64 b = chunk / (C::TQ * C::H);
    float* s = (float*)ws;
    float* slope = (float*)(ws + C::SLOPEOFF);
    T* p = (T*)(ws + C::POFF);
    for (u64 item = blockIdx.x; item < rows * heads; item += gridDim.x) {
        const u64 row = (item / rows) * C::RC * C::TKLD + (item % rows) * C::TKLD;
        const u64 a = attn_kfirst<C>(r0 + item % rows) - k0, n = attn_kend<C>(r0 + item % rows) - k0;
        float m = MEMC_NEG_INF;
        for (u64 j = a + threadIdx.x; j < n; j += blockDim.x)
            if (attn_key_kept<C>(arena, o_mask, b, k0 + j)) m = fmaxf(m, attn_cap<C>(s[row + j]));
        m = block_max(m);
        float l = 0.0f;
        for (u64 j = a + threadIdx.x; j < n; j += blockDim.x)
            if (attn_key_kept<C>(arena, o_mask, b, k0 + j)) l += expf(attn_cap<C>(s[row + j]) - m);
        l = block_sum(l);
        for (u64 j = threadIdx.x; j < kn; j += blockDim.x) {
            const bool seen = j >= a && j < n && attn_key_kept<C>(arena, o_mask, b, k0 + j);
            const float sc = attn_cap<C>(s[row + j]);
            const float v = seen ? expf(sc - m) / l : 0.0f;
            if (C::SLOPES) {
                const float t = sc / C::SOFTCAP;
                slope[row + j] = 1.0f - t * t;
            }
            s[row + j] = v;
            st(p, row + j, v);
        }
    }
}

// ds = SCALE * p (dp - D), D = sum_j p dp over the row (times the cap's slope with C::SLOPES),
// in T: one block per row.
template <typename T, typename C> __device__ void attb_dscores(char* ws, u64 chunk) {
    u64 r0, h0, rows, heads, k0, kn;
    attb_unit<C>(chunk, &r0, &h0, &rows, &heads);
    attb_keys<C>(r0, rows, &k0, &kn);
    const float* p = (const float*)ws;
    const float* dp = (const float*)(ws + C::DPOFF);
    T* ds = (T*)(ws + C::DSOFF);
    const float* slope = (const float*)(ws + C::SLOPEOFF);
    for (u64 item = blockIdx.x; item < rows * heads; item += gridDim.x) {
        const u64 row = (item / rows) * C::RC * C::TKLD + (item % rows) * C::TKLD;
        float d = 0.0f;
        for (u64 j = threadIdx.x; j < kn; j += blockDim.x) d += p[row + j] * dp[row + j];
        d = block_sum(d);
        for (u64 j = threadIdx.x; j < kn; j += blockDim.x)
            st(ds, row + j, C::SCALE * p[row + j] * (dp[row + j] - d) * (C::SLOPES ? slope[row + j] : 1.0f));
    }
}

// How many kv heads from g0 the accumulator of kv unit `chunk` = b * KVH + g0 holds.
template <typename C> __device__ __forceinline__ u64 attb_kv_heads(u64 chunk) {
    const u64 g0 = chunk % C::KVH;
    return C::KVH - g0 < C::HC ? C::KVH - g0 : C::HC;
}

// Zeroes the accumulator of kv unit `chunk` before windowed units add to the rows of the keys
// they see: grid-stride.
template <typename C> __device__ void attb_zero(char* ws, u64 chunk) {
    float* acc = (float*)(ws + C::ACCOFF);
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < attb_kv_heads<C>(chunk) * C::TK * C::DH; i += (u64)gridDim.x * blockDim.x) acc[i] = 0.0f;
}

// The accumulated key gradients of kv heads [g0, g0 + C::HC) of batch b, `chunk` = b * KVH +
// g0, stored into the output [B, TK, KVH * DH] in T: grid-stride.
template <typename T, typename C> __device__ void attb_store(char* ws, T* out, u64 chunk) {
    const u64 b = chunk / C::KVH, g0 = chunk % C::KVH;
    const u64 heads = attb_kv_heads<C>(chunk);
    const float* acc = (const float*)(ws + C::ACCOFF);
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < heads * C::TK * C::DH; i += (u64)gridDim.x * blockDim.x) {
        const u64 g = i / (C::TK * C::DH), j = (i / C::DH) % C::TK, d = i % C::DH;
        st(out, attn_kv<C>(b, j, g0 + g) + d, acc[i]);
    }
}

// Phase 0: probabilities; 1: score gradients; 2: store the accumulated key gradients; 3: zero
// the accumulator. `o_mask` is read only with C::KEY_MASK.
template <typename T, typename C>
__device__ void attention_backward_kernel(char* arena, u64 o_q, u64 o_k, u64 o_v, u64 o_dout, u64 o_mask, u64 o_out, u64 o_ws, u64 phase, u64 chunk) {
    char* ws = arena + o_ws;
    if (phase == 0) attb_probs<T, C>(arena, o_mask, ws, chunk);
    else if (phase == 1) attb_dscores<T, C>(ws, chunk);
    else if (phase == 2) attb_store<T, C>(ws, tensor_at<T>(arena, o_out), chunk);
    else attb_zero<C>(ws, chunk);
}

// Without a key mask: the entry takes no mask offset.
template <typename T, typename C>
__device__ void attention_backward_kernel(char* arena, u64 o_q, u64 o_k, u64 o_v, u64 o_dout, u64 o_out, u64 o_ws, u64 phase, u64 chunk) {
    attention_backward_kernel<T, C>(arena, o_q, o_k, o_v, o_dout, 0, o_out, o_ws, phase, chunk);
}

// The packed backward: one op runs the units of dq, dk and dv in turn over the blocks of x
// (QROW = KVROW = its row); phase 2 stores the accumulated dk into dx's k block, phase 4
// the accumulated dv into its v block, the other phases as above.
template <typename T, typename C>
__device__ void packed_attention_backward_kernel(char* arena, u64 o_x, u64 o_dout, u64 o_mask, u64 o_out, u64 o_ws, u64 phase, u64 chunk) {
    if (phase == 4) attb_store<T, C>(arena + o_ws, tensor_at<T>(arena, attn_v_at<T, C>(o_out)), chunk);
    else if (phase == 2) attb_store<T, C>(arena + o_ws, tensor_at<T>(arena, attn_k_at<T, C>(o_out)), chunk);
    else attention_backward_kernel<T, C>(arena, o_x, 0, 0, o_dout, o_mask, o_out, o_ws, phase, chunk);
}

// Without a key mask: the entry takes no mask offset.
template <typename T, typename C>
__device__ void packed_attention_backward_kernel(char* arena, u64 o_x, u64 o_dout, u64 o_out, u64 o_ws, u64 phase, u64 chunk) {
    packed_attention_backward_kernel<T, C>(arena, o_x, o_dout, 0, o_out, o_ws, phase, chunk);
}
