//! Losses: mean cross-entropy over integer targets and mean squared error, with backwards.
//! The scalar losses are two-stage reductions: phase 0 spreads the rows (elements) over
//! C::PARTS blocks, each writing its sum in fp64 to ws[block]; phase 1, one block, sums the
//! partials in a fixed order (deterministic). An out-of-range target makes the loss NaN.

// Phase 1 of both losses: out[0] = sum of the C::PARTS partials / count (0 when empty).
template <typename C> __device__ __forceinline__ void loss_finish(char* arena, u64 o_out, const double* part, u64 count) {
    const double total = sum_partials(part, C::PARTS);
    if (threadIdx.x == 0) tensor_at<float>(arena, o_out)[0] = count == 0 ? 0.0f : (float)(total / (double)count);
}

// out[0] = mean over rows of logsumexp(logits[row]) - logits[row, target[row]]; block b of
// phase 0 takes rows b, b + PARTS, ... in order.
template <typename T, typename C>
__device__ void cross_entropy_kernel(char* arena, u64 o_logits, u64 o_t, u64 o_out, u64 o_ws, u64 phase) {
    double* part = tensor_at<double>(arena, o_ws);
    if (phase != 0) return loss_finish<C>(arena, o_out, part, C::ROWS);
    const T* x = tensor_at<T>(arena, o_logits);
    const int* tg = tensor_at<int>(arena, o_t);
    double total = 0.0;
    for (u64 r = blockIdx.x; r < C::ROWS; r += gridDim.x) {
        const u64 base = r * C::CL;
        const float2 lse = block_logsumexp(x, base, C::CL, 1);
        const int t = tg[r];
        const bool ok = t >= 0 && (u64)t < C::CL;
        total += (double)((lse.x + lse.y) - (ok ? ld(x, base + (u64)t) : MEMC_NAN));
    }
    if (threadIdx.x == 0) part[blockIdx.x] = total;
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

// out[0] = mean((a - b)^2); block b of phase 0 sums elements [b * CHUNK, (b + 1) * CHUNK).
template <typename T, typename C> __device__ void mse_kernel(char* arena, u64 o_a, u64 o_b, u64 o_out, u64 o_ws, u64 phase) {
    double* part = tensor_at<double>(arena, o_ws);
    if (phase != 0) return loss_finish<C>(arena, o_out, part, C::N);
    const T* a = tensor_at<T>(arena, o_a);
    const T* b = tensor_at<T>(arena, o_b);
    const u64 lo = (u64)blockIdx.x * C::CHUNK, hi = lo + C::CHUNK < C::N ? lo + C::CHUNK : C::N;
    double s = 0.0;
    for (u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const double d = (double)(ld(a, i) - ld(b, i));
        s += d * d;
    }
    s = block_reduce<MemcSum<double>>(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// da = 2 * (a - b) / N * dloss.
template <typename T, typename C> __device__ void mse_backward_kernel(char* arena, u64 o_a, u64 o_b, u64 o_dl, u64 o_da) {
    const T* a = tensor_at<T>(arena, o_a);
    const T* b = tensor_at<T>(arena, o_b);
    const float scale = 2.0f * ld(tensor_at<typename C::TL>(arena, o_dl), 0) / (float)(C::N == 0 ? 1 : C::N);
    T* da = tensor_at<T>(arena, o_da);
    MEMC_GRID_LOOP(i, C::N) st(da, i, (ld(a, i) - ld(b, i)) * scale);
}
