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

// Adds this thread's share of sum(x^2) over one gradient (fp64). Single-block kernel.
template <typename T, typename C> __device__ __forceinline__ void clip_accum(char* arena, u64 o_x, double& acc) {
    const T* x = tensor_at<T>(arena, o_x);
    for (u64 i = threadIdx.x; i < C::N; i += blockDim.x) {
        const double v = (double)ld(x, i);
        acc += v * v;
    }
}

// out[0] = m min(1, MAX_NORM / (m sqrt(sum of squares) + 1e-6)), where m is the unscale
// multiplier when SCALED (its offset is o_mul) and 1 otherwise; m = 0 gives 0.
template <typename C> __device__ __forceinline__ void clip_finish(char* arena, u64 o_mul, u64 o_out, double acc) {
    const double total = block_reduce<MemcSum<double>>(acc);
    if (threadIdx.x == 0) {
        const double m = C::SCALED ? (double)tensor_at<float>(arena, o_mul)[0] : 1.0;
        const double c = (double)C::MAX_NORM / (m * sqrt(total) + 1e-6);
        tensor_at<float>(arena, o_out)[0] = m == 0.0 ? 0.0f : (float)(m * (c < 1.0 ? c : 1.0));
    }
}

// Counts this thread's non-finite elements of one gradient. Single-block kernel.
template <typename T, typename C> __device__ __forceinline__ void unscale_accum(char* arena, u64 o_x, double& bad) {
    const T* x = tensor_at<T>(arena, o_x);
    for (u64 i = threadIdx.x; i < C::N; i += blockDim.x) {
        if (!isfinite(ld(x, i))) bad += 1.0;
    }
}

// out[0] = 1 / scale when no gradient element was non-finite, else 0.
__device__ __forceinline__ void unscale_finish(char* arena, u64 o_scale, u64 o_out, double bad) {
    const double total = block_reduce<MemcSum<double>>(bad);
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
