//! N-d convolution (NCDHW, cross-correlation, zero padding, groups, dilation; 1-D and 2-D as
//! 3-D with unit leading extents) and its input and weight gradients, all as implicit GEMMs on
//! the tiled core of matmul.cu (one GEMM batch per group; no im2col buffer). Geometry:
//! x [NB, CI, D, H, W], w [CO, CIG, KD, KH, KW], y [NB, CO, DO, HO, WO], CIG = CI / G,
//! COG = CO / G; the transposed convolution is the input gradient's kernel.

// Input coordinate read by output coordinate o at tap t, or -1 when it falls in the padding.
__device__ __forceinline__ long long conv_in(long long o, long long t, long long s, long long p, long long d, long long n) {
    const long long v = o * s - p + t * d;
    return (v >= 0 && v < n) ? v : -1;
}

// Output coordinate whose tap t reads input coordinate i, or -1 when none does exactly.
__device__ __forceinline__ long long conv_out_at(long long i, long long t, long long s, long long p, long long d, long long n) {
    const long long v = i + p - t * d;
    if (v < 0 || v % s != 0 || v / s >= n) return -1;
    return v / s;
}

template <typename C> struct ConvGeom {
    static constexpr u64 TAPS = C::KD * C::KH * C::KW, IN = C::D * C::H * C::W, OUT = C::DO * C::HO * C::WO;
    // Along one axis: the input coordinate output o reads at tap t, or (TO_OUT) the output
    // coordinate whose tap t reads input o; -1 when there is none.
    template <bool TO_OUT> __device__ static long long axis(u64 o, u64 t, u64 s, u64 p, u64 d, u64 n_in, u64 n_out) {
        return TO_OUT ? conv_out_at(o, t, s, p, d, n_out) : conv_in(o, t, s, p, d, n_in);
    }
    // The offset within one channel plane that position sp meets at tap t: the input read by
    // output sp, or (TO_OUT) the output reading input sp; -1 when there is none.
    template <bool TO_OUT> __device__ static long long meet(u64 sp, u64 t) {
        constexpr u64 FH = TO_OUT ? C::H : C::HO, FW = TO_OUT ? C::W : C::WO;
        constexpr u64 RH = TO_OUT ? C::HO : C::H, RW = TO_OUT ? C::WO : C::W;
        const u64 kw = t % C::KW, kh = (t / C::KW) % C::KH, kd = t / (C::KW * C::KH);
        const long long d = axis<TO_OUT>(sp / (FW * FH), kd, C::SD, C::PD, C::DD, C::D, C::DO),
                        h = axis<TO_OUT>((sp / FW) % FH, kh, C::SH, C::PH, C::DH, C::H, C::HO),
                        w = axis<TO_OUT>(sp % FW, kw, C::SW, C::PW, C::DW, C::W, C::WO);
        if (d < 0 || h < 0 || w < 0) return -1;
        return ((u64)d * RH + (u64)h) * RW + (u64)w;
    }
    __device__ static long long in_at(u64 sp, u64 t) { return meet<false>(sp, t); }
    __device__ static long long out_at(u64 sp, u64 t) { return meet<true>(sp, t); }
};

// y: M = COG (out channel), N = NB*OUT, K = CIG*TAPS.
template <typename T, typename C> struct ConvFwdIO {
    using G = ConvGeom<C>;
    const T* X;
    const T* Wt;
    T* Y;
    __device__ float a(u64 g, u64 m, u64 k) const { return ld(Wt, (g * C::COG + m) * (C::CIG * G::TAPS) + k); }
    __device__ float b(u64 g, u64 k, u64 n) const {
        const long long i = G::in_at(n % G::OUT, k % G::TAPS);
        if (i < 0) return 0.0f;
        return ld(X, ((n / G::OUT) * C::CI + g * C::CIG + k / G::TAPS) * G::IN + (u64)i);
    }
    __device__ void store(u64 g, u64 m, u64 n, float v) const {
        st(Y, ((n / G::OUT) * C::CO + g * C::COG + m) * G::OUT + n % G::OUT, v);
    }
};

// dx: M = CIG, N = NB*IN, K = COG*TAPS; dy[nb, co, o] contributes when output o's tap reads
// the input position exactly.
template <typename T, typename TW, typename C> struct ConvBwdInputIO {
    using G = ConvGeom<C>;
    const T* DY;
    const TW* Wt;
    T* DX;
    __device__ float a(u64 g, u64 m, u64 k) const {
        return ld(Wt, ((g * C::COG + k / G::TAPS) * C::CIG + m) * G::TAPS + k % G::TAPS);
    }
    __device__ float b(u64 g, u64 k, u64 n) const {
        const long long o = G::out_at(n % G::IN, k % G::TAPS);
        if (o < 0) return 0.0f;
        return ld(DY, ((n / G::IN) * C::CO + g * C::COG + k / G::TAPS) * G::OUT + (u64)o);
    }
    __device__ void store(u64 g, u64 m, u64 n, float v) const {
        st(DX, ((n / G::IN) * C::CI + g * C::CIG + m) * G::IN + n % G::IN, v);
    }
};

// dw: M = COG, N = CIG*TAPS, K = NB*OUT.
template <typename T, typename TD, typename C> struct ConvBwdWeightIO {
    using G = ConvGeom<C>;
    const T* X;
    const TD* DY;
    T* DW;
    __device__ float a(u64 g, u64 m, u64 k) const {
        return ld(DY, ((k / G::OUT) * C::CO + g * C::COG + m) * G::OUT + k % G::OUT);
    }
    __device__ float b(u64 g, u64 k, u64 n) const {
        const long long i = G::in_at(k % G::OUT, n % G::TAPS);
        if (i < 0) return 0.0f;
        return ld(X, ((k / G::OUT) * C::CI + g * C::CIG + n / G::TAPS) * G::IN + (u64)i);
    }
    __device__ void store(u64 g, u64 m, u64 n, float v) const { st(DW, (g * C::COG + m) * (C::CIG * G::TAPS) + n, v); }
};

template <typename T, typename C> __device__ void conv_kernel(char* arena, u64 o_x, u64 o_w, u64 o_y) {
    ConvFwdIO<T, C> io{tensor_at<T>(arena, o_x), tensor_at<T>(arena, o_w), tensor_at<T>(arena, o_y)};
    gemm_tiled(io, C::COG, C::NB * ConvGeom<C>::OUT, C::CIG * ConvGeom<C>::TAPS);
}
template <typename T, typename TW, typename C> __device__ void conv_backward_input_kernel(char* arena, u64 o_dy, u64 o_w, u64 o_dx) {
    ConvBwdInputIO<T, TW, C> io{tensor_at<T>(arena, o_dy), tensor_at<TW>(arena, o_w), tensor_at<T>(arena, o_dx)};
    gemm_tiled(io, C::CIG, C::NB * ConvGeom<C>::IN, C::COG * ConvGeom<C>::TAPS);
}
template <typename T, typename TD, typename C> __device__ void conv_backward_weight_kernel(char* arena, u64 o_x, u64 o_dy, u64 o_dw) {
    ConvBwdWeightIO<T, TD, C> io{tensor_at<T>(arena, o_x), tensor_at<TD>(arena, o_dy), tensor_at<T>(arena, o_dw)};
    gemm_tiled(io, C::COG, C::CIG * ConvGeom<C>::TAPS, C::NB * ConvGeom<C>::OUT);
}

// A GEMM split over K (when its few output tiles would leave the GPU idle): GEMM batch
// z = group * SPLITK + split, split s summing k in [s * KS, (s + 1) * KS) of the K the inner
// IO sums into its fp32 partial at the workspace ([G * SPLITK, M, N]); the finishing launch
// sums each element's partials in split order and stores it through the inner IO.
template <typename IO, typename C> struct SplitKIO {
    IO io;
    float* P;
    u64 M, N, K;
    __device__ bool in(u64 z, u64 k) const { return (z % C::SPLITK) * C::KS + k < K; }
    __device__ float a(u64 z, u64 m, u64 k) const { return in(z, k) ? io.a(z / C::SPLITK, m, (z % C::SPLITK) * C::KS + k) : 0.0f; }
    __device__ float b(u64 z, u64 k, u64 n) const { return in(z, k) ? io.b(z / C::SPLITK, (z % C::SPLITK) * C::KS + k, n) : 0.0f; }
    __device__ void store(u64 z, u64 m, u64 n, float v) const { P[(z * M + m) * N + n] = v; }
};
template <typename C, typename IO> __device__ void split_k_gemm(const IO& io, float* part, u64 M, u64 N, u64 K, u64 phase) {
    constexpr u64 G = C::CO / C::COG;
    if (phase == 0) {
        SplitKIO<IO, C> split{io, part, M, N, K};
        gemm_tiled(split, M, N, C::KS);
        return;
    }
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < G * M * N; e += (u64)gridDim.x * blockDim.x) {
        const u64 g = e / (M * N), m = (e / N) % M, n = e % N;
        float v = 0.0f;
        for (u64 s = 0; s < C::SPLITK; ++s) v += part[((g * C::SPLITK + s) * M + m) * N + n];
        io.store(g, m, n, v);
    }
}
template <typename T, typename C> __device__ void conv_split_kernel(char* arena, u64 o_x, u64 o_w, u64 o_y, u64 o_ws, u64 phase) {
    ConvFwdIO<T, C> io{tensor_at<T>(arena, o_x), tensor_at<T>(arena, o_w), tensor_at<T>(arena, o_y)};
    split_k_gemm<C>(io, tensor_at<float>(arena, o_ws), C::COG, C::NB * ConvGeom<C>::OUT, C::CIG * ConvGeom<C>::TAPS, phase);
}
template <typename T, typename TW, typename C>
__device__ void conv_backward_input_split_kernel(char* arena, u64 o_dy, u64 o_w, u64 o_dx, u64 o_ws, u64 phase) {
    ConvBwdInputIO<T, TW, C> io{tensor_at<T>(arena, o_dy), tensor_at<TW>(arena, o_w), tensor_at<T>(arena, o_dx)};
    split_k_gemm<C>(io, tensor_at<float>(arena, o_ws), C::CIG, C::NB * ConvGeom<C>::IN, C::COG * ConvGeom<C>::TAPS, phase);
}
template <typename T, typename TD, typename C>
__device__ void conv_backward_weight_split_kernel(char* arena, u64 o_x, u64 o_dy, u64 o_dw, u64 o_ws, u64 phase) {
    ConvBwdWeightIO<T, TD, C> io{tensor_at<T>(arena, o_x), tensor_at<TD>(arena, o_dy), tensor_at<T>(arena, o_dw)};
    split_k_gemm<C>(io, tensor_at<float>(arena, o_ws), C::COG, C::CIG * ConvGeom<C>::TAPS, C::NB * ConvGeom<C>::OUT, phase);
}
