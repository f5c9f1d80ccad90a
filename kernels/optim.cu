//! Optimizer updates in place (torch AdamW, SGD with momentum) and the global-norm clip
//! coefficient. `step` is the 1-based step counter passed at launch; the optional clip input
//! scales the gradient.

// One AdamW step: g *= clip; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr wd p;
// p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
template <typename T, typename TG, typename TS, typename C>
__device__ void adamw_kernel(char* arena, u64 o_p, u64 o_g, u64 o_m, u64 o_v, u64 o_clip, u64 step) {
    T* p = tensor_at<T>(arena, o_p);
    const TG* g = tensor_at<TG>(arena, o_g);
    TS* m = tensor_at<TS>(arena, o_m);
    TS* v = tensor_at<TS>(arena, o_v);
    const float scale = C::HAS_CLIP ? ld(tensor_at<float>(arena, o_clip), 0) : 1.0f;
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

// One SGD step: g' = g clip + wd p; buf = (t <= 1 or momentum == 0) ? g' : momentum buf + g';
// p -= lr buf.
template <typename T, typename TG, typename TS, typename C>
__device__ void sgd_kernel(char* arena, u64 o_p, u64 o_g, u64 o_b, u64 o_clip, u64 step) {
    T* p = tensor_at<T>(arena, o_p);
    const TG* g = tensor_at<TG>(arena, o_g);
    TS* buf = tensor_at<TS>(arena, o_b);
    const float scale = C::HAS_CLIP ? ld(tensor_at<float>(arena, o_clip), 0) : 1.0f;
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

__device__ __forceinline__ double block_sum_f64(double v) {
    __shared__ double memc_red_d[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) memc_red_d[warp] = v;
    __syncthreads();
    v = lane < nw ? memc_red_d[lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Adds this thread's share of sum(x^2) over one gradient (fp64). Single-block kernel.
template <typename T, typename C> __device__ __forceinline__ void clip_accum(char* arena, u64 o_x, double& acc) {
    const T* x = tensor_at<T>(arena, o_x);
    for (u64 i = threadIdx.x; i < C::N; i += blockDim.x) {
        const double v = (double)ld(x, i);
        acc += v * v;
    }
}

// out[0] = min(1, MAX_NORM / (sqrt(sum of squares) + 1e-6)).
template <typename C> __device__ __forceinline__ void clip_finish(char* arena, u64 o_out, double acc) {
    const double total = block_sum_f64(acc);
    if (threadIdx.x == 0) {
        const double c = (double)C::MAX_NORM / (sqrt(total) + 1e-6);
        tensor_at<float>(arena, o_out)[0] = (float)(c < 1.0 ? c : 1.0);
    }
}
