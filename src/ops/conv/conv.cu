//! 2-D convolution (NCHW, cross-correlation, zero padding, groups, dilation) and its input
//! and weight gradients, all as implicit GEMMs on the tiled core of matmul.cu (one GEMM batch
//! per group; no im2col buffer). Geometry: x [NB, CI, H, W], w [CO, CIG, KH, KW],
//! y [NB, CO, HO, WO], CIG = CI / G, COG = CO / G.

// Input coordinate read by output coordinate o at tap t, or -1 when it falls in the padding.
__device__ __forceinline__ long long conv_in(long long o, long long t, long long s, long long p, long long d, long long n) {
    const long long v = o * s - p + t * d;
    return (v >= 0 && v < n) ? v : -1;
}

// y: M = COG (out channel), N = NB*HO*WO, K = CIG*KH*KW.
template <typename T, typename C> struct ConvFwdIO {
    const T* X;
    const T* Wt;
    T* Y;
    __device__ float a(u64 g, u64 m, u64 k) const { return ld(Wt, (g * C::COG + m) * (C::CIG * C::KH * C::KW) + k); }
    __device__ float b(u64 g, u64 k, u64 n) const {
        const u64 kw = k % C::KW, kh = (k / C::KW) % C::KH, ci = k / (C::KW * C::KH);
        const u64 ow = n % C::WO, oh = (n / C::WO) % C::HO, nb = n / (C::WO * C::HO);
        const long long h = conv_in(oh, kh, C::SH, C::PH, C::DH, C::H), w = conv_in(ow, kw, C::SW, C::PW, C::DW, C::W);
        if (h < 0 || w < 0) return 0.0f;
        return ld(X, ((nb * C::CI + g * C::CIG + ci) * C::H + (u64)h) * C::W + (u64)w);
    }
    __device__ void store(u64 g, u64 m, u64 n, float v) const {
        const u64 sp = n % (C::HO * C::WO), nb = n / (C::HO * C::WO);
        st(Y, (nb * C::CO + g * C::COG + m) * (C::HO * C::WO) + sp, v);
    }
};

// dx: M = CIG, N = NB*H*W, K = COG*KH*KW; dy[nb, co, oh, ow] contributes when
// oh*SH = h + PH - kh*DH exactly and 0 <= oh < HO (likewise for w).
template <typename T, typename TW, typename C> struct ConvBwdInputIO {
    const T* DY;
    const TW* Wt;
    T* DX;
    __device__ float a(u64 g, u64 m, u64 k) const {
        const u64 kw = k % C::KW, kh = (k / C::KW) % C::KH, co = k / (C::KW * C::KH);
        return ld(Wt, (((g * C::COG + co) * C::CIG + m) * C::KH + kh) * C::KW + kw);
    }
    __device__ float b(u64 g, u64 k, u64 n) const {
        const long long kw = k % C::KW, kh = (k / C::KW) % C::KH, co = k / (C::KW * C::KH);
        const long long w = n % C::W, h = (n / C::W) % C::H, nb = n / (C::W * C::H);
        const long long th = h + (long long)C::PH - kh * (long long)C::DH, tw = w + (long long)C::PW - kw * (long long)C::DW;
        if (th < 0 || tw < 0 || th % (long long)C::SH != 0 || tw % (long long)C::SW != 0) return 0.0f;
        const long long oh = th / (long long)C::SH, ow = tw / (long long)C::SW;
        if (oh >= (long long)C::HO || ow >= (long long)C::WO) return 0.0f;
        return ld(DY, (((u64)nb * C::CO + g * C::COG + (u64)co) * C::HO + (u64)oh) * C::WO + (u64)ow);
    }
    __device__ void store(u64 g, u64 m, u64 n, float v) const {
        const u64 sp = n % (C::H * C::W), nb = n / (C::H * C::W);
        st(DX, (nb * C::CI + g * C::CIG + m) * (C::H * C::W) + sp, v);
    }
};

// dw: M = COG, N = CIG*KH*KW, K = NB*HO*WO.
template <typename T, typename TD, typename C> struct ConvBwdWeightIO {
    const T* X;
    const TD* DY;
    T* DW;
    __device__ float a(u64 g, u64 m, u64 k) const {
        const u64 sp = k % (C::HO * C::WO), nb = k / (C::HO * C::WO);
        return ld(DY, (nb * C::CO + g * C::COG + m) * (C::HO * C::WO) + sp);
    }
    __device__ float b(u64 g, u64 k, u64 n) const {
        const u64 kw = n % C::KW, kh = (n / C::KW) % C::KH, ci = n / (C::KW * C::KH);
        const u64 ow = k % C::WO, oh = (k / C::WO) % C::HO, nb = k / (C::WO * C::HO);
        const long long h = conv_in(oh, kh, C::SH, C::PH, C::DH, C::H), w = conv_in(ow, kw, C::SW, C::PW, C::DW, C::W);
        if (h < 0 || w < 0) return 0.0f;
        return ld(X, ((nb * C::CI + g * C::CIG + ci) * C::H + (u64)h) * C::W + (u64)w);
    }
    __device__ void store(u64 g, u64 m, u64 n, float v) const { st(DW, (g * C::COG + m) * (C::CIG * C::KH * C::KW) + n, v); }
};

template <typename T, typename C> __device__ void conv2d_kernel(char* arena, u64 o_x, u64 o_w, u64 o_y) {
    ConvFwdIO<T, C> io{tensor_at<T>(arena, o_x), tensor_at<T>(arena, o_w), tensor_at<T>(arena, o_y)};
    gemm_tiled(io, C::COG, C::NB * C::HO * C::WO, C::CIG * C::KH * C::KW);
}
template <typename T, typename TW, typename C> __device__ void conv2d_backward_input_kernel(char* arena, u64 o_dy, u64 o_w, u64 o_dx) {
    ConvBwdInputIO<T, TW, C> io{tensor_at<T>(arena, o_dy), tensor_at<TW>(arena, o_w), tensor_at<T>(arena, o_dx)};
    gemm_tiled(io, C::CIG, C::NB * C::H * C::W, C::COG * C::KH * C::KW);
}
template <typename T, typename TD, typename C> __device__ void conv2d_backward_weight_kernel(char* arena, u64 o_x, u64 o_dy, u64 o_dw) {
    ConvBwdWeightIO<T, TD, C> io{tensor_at<T>(arena, o_x), tensor_at<TD>(arena, o_dy), tensor_at<T>(arena, o_dw)};
    gemm_tiled(io, C::COG, C::CIG * C::KH * C::KW, C::NB * C::HO * C::WO);
}

// The weight gradient split over K (when its few output tiles would leave the GPU idle): GEMM
// batch z = group * SPLITK + split, split s summing k in [s * KS, (s + 1) * KS) into its fp32
// partial at the workspace ([G * SPLITK, COG, CIG*KH*KW]); the finishing launch sums each
// element's partials in split order and stores it.
template <typename T, typename TD, typename C> struct ConvBwdWeightSplitIO {
    ConvBwdWeightIO<T, TD, C> io;
    float* P;
    __device__ bool in(u64 z, u64 k) const { return (z % C::SPLITK) * C::KS + k < C::NB * C::HO * C::WO; }
    __device__ float a(u64 z, u64 m, u64 k) const { return in(z, k) ? io.a(z / C::SPLITK, m, (z % C::SPLITK) * C::KS + k) : 0.0f; }
    __device__ float b(u64 z, u64 k, u64 n) const { return in(z, k) ? io.b(z / C::SPLITK, (z % C::SPLITK) * C::KS + k, n) : 0.0f; }
    __device__ void store(u64 z, u64 m, u64 n, float v) const { P[(z * C::COG + m) * (C::CIG * C::KH * C::KW) + n] = v; }
};
template <typename T, typename TD, typename C>
__device__ void conv2d_backward_weight_split_kernel(char* arena, u64 o_x, u64 o_dy, u64 o_dw, u64 o_ws, u64 phase) {
    ConvBwdWeightIO<T, TD, C> io{tensor_at<T>(arena, o_x), tensor_at<TD>(arena, o_dy), tensor_at<T>(arena, o_dw)};
    float* part = tensor_at<float>(arena, o_ws);
    constexpr u64 NW = C::CIG * C::KH * C::KW, G = C::CO / C::COG;
    if (phase == 0) {
        ConvBwdWeightSplitIO<T, TD, C> split{io, part};
        gemm_tiled(split, C::COG, NW, C::KS);
        return;
    }
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < G * C::COG * NW; e += (u64)gridDim.x * blockDim.x) {
        const u64 g = e / (C::COG * NW), m = (e / NW) % C::COG, n = e % NW;
        float v = 0.0f;
        for (u64 s = 0; s < C::SPLITK; ++s) v += part[((g * C::SPLITK + s) * C::COG + m) * NW + n];
        io.store(g, m, n, v);
    }
}
