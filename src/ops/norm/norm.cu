//! Layer, RMS, batch (training statistics) and group normalization: forward and the input,
//! weight and bias backwards, and batch norm's running statistics. The forward and the input gradient take one block per
//! statistics group; the weight and bias gradients are two-stage reductions over positions.
//! Statistics in fp32 with a two-pass (mean, then centred variance) scheme.
//!
//! C::KIND: 0 layer, 1 rms, 2 batch, 3 group. A statistics group `g` has GSIZE elements;
//! element `e` of it lives at norm_off<C>(g, e) and uses channel norm_ch<C>(g, e).
//! Layer/Rms: x = [GROUPS, CH]. Batch/Group: x = [NB, CH, S]; Group has NG groups of CPG
//! channels per sample.

template <typename C> __device__ __forceinline__ u64 norm_off(u64 g, u64 e) {
    if (C::KIND == 2) return (e / C::S) * C::CH * C::S + g * C::S + e % C::S;
    return g * C::GSIZE + e;
}
template <typename C> __device__ __forceinline__ u64 norm_ch(u64 g, u64 e) {
    if (C::KIND == 2) return g;
    if (C::KIND == 3) return (g % C::NG) * C::CPG + e / C::S;
    return e;
}

// (mean, biased variance) of group g; mean is 0 for rms. Every thread of the block must
// call it.
template <typename T, typename C> __device__ __forceinline__ float2 norm_moments(const T* x, u64 g) {
    float mean = 0.0f;
    if (C::KIND != 1) {
        float s = 0.0f;
        for (u64 e = threadIdx.x; e < C::GSIZE; e += blockDim.x) s += ld(x, norm_off<C>(g, e));
        mean = block_sum(s) / (float)C::GSIZE;
    }
    float v = 0.0f;
    for (u64 e = threadIdx.x; e < C::GSIZE; e += blockDim.x) {
        const float d = ld(x, norm_off<C>(g, e)) - mean;
        v += d * d;
    }
    return make_float2(mean, block_sum(v) / (float)C::GSIZE);
}

// (mean, rstd) of group g; mean is 0 for rms. Every thread of the block must call it.
template <typename T, typename C> __device__ __forceinline__ float2 norm_stats(const T* x, u64 g) {
    const float2 mv = norm_moments<T, C>(x, g);
    return make_float2(mv.x, rsqrtf(mv.y + C::EPS));
}

// Batch norm's running statistics (fp32 [CH]) moved towards x's per-channel mean and unbiased
// variance, one block per channel (C::KIND 2): r = (1 - MOMENTUM) r + MOMENTUM batch.
template <typename T, typename C>
__device__ void batch_norm_stats_kernel(char* arena, u64 o_mean, u64 o_var, u64 o_x) {
    float* rm = tensor_at<float>(arena, o_mean);
    float* rv = tensor_at<float>(arena, o_var);
    const T* x = tensor_at<T>(arena, o_x);
    for (u64 g = blockIdx.x; g < C::GROUPS; g += gridDim.x) {
        const float2 mv = norm_moments<T, C>(x, g);
        if (threadIdx.x == 0) {
            const float unbiased = mv.y * ((float)C::GSIZE / (float)(C::GSIZE - 1));
            rm[g] = (1.0f - C::MOMENTUM) * rm[g] + C::MOMENTUM * mv.x;
            rv[g] = (1.0f - C::MOMENTUM) * rv[g] + C::MOMENTUM * unbiased;
        }
    }
}

// out = normalize(x) * w + b (C::HAS_BIAS; o_b is ignored otherwise), stored as TO.
template <typename T, typename TW, typename TO, typename C>
__device__ void norm_kernel(char* arena, u64 o_x, u64 o_w, u64 o_b, u64 o_out) {
    const T* x = tensor_at<T>(arena, o_x);
    const TW* w = tensor_at<TW>(arena, o_w);
    const TW* b = tensor_at<TW>(arena, o_b);
    TO* out = tensor_at<TO>(arena, o_out);
    for (u64 g = blockIdx.x; g < C::GROUPS; g += gridDim.x) {
        const float2 ms = norm_stats<T, C>(x, g);
        for (u64 e = threadIdx.x; e < C::GSIZE; e += blockDim.x) {
            const u64 i = norm_off<C>(g, e), c = norm_ch<C>(g, e);
            float y = (ld(x, i) - ms.x) * ms.y * ld(w, c);
            if (C::HAS_BIAS) y += ld(b, c);
            st(out, i, y);
        }
    }
}

// dx = rstd * (gr - mean(gr) - xhat * mean(gr * xhat)), gr = dy * w (no mean(gr) for rms);
// with C::ACC, dx = g + that, added as a separate rounding (o_g is ignored otherwise).
template <typename T, typename TW, typename TD, typename TG, typename C>
__device__ void norm_backward_input_kernel(char* arena, u64 o_x, u64 o_w, u64 o_dy, u64 o_g, u64 o_dx) {
    const T* x = tensor_at<T>(arena, o_x);
    const TW* w = tensor_at<TW>(arena, o_w);
    const TD* dy = tensor_at<TD>(arena, o_dy);
    const TG* acc = tensor_at<TG>(arena, o_g);
    T* dx = tensor_at<T>(arena, o_dx);
    for (u64 g = blockIdx.x; g < C::GROUPS; g += gridDim.x) {
        const float2 ms = norm_stats<T, C>(x, g);
        float sg = 0.0f, sgx = 0.0f;
        for (u64 e = threadIdx.x; e < C::GSIZE; e += blockDim.x) {
            const u64 i = norm_off<C>(g, e);
            const float gr = ld(dy, i) * ld(w, norm_ch<C>(g, e));
            sg += gr;
            sgx += gr * (ld(x, i) - ms.x) * ms.y;
        }
        const float mg = C::KIND == 1 ? 0.0f : block_sum(sg) / (float)C::GSIZE;
        const float mgx = block_sum(sgx) / (float)C::GSIZE;
        for (u64 e = threadIdx.x; e < C::GSIZE; e += blockDim.x) {
            const u64 i = norm_off<C>(g, e);
            const float gr = ld(dy, i) * ld(w, norm_ch<C>(g, e));
            const float xh = (ld(x, i) - ms.x) * ms.y;
            const float d = ms.y * (gr - mg - xh * mgx);
            st(dx, i, C::ACC ? __fadd_rn(ld(acc, i), d) : d);
        }
    }
}

// ---- weight and bias gradients, two-stage over positions --------------------------------
// dw[c] = sum over the positions of channel c of dy * xhat; db[c] = sum of dy (C::BIAS: no x,
// no statistics). Phase 0: the block(s) of position chunk k write their partial sums to
// ws[k * CH + c]; phase 1: a thread per channel sums them over k = 0 .. C::CHUNKS - 1 in order
// (the batch weight gradient keeps four partials a chunk and merges them: see below).

// Layer/Rms phase 0: block k takes rows [k * RPB, (k + 1) * RPB); thread t owns channels
// t + j * blockDim.x (j < C::CPT), keeping the row's x in registers for its statistics.
template <typename T, typename TD, typename C> __device__ __forceinline__ void norm_rows_partial(const T* x, const TD* dy, float* part) {
    float acc[C::CPT];
#pragma unroll
    for (int j = 0; j < (int)C::CPT; ++j) acc[j] = 0.0f;
    const u64 r0 = (u64)blockIdx.x * C::RPB, r1 = r0 + C::RPB < C::GROUPS ? r0 + C::RPB : C::GROUPS;
    for (u64 r = r0; r < r1; ++r) {
        float xv[C::CPT];
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < (int)C::CPT; ++j) {
            const u64 c = threadIdx.x + (u64)j * blockDim.x;
            xv[j] = !C::BIAS && c < C::CH ? ld(x, r * C::CH + c) : 0.0f;
            s += xv[j];
        }
        float mean = 0.0f, rstd = 1.0f;
        if (!C::BIAS) {
            if (C::KIND != 1) mean = block_sum(s) / (float)C::CH;
            float v = 0.0f;
#pragma unroll
            for (int j = 0; j < (int)C::CPT; ++j) {
                const float d = xv[j] - mean;
                if (threadIdx.x + (u64)j * blockDim.x < C::CH) v += d * d;
            }
            rstd = rsqrtf(block_sum(v) / (float)C::CH + C::EPS);
        }
#pragma unroll
        for (int j = 0; j < (int)C::CPT; ++j) {
            const u64 c = threadIdx.x + (u64)j * blockDim.x;
            if (c < C::CH) {
                const float g = ld(dy, r * C::CH + c);
                acc[j] += C::BIAS ? g : g * (xv[j] - mean) * rstd;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < (int)C::CPT; ++j) {
        const u64 c = threadIdx.x + (u64)j * blockDim.x;
        if (c < C::CH) part[(u64)blockIdx.x * C::CH + c] = acc[j];
    }
}

// Group weight and batch/group bias phase 0: block (c, k) sums channel c over samples
// [k * NPB, (k + 1) * NPB) (group statistics are per sample).
template <typename T, typename TD, typename C> __device__ __forceinline__ void norm_channel_partial(const T* x, const TD* dy, float* part) {
    const u64 c = blockIdx.x, k = blockIdx.y;
    const u64 n0 = k * C::NPB, n1 = n0 + C::NPB < C::NB ? n0 + C::NPB : C::NB;
    float acc = 0.0f;
    for (u64 n = n0; n < n1; ++n) {
        float2 ms = make_float2(0.0f, 1.0f);
        if (!C::BIAS) ms = norm_stats<T, C>(x, n * C::NG + c / C::CPG);
        for (u64 s = threadIdx.x; s < C::S; s += blockDim.x) {
            const u64 i = (n * C::CH + c) * C::S + s;
            const float g = ld(dy, i);
            acc += C::BIAS ? g : g * (ld(x, i) - ms.x) * ms.y;
        }
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) part[k * C::CH + c] = acc;
}

// Elements of channel c in sample chunk k, and the offset of its e-th element.
template <typename C> __device__ __forceinline__ u64 batch_chunk_len(u64 k) {
    const u64 n0 = k * C::NPB, n1 = n0 + C::NPB < C::NB ? n0 + C::NPB : C::NB;
    return (n1 - n0) * C::S;
}
template <typename C> __device__ __forceinline__ u64 batch_chunk_at(u64 c, u64 k, u64 e) {
    return ((k * C::NPB + e / C::S) * C::CH + c) * C::S + e % C::S;
}

// Batch weight phase 0: the statistics span every sample, so block (c, k) keeps, for its
// chunk, the mean m, the centred sum of squares M2, the sum G of dy and the sum H of
// dy (x - m) at part[4 (k CH + c) ..]; phase 1 merges them (batch_weight_finish).
template <typename T, typename TD, typename C> __device__ __forceinline__ void batch_weight_partial(const T* x, const TD* dy, float* part) {
    const u64 c = blockIdx.x, k = blockIdx.y, len = batch_chunk_len<C>(k);
    float s = 0.0f;
    for (u64 e = threadIdx.x; e < len; e += blockDim.x) s += ld(x, batch_chunk_at<C>(c, k, e));
    const float m = len == 0 ? 0.0f : block_sum(s) / (float)len;
    float m2 = 0.0f, g = 0.0f, h = 0.0f;
    for (u64 e = threadIdx.x; e < len; e += blockDim.x) {
        const u64 i = batch_chunk_at<C>(c, k, e);
        const float d = ld(x, i) - m, gi = ld(dy, i);
        m2 += d * d;
        g += gi;
        h += gi * d;
    }
    m2 = block_sum(m2);
    g = block_sum(g);
    h = block_sum(h);
    if (threadIdx.x == 0) {
        float* p = part + 4 * (k * C::CH + c);
        p[0] = m;
        p[1] = m2;
        p[2] = g;
        p[3] = h;
    }
}

// Batch weight phase 1 for channel c, chunks in order (fp64): the mean mu = sum n_k m_k / N,
// the variance (sum M2_k + n_k (m_k - mu)^2) / N (the parallel-variance merge), and
// dw = rstd * sum (H_k + (m_k - mu) G_k) = rstd * sum dy (x - mu).
template <typename C> __device__ __forceinline__ float batch_weight_finish(const float* part, u64 c) {
    const double total = (double)C::GSIZE;
    double mu = 0.0;
    for (u64 k = 0; k < C::CHUNKS; ++k) mu += (double)batch_chunk_len<C>(k) * part[4 * (k * C::CH + c)];
    mu = total == 0.0 ? 0.0 : mu / total;
    double m2 = 0.0, dw = 0.0;
    for (u64 k = 0; k < C::CHUNKS; ++k) {
        const float* p = part + 4 * (k * C::CH + c);
        const double d = (double)p[0] - mu;
        m2 += (double)p[1] + (double)batch_chunk_len<C>(k) * d * d;
        dw += (double)p[3] + d * (double)p[2];
    }
    const float var = total == 0.0 ? 0.0f : (float)(m2 / total);
    return (float)dw * rsqrtf(var + C::EPS);
}

// The weight (bias: o_x is dy's offset too) gradient.
template <typename T, typename TD, typename TW, typename C>
__device__ void norm_backward_param_kernel(char* arena, u64 o_x, u64 o_dy, u64 o_dw, u64 o_ws, u64 phase) {
    float* part = tensor_at<float>(arena, o_ws);
    const bool batch_weight = C::KIND == 2 && !C::BIAS;
    if (phase != 0) {
        const u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x;
        if (c >= C::CH) return;
        float s = 0.0f;
        if (batch_weight) s = batch_weight_finish<C>(part, c);
        else for (u64 k = 0; k < C::CHUNKS; ++k) s += part[k * C::CH + c];
        st(tensor_at<TW>(arena, o_dw), c, s);
        return;
    }
    const T* x = tensor_at<T>(arena, o_x);
    const TD* dy = tensor_at<TD>(arena, o_dy);
    if (C::KIND <= 1) norm_rows_partial<T, TD, C>(x, dy, part);
    else if (batch_weight) batch_weight_partial<T, TD, C>(x, dy, part);
    else norm_channel_partial<T, TD, C>(x, dy, part);
}
