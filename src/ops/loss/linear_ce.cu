// The fused linear cross-entropy: hidden states x [N, D], weight W [D, V] (C::TR false) or an
// embedding table E [V, D] read as its transpose (C::TR true), targets [N]. No kernel holds
// the N x V logits: each logit is a D-long dot product recomputed where it is consumed, in
// fp32 in d order (so the three kernels see the same value for it). A target out of range
// makes its row's results NaN.

// z[r, v] = sum_d x[r, d] * w[d, v].
template <typename T, typename C> __device__ __forceinline__ float lce_logit(const T* x, const T* w, u64 r, u64 v) {
    float acc = 0.0f;
    for (u64 d = 0; d < C::D; ++d) acc += ld(x, r * C::D + d) * (C::TR ? ld(w, v * C::D + d) : ld(w, d * C::V + v));
    return acc;
}

// w[d, v] in either layout.
template <typename T, typename C> __device__ __forceinline__ float lce_weight(const T* w, u64 d, u64 v) {
    return C::TR ? ld(w, v * C::D + d) : ld(w, d * C::V + v);
}

// Whether target t names a class.
template <typename C> __device__ __forceinline__ bool lce_ok(int t) { return t >= 0 && (u64)t < C::V; }

// rows[r] = logsumexp_v z[r, v] - z[r, t[r]]: one block per row (grid-stride), each thread an
// online log-sum-exp over its columns, combined across the block.
template <typename T, typename C> __device__ void lce_forward_kernel(char* arena, u64 o_x, u64 o_w, u64 o_t, u64 o_out) {
    const T* x = tensor_at<T>(arena, o_x);
    const T* w = tensor_at<T>(arena, o_w);
    const int* tg = tensor_at<int>(arena, o_t);
    float* out = tensor_at<float>(arena, o_out);
    for (u64 r = blockIdx.x; r < C::N; r += gridDim.x) {
        const int t = tg[r];
        float m = MEMC_NEG_INF, s = 0.0f, zt = 0.0f;
        for (u64 v = threadIdx.x; v < C::V; v += blockDim.x) {
            const float z = lce_logit<T, C>(x, w, r, v);
            if (z > m) {
                s = s * expf(m - z) + 1.0f;
                m = z;
            } else {
                s += expf(z - m);
            }
            if (lce_ok<C>(t) && v == (u64)t) zt = z;
        }
        const float bm = block_max(m);
        const float bs = block_sum(m == MEMC_NEG_INF ? 0.0f : s * expf(m - bm));
        // One thread holds z[r, t], the others 0: the sum is exact.
        zt = block_sum(zt);
        if (threadIdx.x == 0) out[r] = lce_ok<C>(t) ? bm + logf(bs) - zt : MEMC_NAN;
    }
}

// The logits' gradient p = (exp(z - lse) - [v == t]) * g for one row, from its log-sum-exp.
__device__ __forceinline__ float lce_grad(float z, float lse, bool target, float g) {
    return (expf(z - lse) - (target ? 1.0f : 0.0f)) * g;
}

// The row's log-sum-exp rows[r] + z[r, t] (NaN for a bad target).
template <typename T, typename C>
__device__ __forceinline__ float lce_lse(const T* x, const T* w, const float* rows, int t, u64 r) {
    return lce_ok<C>(t) ? rows[r] + lce_logit<T, C>(x, w, r, (u64)t) : MEMC_NAN;
}

// dx[r, :] = sum_v p[r, v] w[:, v]: one block per row (grid-stride); the columns in tiles of
// C::BLOCK whose p the block stages in shared memory; each thread accumulates C::DPT
// elements of dx[r] (d = thread + k * BLOCK) in column order.
template <typename T, typename C>
__device__ void lce_backward_input_kernel(char* arena, u64 o_x, u64 o_w, u64 o_t, u64 o_rows, u64 o_dr, u64 o_dx) {
    const T* x = tensor_at<T>(arena, o_x);
    const T* w = tensor_at<T>(arena, o_w);
    const int* tg = tensor_at<int>(arena, o_t);
    const float* rows = tensor_at<float>(arena, o_rows);
    const float* dr = tensor_at<float>(arena, o_dr);
    T* dx = tensor_at<T>(arena, o_dx);
    __shared__ float ps[C::BLOCK];
    __shared__ float lse_s;
    for (u64 r = blockIdx.x; r < C::N; r += gridDim.x) {
        const int t = tg[r];
        if (threadIdx.x == 0) lse_s = lce_lse<T, C>(x, w, rows, t, r);
        __syncthreads();
        const float lse = lse_s, g = dr[r];
        float acc[C::DPT];
#pragma unroll
        for (int k = 0; k < (int)C::DPT; ++k) acc[k] = 0.0f;
        for (u64 v0 = 0; v0 < C::V; v0 += C::BLOCK) {
            const u64 v = v0 + threadIdx.x;
            ps[threadIdx.x] = v < C::V ? lce_grad(lce_logit<T, C>(x, w, r, v), lse, v == (u64)t, g) : 0.0f;
            __syncthreads();
            const u64 n = C::V - v0 < C::BLOCK ? C::V - v0 : C::BLOCK;
            for (u64 j = 0; j < n; ++j) {
                const float p = ps[j];
#pragma unroll
                for (int k = 0; k < (int)C::DPT; ++k) {
                    const u64 d = threadIdx.x + (u64)k * C::BLOCK;
                    if (d < C::D) acc[k] += p * lce_weight<T, C>(w, d, v0 + j);
                }
            }
            __syncthreads();
        }
#pragma unroll
        for (int k = 0; k < (int)C::DPT; ++k) {
            const u64 d = threadIdx.x + (u64)k * C::BLOCK;
            if (d < C::D) st(dx, r * C::D + d, acc[k]);
        }
    }
}

// dw[:, v] = sum_r p[r, v] x[r, :]: each block takes tiles of C::VT columns in turn
// (grid-stride), sums the tile's VT x D gradient in fp32 in its slice of the workspace
// (C::VT * C::D floats per block, each element owned by one thread), rows in chunks of C::RT
// whose p (and log-sum-exp) it stages in shared memory, then stores the tile.
template <typename T, typename C>
__device__ void lce_backward_weight_kernel(char* arena, u64 o_x, u64 o_w, u64 o_t, u64 o_rows, u64 o_dr, u64 o_dw, u64 o_ws) {
    const T* x = tensor_at<T>(arena, o_x);
    const T* w = tensor_at<T>(arena, o_w);
    const int* tg = tensor_at<int>(arena, o_t);
    const float* rows = tensor_at<float>(arena, o_rows);
    const float* dr = tensor_at<float>(arena, o_dr);
    T* dw = tensor_at<T>(arena, o_dw);
    float* acc = tensor_at<float>(arena, o_ws) + (u64)blockIdx.x * C::VT * C::D;
    __shared__ float ps[C::RT * C::VT];
    __shared__ float lse_s[C::RT];
    for (u64 tile = blockIdx.x; tile < C::TILES; tile += gridDim.x) {
        const u64 v0 = tile * C::VT;
        for (u64 i = threadIdx.x; i < C::VT * C::D; i += blockDim.x) acc[i] = 0.0f;
        for (u64 r0 = 0; r0 < C::N; r0 += C::RT) {
            const u64 rn = C::N - r0 < C::RT ? C::N - r0 : C::RT;
            for (u64 i = threadIdx.x; i < rn; i += blockDim.x) lse_s[i] = lce_lse<T, C>(x, w, rows, tg[r0 + i], r0 + i);
            __syncthreads();
            for (u64 i = threadIdx.x; i < rn * C::VT; i += blockDim.x) {
                const u64 ri = i / C::VT, v = v0 + i % C::VT, r = r0 + ri;
                ps[i] = v < C::V ? lce_grad(lce_logit<T, C>(x, w, r, v), lse_s[ri], tg[r] == (int)v, dr[r]) : 0.0f;
            }
            __syncthreads();
            for (u64 i = threadIdx.x; i < C::VT * C::D; i += blockDim.x) {
                const u64 j = i / C::D, d = i % C::D;
                float a = acc[i];
                for (u64 ri = 0; ri < rn; ++ri) a += ps[ri * C::VT + j] * ld(x, (r0 + ri) * C::D + d);
                acc[i] = a;
            }
            __syncthreads();
        }
        for (u64 i = threadIdx.x; i < C::VT * C::D; i += blockDim.x) {
            const u64 v = v0 + i / C::D, d = i % C::D;
            if (v < C::V) st(dw, C::TR ? v * C::D + d : d * C::V + v, acc[i]);
        }
    }
}
