//! Losses: mean cross-entropy over integer targets and mean squared error, with backwards.
//! The scalar losses run in one block (fixed-order, deterministic); an out-of-range target
//! makes the loss NaN.

// out[0] = mean over rows of logsumexp(logits[row]) - logits[row, target[row]].
template <typename T, typename C> __device__ void cross_entropy_kernel(char* arena, u64 o_logits, u64 o_t, u64 o_out) {
    const T* x = tensor_at<T>(arena, o_logits);
    const int* tg = tensor_at<int>(arena, o_t);
    float* out = tensor_at<float>(arena, o_out);
    float total = 0.0f;
    for (u64 r = 0; r < C::ROWS; ++r) {
        const u64 base = r * C::CL;
        const float2 lse = block_logsumexp(x, base, C::CL, 1);
        const float m = lse.x, l = lse.y;
        const int t = tg[r];
        const bool ok = t >= 0 && (u64)t < C::CL;
        total += (m + l) - (ok ? ld(x, base + (u64)t) : MEMC_NAN);
    }
    if (threadIdx.x == 0) out[0] = C::ROWS == 0 ? 0.0f : total / (float)C::ROWS;
}

// dlogits = (softmax(logits) - onehot(target)) * dloss / ROWS; one block per row.
template <typename T, typename C>
__device__ void cross_entropy_backward_kernel(char* arena, u64 o_logits, u64 o_t, u64 o_dl, u64 o_dx) {
    const T* x = tensor_at<T>(arena, o_logits);
    const int* tg = tensor_at<int>(arena, o_t);
    const float dl = ld(tensor_at<typename C::TL>(arena, o_dl), 0);
    T* dx = tensor_at<T>(arena, o_dx);
    const float scale = dl / (float)(C::ROWS == 0 ? 1 : C::ROWS);
    for (u64 r = blockIdx.x; r < C::ROWS; r += gridDim.x) {
        const u64 base = r * C::CL;
        const float2 lse = block_logsumexp(x, base, C::CL, 1);
        const float m = lse.x, l = lse.y;
        const int t = tg[r];
        const bool ok = t >= 0 && (u64)t < C::CL;
        for (u64 c = threadIdx.x; c < C::CL; c += blockDim.x) {
            float p = expf(ld(x, base + c) - m - l);
            if (ok && c == (u64)t) p -= 1.0f;
            st(dx, base + c, ok ? p * scale : MEMC_NAN);
        }
    }
}

// out[0] = mean((a - b)^2), one block.
template <typename T, typename C> __device__ void mse_kernel(char* arena, u64 o_a, u64 o_b, u64 o_out) {
    const T* a = tensor_at<T>(arena, o_a);
    const T* b = tensor_at<T>(arena, o_b);
    float* out = tensor_at<float>(arena, o_out);
    float s = 0.0f;
    for (u64 i = threadIdx.x; i < C::N; i += blockDim.x) {
        const float d = ld(a, i) - ld(b, i);
        s += d * d;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) out[0] = C::N == 0 ? 0.0f : s / (float)C::N;
}

// da = 2 * (a - b) / N * dloss.
template <typename T, typename C> __device__ void mse_backward_kernel(char* arena, u64 o_a, u64 o_b, u64 o_dl, u64 o_da) {
    const T* a = tensor_at<T>(arena, o_a);
    const T* b = tensor_at<T>(arena, o_b);
    const float scale = 2.0f * ld(tensor_at<typename C::TL>(arena, o_dl), 0) / (float)(C::N == 0 ? 1 : C::N);
    T* da = tensor_at<T>(arena, o_da);
    MEMC_GRID_LOOP(i, C::N) st(da, i, (ld(a, i) - ld(b, i)) * scale);
}
