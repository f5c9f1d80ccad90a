//! Optimizer updates in place (torch AdamW on fp32 or block-wise 8-bit moments, SGD with
//! momentum; bf16 parameters optionally rounded stochastically), the global-norm clip
//! coefficient, and dynamic loss scaling (the fused overflow check and the scale update).
//! `step` is the 1-based step counter passed at launch, `stream` the micro-step's dropout
//! stream (0 unless stochastic rounding draws from it); the optional multiplier input scales
//! the gradient, and a multiplier of 0 (an overflowed loss-scaled step) skips the update.

// One AdamW element, as the CPU's `AdamWStep::apply` operation for operation (round-to-nearest
// intrinsics, never fused): g *= scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr wd p; p -= lr (m / bc1) / (sqrt(v / bc2) + eps).
template <typename C>
__device__ __forceinline__ void adamw_element(float& p, float g, float& m, float& v, float bc1, float bc2, float scale) {
    g = __fmul_rn(g, scale);
    m = __fadd_rn(__fmul_rn(C::B1, m), __fmul_rn(1.0f - C::B1, g));
    v = __fadd_rn(__fmul_rn(C::B2, v), __fmul_rn(__fmul_rn(1.0f - C::B2, g), g));
    p = __fsub_rn(p, __fmul_rn(__fmul_rn(C::LR, C::WD), p));
    p = __fsub_rn(p, __fdiv_rn(__fmul_rn(C::LR, __fdiv_rn(m, bc1)), __fadd_rn(__fsqrt_rn(__fdiv_rn(v, bc2)), C::EPS)));
}

// The bias correction 1 - beta^t of step t (capped at 2^31 - 1), in f64 as the CPU takes it.
__device__ __forceinline__ float adamw_bias_correction(float beta, u64 step) {
    const double t = (double)(step > 0x7fffffffull ? 0x7fffffffull : step);
    return (float)(1.0 - pow((double)beta, t));
}

// The value an update stores for element i holding x: x itself, or with C::SR x rounded to a
// bf16 neighbour stochastically (up in magnitude when the low 16 bits plus 16 random bits
// carry), the bits keyed by the micro-step's stream, C::SR_KEY and i, as the CPU's `Store`.
template <typename C> __device__ __forceinline__ float update_store_value(float x, u64 i, u64 stream) {
    if (!C::SR || !isfinite(x)) return x;
    const unsigned r = memc_bits(stream, C::SR_KEY, i) & 0xffffu;
    return __int_as_float((int)(((unsigned)__float_as_int(x) + r) & 0xffff0000u));
}

// One AdamW step on fp32 moments (or the parameter's type TS); the multiplier at o_clip (when
// HAS_CLIP) scales the gradient and 0 skips the step.
template <typename T, typename TG, typename TS, typename C>
__device__ void adamw_kernel(char* arena, u64 o_p, u64 o_g, u64 o_m, u64 o_v, u64 o_clip, u64 step, u64 stream) {
    T* p = tensor_at<T>(arena, o_p);
    const TG* g = tensor_at<TG>(arena, o_g);
    TS* m = tensor_at<TS>(arena, o_m);
    TS* v = tensor_at<TS>(arena, o_v);
    const float scale = C::HAS_CLIP ? ld(tensor_at<float>(arena, o_clip), 0) : 1.0f;
    if (scale == 0.0f) return;
    const float bc1 = adamw_bias_correction(C::B1, step), bc2 = adamw_bias_correction(C::B2, step);
    MEMC_GRID_LOOP(i, C::N) {
        float pi = ld(p, i), mi = ld(m, i), vi = ld(v, i);
        adamw_element<C>(pi, ld(g, i), mi, vi, bc1, bc2, scale);
        st(m, i, mi);
        st(v, i, vi);
        st(p, i, update_store_value<C>(pi, i, stream));
    }
}

// The AdamW steps of C::TENSORS parameters in one launch, each element exactly as
// adamw_kernel steps it. The table at the workspace's start has four rows a parameter (its
// value, gradient and two moments; 3 u64s a row: byte offset, first element counted over
// the rows, type code), so parameter k's elements start at element (row 4k's first) / 4 of
// the C::TOTAL; a binary search finds the parameter of each element.
template <typename T, typename TG, typename TS, typename C>
__device__ void adamw_group_kernel(char* arena, u64 o_ws, u64 o_clip, u64 step) {
    const u64* tab = tensor_at<u64>(arena, o_ws);
    const float scale = C::HAS_CLIP ? ld(tensor_at<float>(arena, o_clip), 0) : 1.0f;
    if (scale == 0.0f) return;
    const float bc1 = adamw_bias_correction(C::B1, step), bc2 = adamw_bias_correction(C::B2, step);
    MEMC_GRID_LOOP(e, C::TOTAL) {
        u64 lo = 0, hi = C::TENSORS;
        while (hi - lo > 1) {
            const u64 mid = (lo + hi) / 2;
            if (tab[12 * mid + 1] / 4 <= e) lo = mid; else hi = mid;
        }
        const u64* row = tab + 12 * lo;
        const u64 i = e - row[1] / 4;
        T* p = tensor_at<T>(arena, row[0]);
        const TG* g = tensor_at<TG>(arena, row[3]);
        TS* m = tensor_at<TS>(arena, row[6]);
        TS* v = tensor_at<TS>(arena, row[9]);
        float pi = ld(p, i), mi = ld(m, i), vi = ld(v, i);
        adamw_element<C>(pi, ld(g, i), mi, vi, bc1, bc2, scale);
        st(m, i, mi);
        st(v, i, vi);
        st(p, i, update_store_value<C>(pi, i, 0ull));
    }
}

// The code whose value in the ascending 256-entry `map` is nearest to x, the lower on a tie:
// the CPU's `quantize::nearest`, step for step.
__device__ __forceinline__ unsigned char memc_nearest_code(const float* map, float x) {
    int lo = 0;
    for (int s = 128; s > 0; s >>= 1)
        if (map[lo + s - 1] < x) lo += s;
    if (lo > 0 && __fsub_rn(x, map[lo - 1]) <= __fsub_rn(map[lo], x)) lo -= 1;
    return (unsigned char)lo;
}

// x / absmax, or 0 for an all-zero block.
__device__ __forceinline__ float memc_normalize(float x, float absmax) {
    return absmax > 0.0f ? __fdiv_rn(x, absmax) : 0.0f;
}

// One AdamW step on block-wise 8-bit moments (the CPU's `adamw8_update`): one block of 256
// threads per quantization block of C::BLOCK = 256 * C::PER elements (grid-stride over the
// C::BLOCKS blocks). Each thread dequantizes its C::PER elements (code value times the
// block's absmax), updates them in f32, then the block's new absmax is the block maximum of
// |moment| (max is exact, so the tree's order does not matter) and each code the nearest to
// moment / absmax. m codes use the signed map, v codes the unsigned one (C::qmap_*).
template <typename T, typename TG, typename C>
__device__ void adamw8_kernel(char* arena, u64 o_p, u64 o_g, u64 o_mq, u64 o_vq, u64 o_ma, u64 o_va, u64 o_clip,
                              u64 step, u64 stream) {
    __shared__ float qs[256], qu[256];
    for (unsigned k = threadIdx.x; k < 256; k += blockDim.x) {
        qs[k] = C::qmap_signed(k);
        qu[k] = C::qmap_unsigned(k);
    }
    __syncthreads();
    T* p = tensor_at<T>(arena, o_p);
    const TG* g = tensor_at<TG>(arena, o_g);
    unsigned char* mq = tensor_at<unsigned char>(arena, o_mq);
    unsigned char* vq = tensor_at<unsigned char>(arena, o_vq);
    float* ma = tensor_at<float>(arena, o_ma);
    float* va = tensor_at<float>(arena, o_va);
    const float scale = C::HAS_CLIP ? ld(tensor_at<float>(arena, o_clip), 0) : 1.0f;
    if (scale == 0.0f) return;
    const float bc1 = adamw_bias_correction(C::B1, step), bc2 = adamw_bias_correction(C::B2, step);
    for (u64 b = blockIdx.x; b < C::BLOCKS; b += gridDim.x) {
        const float am = ma[b], av = va[b];
        float mk[C::PER], vk[C::PER];
        float max_m = 0.0f, max_v = 0.0f;
#pragma unroll
        for (int k = 0; k < C::PER; ++k) {
            const u64 e = b * C::BLOCK + (u64)k * blockDim.x + threadIdx.x;
            if (e >= C::N) continue;
            float pi = ld(p, e);
            mk[k] = __fmul_rn(qs[mq[e]], am);
            vk[k] = __fmul_rn(qu[vq[e]], av);
            adamw_element<C>(pi, ld(g, e), mk[k], vk[k], bc1, bc2, scale);
            st(p, e, update_store_value<C>(pi, e, stream));
            max_m = fmaxf(max_m, fabsf(mk[k]));
            max_v = fmaxf(max_v, fabsf(vk[k]));
        }
        max_m = block_max(max_m);
        max_v = block_max(max_v);
#pragma unroll
        for (int k = 0; k < C::PER; ++k) {
            const u64 e = b * C::BLOCK + (u64)k * blockDim.x + threadIdx.x;
            if (e >= C::N) continue;
            mq[e] = memc_nearest_code(qs, memc_normalize(mk[k], max_m));
            vq[e] = memc_nearest_code(qu, memc_normalize(vk[k], max_v));
        }
        if (threadIdx.x == 0) {
            ma[b] = max_m;
            va[b] = max_v;
        }
    }
}

// One SGD step: g' = g multiplier + wd p; buf = (t <= 1 or momentum == 0) ? g' : momentum buf + g';
// p -= lr buf.
template <typename T, typename TG, typename TS, typename C>
__device__ void sgd_kernel(char* arena, u64 o_p, u64 o_g, u64 o_b, u64 o_clip, u64 step, u64 stream) {
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
        st(p, i, update_store_value<C>(pi, i, stream));
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
