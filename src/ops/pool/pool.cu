//! 2-D max and average pooling over NCHW with their backwards (torch semantics: floor mode;
//! avg counts padded zeros; max ignores padding, first maximum wins, a NaN wins).
//! Backwards are gathers (each dx element sums the windows containing it): no atomics.

// In-bounds input rows/cols [lo, hi) of output coordinate o along one axis.
__device__ __forceinline__ void pool_range(long long o, long long k, long long s, long long p, long long n,
                                           long long& lo, long long& hi) {
    lo = o * s - p;
    hi = lo + k;
    if (lo < 0) lo = 0;
    if (hi > n) hi = n;
}

// Flat in-plane index of the first maximum of window (oh, ow), or -1 if it is empty.
template <typename T, typename C> __device__ __forceinline__ long long pool_argmax(const T* xp, long long oh, long long ow) {
    long long h0, h1, w0, w1;
    pool_range(oh, C::KH, C::SH, C::PH, C::H, h0, h1);
    pool_range(ow, C::KW, C::SW, C::PW, C::W, w0, w1);
    long long best = -1;
    float bv = 0.0f;
    for (long long h = h0; h < h1; ++h)
        for (long long w = w0; w < w1; ++w) {
            const float v = ld(xp, (u64)(h * C::W + w));
            if (best < 0 || v > bv || v != v) { best = h * C::W + w; bv = v; }
        }
    return best;
}

// C::MAX selects max pooling, else average (divide by KH*KW).
template <typename T, typename C> __device__ void pool_kernel(char* arena, u64 o_x, u64 o_out) {
    const T* x = tensor_at<T>(arena, o_x);
    T* out = tensor_at<T>(arena, o_out);
    MEMC_GRID_LOOP(i, C::N) {
        const long long ow = i % C::WO, oh = (i / C::WO) % C::HO;
        const T* xp = x + (i / (C::WO * C::HO)) * (C::H * C::W);
        if (C::MAX) {
            const long long a = pool_argmax<T, C>(xp, oh, ow);
            st(out, i, a < 0 ? MEMC_NEG_INF : ld(xp, (u64)a));
        } else {
            long long h0, h1, w0, w1;
            pool_range(oh, C::KH, C::SH, C::PH, C::H, h0, h1);
            pool_range(ow, C::KW, C::SW, C::PW, C::W, w0, w1);
            float s = 0.0f;
            for (long long h = h0; h < h1; ++h)
                for (long long w = w0; w < w1; ++w) s += ld(xp, (u64)(h * C::W + w));
            st(out, i, s * (1.0f / (float)(C::KH * C::KW)));
        }
    }
}

// Output windows along one axis that contain input coordinate h: [lo, hi).
__device__ __forceinline__ void pool_windows(long long h, long long k, long long s, long long p, long long no,
                                             long long& lo, long long& hi) {
    // o*s - p <= h < o*s - p + k  <=>  (h + p - k) / s < o <= (h + p) / s
    const long long a = h + p - k + 1;
    lo = a <= 0 ? 0 : (a + s - 1) / s;
    hi = (h + p) / s + 1;
    if (hi > no) hi = no;
}

// dx of max pooling (needs x) or avg pooling (o_x unused). Grid over dx elements.
template <typename T, typename TD, typename C>
__device__ void pool_backward_kernel(char* arena, u64 o_x, u64 o_dy, u64 o_dx) {
    const T* x = tensor_at<T>(arena, o_x);
    const TD* dy = tensor_at<TD>(arena, o_dy);
    T* dx = tensor_at<T>(arena, o_dx);
    MEMC_GRID_LOOP(i, C::N) {
        const long long w = i % C::W, h = (i / C::W) % C::H;
        const u64 plane = i / (C::W * C::H);
        const T* xp = x + plane * (C::H * C::W);
        const TD* dyp = dy + plane * (C::HO * C::WO);
        long long oh0, oh1, ow0, ow1;
        pool_windows(h, C::KH, C::SH, C::PH, C::HO, oh0, oh1);
        pool_windows(w, C::KW, C::SW, C::PW, C::WO, ow0, ow1);
        float acc = 0.0f;
        // dy is read only where it is added (reading it for every window spills on sm_80).
        const long long self = h * C::W + w;
        for (long long oh = oh0; oh < oh1; ++oh)
            for (long long ow = ow0; ow < ow1; ++ow) {
                if (C::MAX) {
                    if (pool_argmax<T, C>(xp, oh, ow) == self) acc += ld(dyp, (u64)(oh * C::WO + ow));
                } else {
                    acc += ld(dyp, (u64)(oh * C::WO + ow)) * (1.0f / (float)(C::KH * C::KW));
                }
            }
        st(dx, i, acc);
    }
}
