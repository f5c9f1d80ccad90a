//! Optimizer updates in place (torch AdamW, SGD with momentum), the global-norm clip
//! coefficient, and dynamic loss scaling (the fused overflow check and the scale update).
//! `step` is the 1-based step counter passed at launch; the optional multiplier input scales
//! the gradient, and a multiplier of 0 (an overflowed loss-scaled step) skips the update.

// One AdamW step: g *= multiplier; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr wd p;
// p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
template <typename T, typename TG, typename TS, typename C>
__device__ void adamw_kernel(char* arena, u64 o_p, u64 o_g, u64 o_m, u64 o_v, u64 o_clip, u64 step) {
    T* p = tensor_at<T>(arena, o_p);
    const TG* g = tensor_at<TG>(arena, o_g);
    TS* m = tensor_at<TS>(arena, o_m);
    TS* v = tensor_at<TS>(arena, o_v);
    const float scale = C::HAS_CLIP ? ld(tensor_at<float>(arena, o_clip), 0) : 1.0f;
    if (scale == 0.0f) return;
    const double t = (double)(step > 0x7fffffffull ? 0x7fffffffull : step);
    const float bc1 = (float)(1.0 - pow((double)C::B1, t));
    const float bc2 = (float)(1.0 - pow((double)C::B2, t));
    MEMC_GRID_LOOP(i, C::N) {
        const float gi = ld(g, i) * scale;
        const float mi = C::B1 * ld(m, i) + (1.0f - C::B1) * gi;
        const float vi = C::B2 * ld(v, i) + (1.0f - C::B2) * gi * gi;
        float pi = ld(p, i);
        pi -= C::LR * C::WD * pi;
        pi -= C::LR * (mi / bc1) / (sqrtf(vi / bc2) + C::EPS);
        st(m, i, mi);
        st(v, i, vi);
        st(p, i, pi);
    }
}

// One SGD step: g' = g multiplier + wd p; buf = (t <= 1 or momentum == 0) ? g' : momentum buf + g';
// p -= lr buf.
template <typename T, typename TG, typename TS, typename C>
__device__ void sgd_kernel(char* arena, u64 o_p, u64 o_g, u64 o_b, u64 o_clip, u64 step) {
    T* p = tensor_at<T>(arena, o_p);
    const TG* g = tensor_at<TG>(arena, o_g);
    TS* buf = tensor_at<TS>(arena, o_b);
    const float scale = C::HAS_CLIP ? ld(tensor_at<float>(arena, o_clip), 0) : 1.0f;
    if (scale == 0.0f) return;
    const bool fresh = step <= 1 || C::MOMENTUM == 0.0f;
    MEMC_GRID_LOOP(i, C::N) {
        float pi = ld(p, i);
        const float gi = ld(g, i) * scale + C::WD * pi;
        const float bi = fresh ? gi : C::MOMENTUM * ld(buf, i) + gi;
        pi -= C::LR * bi;
        st(buf, i, bi);
        st(p, i, pi);
    }
}

// ---- reductions over every gradient: the tensors come as a table at the workspace's start
// (3 u64 a tensor: arena offset, first flat index, type code; TensorTable in codegen), the
// flat index space of all of them split into C::PARTS chunks of C::CHUNK elements. Phase 0:
// block b reduces chunk b into the fp64 partial after the table; phase 1: one block sums the
// partials in a fixed order.

// Element i of table tensor e as fp32 (type codes 0 f32, 1 f16, 2 bf16).
__device__ __forceinline__ float table_ld(char* arena, const u64* e, u64 i) {
    if (e[2] == 1) return ld(tensor_at<__half>(arena, e[0]), i);
    if (e[2] == 2) return ld(tensor_at<__nv_bfloat16>(arena, e[0]), i);
    return ld(tensor_at<float>(arena, e[0]), i);
}

// Phase 0: partial[blockIdx.x] = sum of R::term(v) over the block's chunk, each thread taking
// every blockDim.x-th element of each tensor's part of the chunk, tensors in table order.
template <typename R, typename C> __device__ __forceinline__ void table_partial(char* arena, u64 o_ws) {
    const u64* tab = tensor_at<u64>(arena, o_ws);
    const u64 lo = (u64)blockIdx.x * C::CHUNK, hi = lo + C::CHUNK < C::TOTAL ? lo + C::CHUNK : C::TOTAL;
    // The last tensor starting at or before lo (binary search over the first indices).
    u64 a = 0, b = C::TENSORS;
    while (b - a > 1) {
        const u64 mid = (a + b) / 2;
        if (tab[3 * mid + 1] <= lo) a = mid; else b = mid;
    }
    double acc = 0.0;
    for (u64 t = a; t < C::TENSORS && tab[3 * t + 1] < hi; ++t) {
        const u64 first = tab[3 * t + 1], end = t + 1 < C::TENSORS ? tab[3 * t + 4] : C::TOTAL;
        const u64 from = lo > first ? lo : first, to = hi < end ? hi : end;
        for (u64 i = from + threadIdx.x; i < to; i += blockDim.x) acc += R::term(table_ld(arena, tab + 3 * t, i - first));
    }
    acc = block_reduce<MemcSum<double>>(acc);
    if (threadIdx.x == 0) tensor_at<double>(arena, o_ws + C::TABLE_BYTES)[blockIdx.x] = acc;
}

// Phase 1: the fixed-order sum of the C::PARTS partials (every thread of the block gets it).
template <typename C> __device__ __forceinline__ double table_total(char* arena, u64 o_ws) {
    return sum_partials(tensor_at<double>(arena, o_ws + C::TABLE_BYTES), C::PARTS);
}

// A gradient element's share of the squared norm.
struct ClipTerm {
    static __device__ __forceinline__ double term(float v) { return (double)v * (double)v; }
};

// Whether an element is non-finite, as 1 or 0.
struct OverflowTerm {
    static __device__ __forceinline__ double term(float v) { return isfinite(v) ? 0.0 : 1.0; }
};

// out[0] = m min(1, MAX_NORM / (m sqrt(sum of squares) + 1e-6)), where m is the unscale
// multiplier when SCALED (its offset is o_mul) and 1 otherwise; m = 0 gives 0.
template <typename C> __device__ void clip_coefficient_kernel(char* arena, u64 o_mul, u64 o_out, u64 o_ws, u64 phase) {
    if (phase == 0) return table_partial<ClipTerm, C>(arena, o_ws);
    const double total = table_total<C>(arena, o_ws);
    if (threadIdx.x == 0) {
        const double m = C::SCALED ? (double)tensor_at<float>(arena, o_mul)[0] : 1.0;
        const double c = (double)C::MAX_NORM / (m * sqrt(total) + 1e-6);
        tensor_at<float>(arena, o_out)[0] = m == 0.0 ? 0.0f : (float)(m * (c < 1.0 ? c : 1.0));
    }
}

// out[0] = 1 / scale when no gradient element is non-finite, else 0.
template <typename C> __device__ void unscale_grads_kernel(char* arena, u64 o_scale, u64 o_out, u64 o_ws, u64 phase) {
    if (phase == 0) return table_partial<OverflowTerm, C>(arena, o_ws);
    const double total = table_total<C>(arena, o_ws);
    if (threadIdx.x == 0) {
        const float s = tensor_at<float>(arena, o_scale)[0];
        tensor_at<float>(arena, o_out)[0] = total > 0.0 ? 0.0f : 1.0f / s;
    }
}

// One micro-step of gradient accumulation: acc = g SCALE on micro-step 0, acc += g SCALE
// after (SCALE = 1 / micro-steps per step).
template <typename TG, typename C> __device__ void accumulate_grad_kernel(char* arena, u64 o_acc, u64 o_g, u64 micro) {
    float* acc = tensor_at<float>(arena, o_acc);
    const TG* g = tensor_at<TG>(arena, o_g);
    MEMC_GRID_LOOP(i, C::N) {
        const float add = ld(g, i) * C::SCALE;
        acc[i] = micro == 0 ? add : acc[i] + add;
    }
}

// torch.amp.GradScaler.update: halve the scale on overflow (multiplier 0) and restart the
// count; else count the clean step and double the scale after GROWTH clean steps.
template <typename C> __device__ void loss_scale_update_kernel(char* arena, u64 o_scale, u64 o_clean, u64 o_mul) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    float* scale = tensor_at<float>(arena, o_scale);
    float* clean = tensor_at<float>(arena, o_clean);
    if (tensor_at<float>(arena, o_mul)[0] == 0.0f) {
        scale[0] *= 0.5f;
        clean[0] = 0.0f;
    } else if (clean[0] + 1.0f >= (float)C::GROWTH) {
        scale[0] *= 2.0f;
        clean[0] = 0.0f;
    } else {
        clean[0] += 1.0f;
    }
}
