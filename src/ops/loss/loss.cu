//! Losses: mean cross-entropy over integer targets and mean squared error, with backwards,
//! and the count of the rows a cross-entropy keeps. The scalar losses are two-stage
//! reductions: phase 0 spreads the rows (elements) over C::PARTS blocks, each writing its sum
//! in fp64 to ws[block]; phase 1, one block, sums the partials in a fixed order
//! (deterministic). With C::HAS_IGNORE, a row whose target is C::IGNORE takes no loss and no
//! gradient, and the mean divides by the count of kept rows (an f32 scalar at o_kept, at
//! least 1). A kept target out of range makes the loss and its row's gradient NaN.

// Whether a cross-entropy row of target t takes part: all but C::IGNORE's under C::HAS_IGNORE.
template <typename C> __device__ __forceinline__ bool ce_kept(int t) { return !C::HAS_IGNORE || t != C::IGNORE; }

// The divisor of a cross-entropy's mean: the count of kept rows at o_kept, or C::ROWS.
template <typename C> __device__ __forceinline__ double ce_divisor(char* arena, u64 o_kept) {
    return C::HAS_IGNORE ? (double)tensor_at<float>(arena, o_kept)[0] : (double)C::ROWS;
}

// Phase 1 of both losses: out[0] = sum of the C::PARTS partials / divisor (0 when it is 0).
template <typename C> __device__ __forceinline__ void loss_finish(char* arena, u64 o_out, const double* part, double divisor) {
    const double total = sum_partials(part, C::PARTS);
    if (threadIdx.x == 0) tensor_at<float>(arena, o_out)[0] = divisor == 0.0 ? 0.0f : (float)(total / divisor);
}

// out[0] = the sum over kept rows of logsumexp(logits[row]) - logits[row, target[row]], over
// the divisor; block b of phase 0 takes rows b, b + PARTS, ... in order.
template <typename T, typename C>
__device__ void cross_entropy_kernel(char* arena, u64 o_logits, u64 o_t, u64 o_kept, u64 o_out, u64 o_ws, u64 phase) {
    double* part = tensor_at<double>(arena, o_ws);
    if (phase != 0) return loss_finish<C>(arena, o_out, part, ce_divisor<C>(arena, o_kept));
    const T* x = tensor_at<T>(arena, o_logits);
    const int* tg = tensor_at<int>(arena, o_t);
    double total = 0.0;
    for (u64 r = blockIdx.x; r < C::ROWS; r += gridDim.x) {
        const int t = tg[r];
        if (!ce_kept<C>(t)) continue;  // the same row for the whole block
        const u64 base = r * C::CL;
        const float2 lse = block_logsumexp(x, base, C::CL, 1);
        const bool ok = t >= 0 && (u64)t < C::CL;
        total += (double)((lse.x + lse.y) - (ok ? ld(x, base + (u64)t) : MEMC_NAN));
    }
    if (threadIdx.x == 0) part[blockIdx.x] = total;
}
// Without an ignored id: no count to read.
template <typename T, typename C>
__device__ void cross_entropy_kernel(char* arena, u64 o_logits, u64 o_t, u64 o_out, u64 o_ws, u64 phase) {
    cross_entropy_kernel<T, C>(arena, o_logits, o_t, 0, o_out, o_ws, phase);
}

// dlogits = (softmax(logits) - onehot(target)) * dloss / divisor, 0 on ignored rows; one
// block per row.
template <typename T, typename C>
__device__ void cross_entropy_backward_kernel(char* arena, u64 o_logits, u64 o_t, u64 o_dl, u64 o_kept, u64 o_dx) {
    const T* x = tensor_at<T>(arena, o_logits);
    const int* tg = tensor_at<int>(arena, o_t);
    const float dl = ld(tensor_at<typename C::TL>(arena, o_dl), 0);
    T* dx = tensor_at<T>(arena, o_dx);
    const double divisor = ce_divisor<C>(arena, o_kept);
    const float scale = dl / (float)(divisor == 0.0 ? 1.0 : divisor);
    for (u64 r = blockIdx.x; r < C::ROWS; r += gridDim.x) {
        const u64 base = r * C::CL;
        const int t = tg[r];
        if (!ce_kept<C>(t)) {  // the same row for the whole block
            for (u64 c = threadIdx.x; c < C::CL; c += blockDim.x) st(dx, base + c, 0.0f);
            continue;
        }
        const float2 lse = block_logsumexp(x, base, C::CL, 1);
        const float m = lse.x, l = lse.y;
        const bool ok = t >= 0 && (u64)t < C::CL;
        for (u64 c = threadIdx.x; c < C::CL; c += blockDim.x) {
            float p = expf(ld(x, base + c) - m - l);
            if (ok && c == (u64)t) p -= 1.0f;
            st(dx, base + c, ok ? p * scale : MEMC_NAN);
        }
    }
}
// Without an ignored id: no count to read.
template <typename T, typename C>
__device__ void cross_entropy_backward_kernel(char* arena, u64 o_logits, u64 o_t, u64 o_dl, u64 o_dx) {
    cross_entropy_backward_kernel<T, C>(arena, o_logits, o_t, o_dl, 0, o_dx);
}

// out[0] = the number of the C::ROWS targets that are kept, at least 1, as f32: block b of
// phase 0 counts rows [b * CHUNK, (b + 1) * CHUNK) (integers in fp64: exact), phase 1 sums
// the counts.
template <typename I, typename C> __device__ void kept_count_kernel(char* arena, u64 o_t, u64 o_out, u64 o_ws, u64 phase) {
    double* part = tensor_at<double>(arena, o_ws);
    if (phase != 0) {
        const double total = sum_partials(part, C::PARTS);
        if (threadIdx.x == 0) tensor_at<float>(arena, o_out)[0] = (float)(total == 0.0 ? 1.0 : total);
        return;
    }
    const I* tg = tensor_at<I>(arena, o_t);
    const u64 lo = (u64)blockIdx.x * C::CHUNK, hi = lo + C::CHUNK < C::ROWS ? lo + C::CHUNK : C::ROWS;
    u64 kept = 0;
    for (u64 r = lo + threadIdx.x; r < hi; r += blockDim.x) kept += ce_kept<C>(tg[r]) ? 1 : 0;
    kept = block_reduce<MemcSum<u64>>(kept);
    if (threadIdx.x == 0) part[blockIdx.x] = (double)kept;
}

// out[0] = mean((a - b)^2); block b of phase 0 sums elements [b * CHUNK, (b + 1) * CHUNK).
template <typename T, typename C> __device__ void mse_kernel(char* arena, u64 o_a, u64 o_b, u64 o_out, u64 o_ws, u64 phase) {
    double* part = tensor_at<double>(arena, o_ws);
    if (phase != 0) return loss_finish<C>(arena, o_out, part, (double)C::N);
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
