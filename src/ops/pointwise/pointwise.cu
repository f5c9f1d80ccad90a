//! Elementwise kernels: fill, unary functions and their derivatives, broadcasting binary
//! ops and comparisons, where, clamp, affine, dtype casts and plain copies. One thread per
//! output element (grid-stride).

// Unary function codes (C::OP), in the order of memc's UnaryFn.
#define U_NEG 0
#define U_EXP 1
#define U_LOG 2
#define U_SQRT 3
#define U_RSQRT 4
#define U_TANH 5
#define U_SIGMOID 6
#define U_RELU 7
#define U_GELU_TANH 8
#define U_GELU_ERF 9
#define U_SILU 10
#define U_ERF 11
#define U_SOFTPLUS 12
#define U_RECIPROCAL 13

#define MEMC_SQRT_2_OVER_PI 0.7978846f
#define MEMC_GELU_C 0.044715f
#define MEMC_INV_SQRT_2PI 0.3989423f
#define MEMC_FRAC_1_SQRT_2 0.70710678f
#define MEMC_2_OVER_SQRT_PI 1.1283792f

__device__ __forceinline__ float memc_sigmoid(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    const float e = expf(x);
    return e / (1.0f + e);
}

template <int OP> __device__ __forceinline__ float unary_eval(float x) {
    switch (OP) {
    case U_NEG: return -x;
    case U_EXP: return expf(x);
    case U_LOG: return logf(x);
    case U_SQRT: return sqrtf(x);
    case U_RSQRT: return 1.0f / sqrtf(x);
    case U_TANH: return tanhf(x);
    case U_SIGMOID: return memc_sigmoid(x);
    case U_RELU: return fmaxf(x, 0.0f);
    case U_GELU_TANH: return 0.5f * x * (1.0f + tanhf(MEMC_SQRT_2_OVER_PI * (x + MEMC_GELU_C * x * x * x)));
    case U_GELU_ERF: return 0.5f * x * (1.0f + erff(x * MEMC_FRAC_1_SQRT_2));
    case U_ERF: return erff(x);
    case U_SOFTPLUS: return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
    case U_RECIPROCAL: return 1.0f / x;
    default: return x * memc_sigmoid(x);
    }
}

// f'(x) from y = f(x), for the functions whose derivative is a function of their output.
template <int OP> __device__ __forceinline__ float unary_deriv_of_output(float y) {
    switch (OP) {
    case U_EXP: return y;
    case U_TANH: return 1.0f - y * y;
    case U_SIGMOID: return y * (1.0f - y);
    default: return y > 0.0f ? 1.0f : 0.0f;
    }
}

template <int OP> __device__ __forceinline__ float unary_deriv(float x) {
    switch (OP) {
    case U_NEG: return -1.0f;
    case U_EXP:
    case U_TANH:
    case U_SIGMOID:
    case U_RELU: return unary_deriv_of_output<OP>(unary_eval<OP>(x));
    case U_LOG: return 1.0f / x;
    case U_SQRT: return 0.5f / sqrtf(x);
    case U_RSQRT: return -0.5f / (x * sqrtf(x));
    case U_GELU_TANH: {
        const float t = tanhf(MEMC_SQRT_2_OVER_PI * (x + MEMC_GELU_C * x * x * x));
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * MEMC_SQRT_2_OVER_PI * (1.0f + 3.0f * MEMC_GELU_C * x * x);
    }
    case U_GELU_ERF: {
        const float cdf = 0.5f * (1.0f + erff(x * MEMC_FRAC_1_SQRT_2));
        return cdf + x * MEMC_INV_SQRT_2PI * expf(-0.5f * x * x);
    }
    case U_ERF: return MEMC_2_OVER_SQRT_PI * expf(-x * x);
    case U_SOFTPLUS: return memc_sigmoid(x);
    case U_RECIPROCAL: return -1.0f / (x * x);
    default: { const float s = memc_sigmoid(x); return s * (1.0f + x * (1.0f - s)); }
    }
}

// out[i] = C::VALUE.
template <typename T, typename C> __device__ void fill_kernel(char* arena, u64 o_out) {
    T* out = tensor_at<T>(arena, o_out);
    MEMC_GRID_LOOP(i, C::N) st(out, i, C::VALUE);
}

// out[i] = f(x[i]).
template <typename T, typename C> __device__ void unary_kernel(char* arena, u64 o_x, u64 o_out) {
    const T* x = tensor_at<T>(arena, o_x);
    T* out = tensor_at<T>(arena, o_out);
    MEMC_GRID_LOOP(i, C::N) st(out, i, unary_eval<C::OP>(ld(x, i)));
}

// dx[i] = f'(x[i]) * dy[i].
template <typename T, typename TD, typename C>
__device__ void unary_backward_kernel(char* arena, u64 o_x, u64 o_dy, u64 o_dx) {
    const T* x = tensor_at<T>(arena, o_x);
    const TD* dy = tensor_at<TD>(arena, o_dy);
    T* dx = tensor_at<T>(arena, o_dx);
    MEMC_GRID_LOOP(i, C::N) st(dx, i, unary_deriv<C::OP>(ld(x, i)) * ld(dy, i));
}

// out[i] = f(x[i]) and out[C::AT + i] = f'(x[i]) * dy[i], reading x once; the elements
// between the two (from C::N to C::AT) are zero.
template <typename T, typename TD, typename C>
__device__ void unary_pair_kernel(char* arena, u64 o_x, u64 o_dy, u64 o_out) {
    const T* x = tensor_at<T>(arena, o_x);
    const TD* dy = tensor_at<TD>(arena, o_dy);
    T* out = tensor_at<T>(arena, o_out);
    MEMC_GRID_LOOP(i, C::AT) {
        if (i < C::N) {
            const float v = ld(x, i);
            st(out, i, unary_eval<C::OP>(v));
            st(out, C::AT + i, unary_deriv<C::OP>(v) * ld(dy, i));
        } else {
            st(out, i, 0.0f);
        }
    }
}

// dx[i] = f'(x[i]) * dy[i] from the forward output y = f(x).
template <typename T, typename TD, typename C>
__device__ void unary_output_backward_kernel(char* arena, u64 o_y, u64 o_dy, u64 o_dx) {
    const T* y = tensor_at<T>(arena, o_y);
    const TD* dy = tensor_at<TD>(arena, o_dy);
    T* dx = tensor_at<T>(arena, o_dx);
    MEMC_GRID_LOOP(i, C::N) st(dx, i, unary_deriv_of_output<C::OP>(ld(y, i)) * ld(dy, i));
}

// out = a (op) b with numpy broadcasting: C::OUT is the output shape, C::SA / C::SB the
// element strides of a and b viewed at that shape (0 on broadcast dims). Each operand is read
// in its own type (a 16-bit one of an fp32 op widened exactly), the result stored in T.
template <typename TA, typename TB, typename T, typename C> __device__ void binary_kernel(char* arena, u64 o_a, u64 o_b, u64 o_out) {
    const TA* a = tensor_at<TA>(arena, o_a);
    const TB* b = tensor_at<TB>(arena, o_b);
    T* out = tensor_at<T>(arena, o_out);
    MEMC_GRID_LOOP(i, C::N) {
        const float x = ld(a, strided<typename C::OUT, typename C::SA>(i));
        const float y = ld(b, strided<typename C::OUT, typename C::SB>(i));
        float r;
        switch (C::OP) {
        case 0: r = x + y; break;
        case 1: r = x - y; break;
        case 2: r = x * y; break;
        case 3: r = x / y; break;
        // minimum / maximum propagate NaN; comparisons give a 0/1 mask (0 for NaN).
        case 4: r = (x != x || x < y) ? x : y; break;
        case 5: r = (x != x || x > y) ? x : y; break;
        case 6: r = x < y ? 1.0f : 0.0f; break;
        case 7: r = x <= y ? 1.0f : 0.0f; break;
        case 8: r = x > y ? 1.0f : 0.0f; break;
        case 9: r = x >= y ? 1.0f : 0.0f; break;
        case 10: r = x == y ? 1.0f : 0.0f; break;
        default: r = powf(x, y); break;
        }
        st(out, i, r);
    }
}

// out = cond != 0 ? a : b with numpy broadcasting of all three: C::SC, C::SA, C::SB are
// their element strides viewed at the output shape C::OUT (a NaN condition is nonzero).
template <typename T, typename C>
__device__ void where_kernel(char* arena, u64 o_c, u64 o_a, u64 o_b, u64 o_out) {
    const T* c = tensor_at<T>(arena, o_c);
    const T* a = tensor_at<T>(arena, o_a);
    const T* b = tensor_at<T>(arena, o_b);
    T* out = tensor_at<T>(arena, o_out);
    MEMC_GRID_LOOP(i, C::N) {
        const bool pick = ld(c, strided<typename C::OUT, typename C::SC>(i)) != 0.0f;
        st(out, i, pick ? ld(a, strided<typename C::OUT, typename C::SA>(i))
                        : ld(b, strided<typename C::OUT, typename C::SB>(i)));
    }
}

// out[i] = x[i] clamped to [C::LO, C::HI] (each bound only where C::HAS_LO / C::HAS_HI):
// LO below LO, then HI above HI; NaN stays NaN.
template <typename T, typename C> __device__ void clamp_kernel(char* arena, u64 o_x, u64 o_out) {
    const T* x = tensor_at<T>(arena, o_x);
    T* out = tensor_at<T>(arena, o_out);
    MEMC_GRID_LOOP(i, C::N) {
        float v = ld(x, i);
        if (C::HAS_LO && v < C::LO) v = C::LO;
        if (C::HAS_HI && v > C::HI) v = C::HI;
        st(out, i, v);
    }
}

// dx[i] = dy[i] where LO <= x[i] <= HI (bounds included, absent ones not tested; never for
// NaN), else 0.
template <typename T, typename TD, typename C>
__device__ void clamp_backward_kernel(char* arena, u64 o_x, u64 o_dy, u64 o_dx) {
    const T* x = tensor_at<T>(arena, o_x);
    const TD* dy = tensor_at<TD>(arena, o_dy);
    T* dx = tensor_at<T>(arena, o_dx);
    MEMC_GRID_LOOP(i, C::N) {
        const float v = ld(x, i);
        const bool pass = v == v && (!C::HAS_LO || v >= C::LO) && (!C::HAS_HI || v <= C::HI);
        st(dx, i, pass ? ld(dy, i) : 0.0f);
    }
}

// out[i] = x[i] * C::SCALE + C::SHIFT.
template <typename T, typename C> __device__ void affine_kernel(char* arena, u64 o_x, u64 o_out) {
    const T* x = tensor_at<T>(arena, o_x);
    T* out = tensor_at<T>(arena, o_out);
    MEMC_GRID_LOOP(i, C::N) st(out, i, ld(x, i) * C::SCALE + C::SHIFT);
}

// out[i] = (TO) x[i], through fp32 (round to nearest even when narrowing).
template <typename TI, typename TO, typename C> __device__ void cast_kernel(char* arena, u64 o_x, u64 o_out) {
    const TI* x = tensor_at<TI>(arena, o_x);
    TO* out = tensor_at<TO>(arena, o_out);
    MEMC_GRID_LOOP(i, C::N) st(out, i, ld(x, i));
}

// The casts of C::TENSORS tensors packed one after the other into out: element e belongs to
// the last table row (24 bytes: arena offset, first element, type) whose first element is
// at most e, and is converted as cast_kernel converts it.
template <typename TI, typename TO, typename C> __device__ void cast_group_kernel(char* arena, u64 o_ws, u64 o_out) {
    const u64* tab = tensor_at<u64>(arena, o_ws);
    TO* out = tensor_at<TO>(arena, o_out);
    MEMC_GRID_LOOP(e, C::TOTAL) {
        u64 lo = 0, hi = C::TENSORS;
        while (hi - lo > 1) {
            const u64 mid = (lo + hi) / 2;
            if (tab[3 * mid + 1] <= e) lo = mid; else hi = mid;
        }
        st(out, e, ld(tensor_at<TI>(arena, tab[3 * lo]), e - tab[3 * lo + 1]));
    }
}
