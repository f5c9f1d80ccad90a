//! Layer, RMS, batch (training statistics) and group normalization: forward and the input
//! and weight backwards (the bias backward is a sum_to reduction). One block per statistics
//! group; statistics in fp32 with a two-pass (mean, then centred variance) scheme.
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

// (mean, rstd) of group g; mean is 0 for rms. Every thread of the block must call it.
template <typename T, typename C> __device__ __forceinline__ float2 norm_stats(const T* x, u64 g) {
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
    const float var = block_sum(v) / (float)C::GSIZE;
    return make_float2(mean, rsqrtf(var + C::EPS));
}

// out = normalize(x) * w + b (C::HAS_BIAS; o_b is ignored otherwise).
template <typename T, typename TW, typename C>
__device__ void norm_kernel(char* arena, u64 o_x, u64 o_w, u64 o_b, u64 o_out) {
    const T* x = tensor_at<T>(arena, o_x);
    const TW* w = tensor_at<TW>(arena, o_w);
    const TW* b = tensor_at<TW>(arena, o_b);
    T* out = tensor_at<T>(arena, o_out);
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

// dx = rstd * (gr - mean(gr) - xhat * mean(gr * xhat)), gr = dy * w (no mean(gr) for rms).
template <typename T, typename TW, typename TD, typename C>
__device__ void norm_backward_input_kernel(char* arena, u64 o_x, u64 o_w, u64 o_dy, u64 o_dx) {
    const T* x = tensor_at<T>(arena, o_x);
    const TW* w = tensor_at<TW>(arena, o_w);
    const TD* dy = tensor_at<TD>(arena, o_dy);
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
            st(dx, i, ms.y * (gr - mg - xh * mgx));
        }
    }
}

// dw[c] = sum over the positions of channel c of dy * xhat.
// Layer/Rms: block b owns channels b*blockDim + threadIdx.x and walks all rows (each row's
// statistics computed by the whole block). Batch/Group: one block per channel.
template <typename T, typename TD, typename TW, typename C>
__device__ void norm_backward_weight_kernel(char* arena, u64 o_x, u64 o_dy, u64 o_dw) {
    const T* x = tensor_at<T>(arena, o_x);
    const TD* dy = tensor_at<TD>(arena, o_dy);
    TW* dw = tensor_at<TW>(arena, o_dw);
    if (C::KIND <= 1) {
        const u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x;
        float acc = 0.0f;
        for (u64 g = 0; g < C::GROUPS; ++g) {
            const float2 ms = norm_stats<T, C>(x, g);
            if (c < C::CH) {
                const u64 i = g * C::GSIZE + c;
                acc += ld(dy, i) * (ld(x, i) - ms.x) * ms.y;
            }
        }
        if (c < C::CH) st(dw, c, acc);
        return;
    }
    for (u64 c = blockIdx.x; c < C::CH; c += gridDim.x) {
        float acc = 0.0f;
        if (C::KIND == 2) {
            const float2 ms = norm_stats<T, C>(x, c);
            for (u64 e = threadIdx.x; e < C::GSIZE; e += blockDim.x) {
                const u64 i = norm_off<C>(c, e);
                acc += ld(dy, i) * (ld(x, i) - ms.x) * ms.y;
            }
        } else {
            for (u64 n = 0; n < C::NB; ++n) {
                const u64 g = n * C::NG + c / C::CPG;
                const float2 ms = norm_stats<T, C>(x, g);
                for (u64 s = threadIdx.x; s < C::S; s += blockDim.x) {
                    const u64 i = norm_off<C>(g, (c % C::CPG) * C::S + s);
                    acc += ld(dy, i) * (ld(x, i) - ms.x) * ms.y;
                }
            }
        }
        acc = block_sum(acc);
        if (threadIdx.x == 0) st(dw, c, acc);
    }
}
