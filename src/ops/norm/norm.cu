//! Layer, RMS, batch (training statistics) and group normalization: forward and the input,
//! weight and bias backwards, and batch norm's running statistics. The forward, the input
//! gradient and the running statistics take one block per statistics group, or, when the
//! groups are few and large (C::SLICES > 1), a block per slice of a group in two stages; the
//! weight and bias gradients are two-stage reductions over positions. Statistics in fp32 with
//! a two-pass (mean, then centred variance) scheme; partial statistics merge in fp64.
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

// ---- partial statistics over consecutive chunks of a group, and their merge ------------
// Chunk k of a group in chunks of `len` elements covers [k len, min((k + 1) len, GSIZE)).

template <typename C> __device__ __forceinline__ u64 norm_chunk_len(u64 len, u64 k) {
    const u64 e0 = k * len;
    return e0 + len < C::GSIZE ? len : C::GSIZE - e0;
}

// Writes the partial statistics of elements [e0, e1) of group g to p[0..4): their mean m
// (0 for rms), centred sum of squares M2, and, when dy is given, the sum G of gr and the sum
// H of gr (x - m), where gr = dy, times w[channel] when w is given (0 without dy). Every
// thread of the block must call it.
template <typename T, typename TD, typename TW, typename C>
__device__ __forceinline__ void norm_partial(const T* x, const TD* dy, const TW* w, u64 g, u64 e0, u64 e1, float* p) {
    float m = 0.0f;
    if (C::KIND != 1) {
        float s = 0.0f;
        for (u64 e = e0 + threadIdx.x; e < e1; e += blockDim.x) s += ld(x, norm_off<C>(g, e));
        m = e1 == e0 ? 0.0f : block_sum(s) / (float)(e1 - e0);
    }
    float m2 = 0.0f, gs = 0.0f, h = 0.0f;
    for (u64 e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
        const u64 i = norm_off<C>(g, e);
        const float d = ld(x, i) - m;
        m2 += d * d;
        if (dy != nullptr) {
            const float gi = w != nullptr ? ld(dy, i) * ld(w, norm_ch<C>(g, e)) : ld(dy, i);
            gs += gi;
            h += gi * d;
        }
    }
    m2 = block_sum(m2);
    if (dy != nullptr) {
        gs = block_sum(gs);
        h = block_sum(h);
    }
    if (threadIdx.x == 0) {
        p[0] = m;
        p[1] = m2;
        p[2] = gs;
        p[3] = h;
    }
}

// A group's statistics merged from its chunks' partials: the mean mu, the biased variance,
// the sum of gr, and the sum of gr (x - mu).
struct NormMerged {
    float mean, var, g, h;
};

// Merges the norm_partial statistics p + k stride of chunks k = 0 .. n - 1 of `len`
// elements, in order (fp64): the mean mu = sum n_k m_k / GSIZE, the biased variance
// (sum M2_k + n_k (m_k - mu)^2) / GSIZE (the parallel-variance merge), sum G_k, and
// sum (H_k + (m_k - mu) G_k) = sum gr (x - mu).
template <typename C> __device__ __forceinline__ NormMerged norm_merge(const float* p, u64 n, u64 stride, u64 len) {
    // 1 / GSIZE at compile time: a division in fp64 would call a slow path that spills.
    constexpr double INV = C::GSIZE == 0 ? 0.0 : 1.0 / (double)C::GSIZE;
    double mu = 0.0;
    for (u64 k = 0; k < n; ++k) mu += (double)norm_chunk_len<C>(len, k) * p[k * stride];
    mu *= INV;
    double m2 = 0.0, gs = 0.0, h = 0.0;
    for (u64 k = 0; k < n; ++k) {
        const float* q = p + k * stride;
        const double d = (double)q[0] - mu;
        m2 += (double)q[1] + (double)norm_chunk_len<C>(len, k) * d * d;
        gs += (double)q[2];
        h += (double)q[3] + d * (double)q[2];
    }
    return NormMerged{(float)mu, (float)(m2 * INV), (float)gs, (float)h};
}

// ---- forward, input gradient and running statistics -------------------------------------
// C::SLICES == 1: block g takes group g (ws and phase unused). C::SLICES > 1: block
// b = g SLICES + s takes slice s (chunk s of C::SLICE elements) of group g; phase 0 writes the
// slice's norm_partial to ws[4 b ..], phase 1 merges group g's in slice order (every block of
// the group computes the same values) and finishes its slice.

// The first element of block b's slice of its group and the element past it.
template <typename C> __device__ __forceinline__ u64 norm_slice_begin(u64 b) {
    return (b % C::SLICES) * C::SLICE;
}
template <typename C> __device__ __forceinline__ u64 norm_slice_end(u64 b) {
    return norm_slice_begin<C>(b) + norm_chunk_len<C>(C::SLICE, b % C::SLICES);
}

// Group g's merged statistics (norm_merge) from the slice partials at ws.
template <typename C> __device__ __forceinline__ NormMerged norm_slices_merge(const float* part, u64 g) {
    return norm_merge<C>(part + 4 * g * C::SLICES, C::SLICES, 4, C::SLICE);
}

// Moves batch norm's running statistics of channel g towards the batch mean and biased
// variance var (made unbiased here): r = (1 - MOMENTUM) r + MOMENTUM batch.
template <typename C> __device__ __forceinline__ void batch_stats_update(float* rm, float* rv, u64 g, float mean, float var) {
    const float unbiased = var * ((float)C::GSIZE / (float)(C::GSIZE - 1));
    rm[g] = (1.0f - C::MOMENTUM) * rm[g] + C::MOMENTUM * mean;
    rv[g] = (1.0f - C::MOMENTUM) * rv[g] + C::MOMENTUM * unbiased;
}

// Batch norm's running statistics (fp32 [CH]) moved towards x's per-channel mean and unbiased
// variance (C::KIND 2); split, phase 1 is a thread per channel.
template <typename T, typename C>
__device__ void batch_norm_stats_kernel(char* arena, u64 o_mean, u64 o_var, u64 o_x, u64 o_ws, u64 phase) {
    float* rm = tensor_at<float>(arena, o_mean);
    float* rv = tensor_at<float>(arena, o_var);
    const T* x = tensor_at<T>(arena, o_x);
    float* part = tensor_at<float>(arena, o_ws);
    if (C::SLICES > 1 && phase != 0) {
        const u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
        if (g >= C::GROUPS) return;
        const NormMerged r = norm_slices_merge<C>(part, g);
        batch_stats_update<C>(rm, rv, g, r.mean, r.var);
        return;
    }
    if (C::SLICES > 1) {
        for (u64 b = blockIdx.x; b < C::GROUPS * C::SLICES; b += gridDim.x) {
            const T* none = nullptr;
            norm_partial<T, T, T, C>(x, none, none, b / C::SLICES, norm_slice_begin<C>(b), norm_slice_end<C>(b), part + 4 * b);
        }
        return;
    }
    for (u64 g = blockIdx.x; g < C::GROUPS; g += gridDim.x) {
        const float2 mv = norm_moments<T, C>(x, g);
        if (threadIdx.x == 0) batch_stats_update<C>(rm, rv, g, mv.x, mv.y);
    }
}

// Stores normalize(x) * w + b over elements [e0, e1) of group g with ms = (mean, rstd).
template <typename T, typename TW, typename TO, typename C>
__device__ __forceinline__ void norm_store(const T* x, const TW* w, const TW* b, TO* out, u64 g, u64 e0, u64 e1, float2 ms) {
    for (u64 e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
        const u64 i = norm_off<C>(g, e), c = norm_ch<C>(g, e);
        float y = (ld(x, i) - ms.x) * ms.y * ld(w, c);
        if (C::HAS_BIAS) y += ld(b, c);
        st(out, i, y);
    }
}

// out = normalize(x) * w + b (C::HAS_BIAS; b is ignored otherwise), stored as TO: a block per
// group, or per slice of one in two phases; `before(g, e0, e1)`, called by every thread of
// the block, first writes the elements [e0, e1) of group g that the block then reads.
template <typename T, typename TW, typename TO, typename C, typename Before>
__device__ __forceinline__ void norm_rows(const T* x, const TW* w, const TW* b, TO* out, float* part, u64 phase, Before before) {
    if (C::SLICES > 1) {
        for (u64 k = blockIdx.x; k < C::GROUPS * C::SLICES; k += gridDim.x) {
            const u64 g = k / C::SLICES, e0 = norm_slice_begin<C>(k), e1 = norm_slice_end<C>(k);
            if (phase == 0) {
                before(g, e0, e1);
                const T* none = nullptr;
                norm_partial<T, T, T, C>(x, none, none, g, e0, e1, part + 4 * k);
            } else {
                const NormMerged r = norm_slices_merge<C>(part, g);
                norm_store<T, TW, TO, C>(x, w, b, out, g, e0, e1, make_float2(r.mean, rsqrtf(r.var + C::EPS)));
            }
        }
        return;
    }
    for (u64 g = blockIdx.x; g < C::GROUPS; g += gridDim.x) {
        before(g, 0, C::GSIZE);
        norm_store<T, TW, TO, C>(x, w, b, out, g, 0, C::GSIZE, norm_stats<T, C>(x, g));
    }
}

template <typename T, typename TW, typename TO, typename C>
__device__ void norm_kernel(char* arena, u64 o_x, u64 o_w, u64 o_b, u64 o_out, u64 o_ws, u64 phase) {
    norm_rows<T, TW, TO, C>(tensor_at<T>(arena, o_x), tensor_at<TW>(arena, o_w), tensor_at<TW>(arena, o_b), tensor_at<TO>(arena, o_out),
                            tensor_at<float>(arena, o_ws), phase, [](u64, u64, u64) {});
}

// A residual add and the norm of its sum (layer/RMS): s = a + b in fp32 at the output's
// start, each block storing the sums of the rows (or slice) it then normalizes, and the norm
// of s stored as TO from the byte of fp32 element C::NORM_AT of the output on; the same bits
// as the add's kernel, then norm_kernel over s.
template <typename TA, typename TB, typename TW, typename TO, typename C>
__device__ void add_norm_kernel(char* arena, u64 o_a, u64 o_b, u64 o_w, u64 o_bias, u64 o_out, u64 o_ws, u64 phase) {
    const TA* a = tensor_at<TA>(arena, o_a);
    const TB* b = tensor_at<TB>(arena, o_b);
    float* s = tensor_at<float>(arena, o_out);
    const auto sums = [&](u64 g, u64 e0, u64 e1) {
        for (u64 e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
            const u64 i = norm_off<C>(g, e);
            s[i] = ld(a, i) + ld(b, i);
        }
        __syncthreads();
    };
    norm_rows<float, TW, TO, C>(s, tensor_at<TW>(arena, o_w), tensor_at<TW>(arena, o_bias), reinterpret_cast<TO*>(s + C::NORM_AT),
                                tensor_at<float>(arena, o_ws), phase, sums);
}

// Stores dx = rstd * (gr - mg - xhat * mgx) over elements [e0, e1) of group g, with
// ms = (mean, rstd), gr = dy * w, mg = mean(gr) (0 for rms) and mgx = mean(gr * xhat); with
// C::ACC, dx = acc + that, added as a separate rounding.
template <typename T, typename TW, typename TD, typename TG, typename C>
__device__ __forceinline__ void norm_input_store(const T* x, const TW* w, const TD* dy, const TG* acc, T* dx, u64 g, u64 e0, u64 e1, float2 ms, float mg, float mgx) {
    for (u64 e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
        const u64 i = norm_off<C>(g, e);
        const float gr = ld(dy, i) * ld(w, norm_ch<C>(g, e));
        const float xh = (ld(x, i) - ms.x) * ms.y;
        const float d = ms.y * (gr - mg - xh * mgx);
        st(dx, i, C::ACC ? __fadd_rn(ld(acc, i), d) : d);
    }
}

// dx = rstd * (gr - mean(gr) - xhat * mean(gr * xhat)), gr = dy * w (no mean(gr) for rms);
// with C::ACC, dx = g + that, added as a separate rounding (o_g is ignored otherwise).
template <typename T, typename TW, typename TD, typename TG, typename C>
__device__ void norm_backward_input_kernel(char* arena, u64 o_x, u64 o_w, u64 o_dy, u64 o_g, u64 o_dx, u64 o_ws, u64 phase) {
    const T* x = tensor_at<T>(arena, o_x);
    const TW* w = tensor_at<TW>(arena, o_w);
    const TD* dy = tensor_at<TD>(arena, o_dy);
    const TG* acc = tensor_at<TG>(arena, o_g);
    T* dx = tensor_at<T>(arena, o_dx);
    float* part = tensor_at<float>(arena, o_ws);
    if (C::SLICES > 1) {
        for (u64 k = blockIdx.x; k < C::GROUPS * C::SLICES; k += gridDim.x) {
            const u64 g = k / C::SLICES, e0 = norm_slice_begin<C>(k), e1 = norm_slice_end<C>(k);
            if (phase == 0) {
                norm_partial<T, TD, TW, C>(x, dy, w, g, e0, e1, part + 4 * k);
            } else {
                const NormMerged r = norm_slices_merge<C>(part, g);
                const float rstd = rsqrtf(r.var + C::EPS);
                // 1 / GSIZE at compile time: two fp32 divisions here make ptxas spill on sm_90.
                constexpr float INV = (float)(1.0 / (double)C::GSIZE);
                const float mg = C::KIND == 1 ? 0.0f : r.g * INV;
                const float mgx = r.h * rstd * INV;
                norm_input_store<T, TW, TD, TG, C>(x, w, dy, acc, dx, g, e0, e1, make_float2(r.mean, rstd), mg, mgx);
            }
        }
        return;
    }
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
        norm_input_store<T, TW, TD, TG, C>(x, w, dy, acc, dx, g, 0, C::GSIZE, ms, mg, mgx);
    }
}

// ---- weight and bias gradients, two-stage over positions --------------------------------
// dw[c] = sum over the positions of channel c of dy * xhat; db[c] = sum of dy (C::BIAS: no x,
// no statistics). Phase 0: the block(s) of position chunk k write their partial sums to
// ws[k * CH + c]; phase 1: a thread per channel sums them over k = 0 .. C::CHUNKS - 1 in order
// (the batch weight gradient keeps four partials a chunk and merges them: see below).

// Loads row r of a layer/RMS norm's x into xv (thread t's channels t + j * blockDim.x,
// j < C::CPT; 0 past CH) and returns the row's (mean, rstd) (mean 0 for rms). Every thread
// of the block must call it.
template <typename T, typename C> __device__ __forceinline__ float2 norm_row_stats(const T* x, u64 r, float (&xv)[C::CPT]) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < (int)C::CPT; ++j) {
        const u64 c = threadIdx.x + (u64)j * blockDim.x;
        xv[j] = c < C::CH ? ld(x, r * C::CH + c) : 0.0f;
        s += xv[j];
    }
    const float mean = C::KIND == 1 ? 0.0f : block_sum(s) / (float)C::CH;
    float v = 0.0f;
#pragma unroll
    for (int j = 0; j < (int)C::CPT; ++j) {
        const float d = xv[j] - mean;
        if (threadIdx.x + (u64)j * blockDim.x < C::CH) v += d * d;
    }
    return make_float2(mean, rsqrtf(block_sum(v) / (float)C::CH + C::EPS));
}

// Layer/Rms phase 0: block k takes rows [k * RPB, (k + 1) * RPB); thread t owns channels
// t + j * blockDim.x (j < C::CPT), keeping the row's x in registers for its statistics.
template <typename T, typename TD, typename C> __device__ __forceinline__ void norm_rows_partial(const T* x, const TD* dy, float* part) {
    float acc[C::CPT];
#pragma unroll
    for (int j = 0; j < (int)C::CPT; ++j) acc[j] = 0.0f;
    const u64 r0 = (u64)blockIdx.x * C::RPB, r1 = r0 + C::RPB < C::GROUPS ? r0 + C::RPB : C::GROUPS;
    for (u64 r = r0; r < r1; ++r) {
        float xv[C::CPT];
        const float2 ms = C::BIAS ? make_float2(0.0f, 1.0f) : norm_row_stats<T, C>(x, r, xv);
#pragma unroll
        for (int j = 0; j < (int)C::CPT; ++j) {
            const u64 c = threadIdx.x + (u64)j * blockDim.x;
            if (c < C::CH) {
                const float g = ld(dy, r * C::CH + c);
                acc[j] += C::BIAS ? g : g * (xv[j] - ms.x) * ms.y;
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

// Batch weight phase 0: the statistics span every sample, so block (c, k) keeps the
// norm_partial of its chunk (samples [k NPB, (k + 1) NPB), elements [k NPB S, ..) of group c)
// at part[4 (k CH + c) ..]; phase 1 merges them (batch_weight_finish).
template <typename T, typename TD, typename C> __device__ __forceinline__ void batch_weight_partial(const T* x, const TD* dy, float* part) {
    const u64 c = blockIdx.x, k = blockIdx.y, len = C::NPB * C::S, e0 = k * len;
    const TD* none = nullptr;
    norm_partial<T, TD, TD, C>(x, dy, none, c, e0, e0 + norm_chunk_len<C>(len, k), part + 4 * (k * C::CH + c));
}

// Batch weight phase 1 for channel c, chunks in order: dw = rstd * sum dy (x - mu)
// (norm_merge).
template <typename C> __device__ __forceinline__ float batch_weight_finish(const float* part, u64 c) {
    const NormMerged r = norm_merge<C>(part + 4 * c, C::CHUNKS, 4 * C::CH, C::NPB * C::S);
    return r.h * rsqrtf(r.var + C::EPS);
}

// Batch/group weight and bias when channels times samples are too few to fill an H100
// (C::SAMPLE_SLICES): block (c, n PSLICES + p) keeps the norm_partial of slice p (C::PLEN
// positions) of sample n of channel c, at slice index e0 / PLEN of its statistics group g,
// whose slices are at part[4 (g PER ..)] in element order (PER = GSIZE / PLEN); for a bias x
// is dy. Phase 1 merges them per channel (sample_slices_finish).
template <typename C> __device__ __forceinline__ void sample_slice(u64 c, u64 n, u64 p, u64& g, u64& e0) {
    if (C::KIND == 2) {
        g = c;
        e0 = n * C::S + p * C::PLEN;
    } else {
        g = n * C::NG + c / C::CPG;
        e0 = (c % C::CPG) * C::S + p * C::PLEN;
    }
}

template <typename T, typename TD, typename C> __device__ __forceinline__ void sample_slices_partial(const T* x, const TD* dy, float* part) {
    constexpr u64 PER = C::GSIZE / C::PLEN;
    u64 g = 0, e0 = 0;
    sample_slice<C>(blockIdx.x, blockIdx.y / C::PSLICES, blockIdx.y % C::PSLICES, g, e0);
    const TD* none = nullptr;
    norm_partial<T, TD, TD, C>(x, dy, none, g, e0, e0 + C::PLEN, part + 4 * (g * PER + e0 / C::PLEN));
}

// Phase 1 for channel c: the batch weight gradient rstd * sum dy (x - mu) from its group's
// merged slices; the group weight gradient sums that per sample, with the sample's group
// statistics merged from all its slices and sum dy (x - mu) from channel c's (fp64); a bias
// sums its slices' sums of dy in order.
template <typename C> __device__ __forceinline__ float sample_slices_finish(const float* part, u64 c) {
    constexpr u64 PER = C::GSIZE / C::PLEN;
    if (C::KIND == 2 && !C::BIAS) {
        const NormMerged r = norm_merge<C>(part + 4 * c * PER, PER, 4, C::PLEN);
        return r.h * rsqrtf(r.var + C::EPS);
    }
    double s = 0.0;
    const u64 samples = C::KIND == 2 ? 1 : C::NB, own = C::KIND == 2 ? PER : C::PSLICES;
    for (u64 n = 0; n < samples; ++n) {
        u64 g = 0, e0 = 0;
        sample_slice<C>(c, n, 0, g, e0);
        const float* q = part + 4 * (g * PER + e0 / C::PLEN);
        if (C::BIAS) {
            for (u64 k = 0; k < own; ++k) s += (double)q[4 * k + 2];
            continue;
        }
        const NormMerged r = norm_merge<C>(part + 4 * g * PER, PER, 4, C::PLEN);
        double h = 0.0;
        for (u64 k = 0; k < own; ++k) h += (double)q[4 * k + 3] + ((double)q[4 * k] - (double)r.mean) * (double)q[4 * k + 2];
        s += h * (double)rsqrtf(r.var + C::EPS);
    }
    return (float)s;
}

// Channel c's weight (or bias) gradient from the partials: the chunks' in order.
template <typename C> __device__ __forceinline__ float norm_param_finish(const float* part, u64 c) {
    if (C::SAMPLE_SLICES) return sample_slices_finish<C>(part, c);
    if (C::KIND == 2 && !C::BIAS) return batch_weight_finish<C>(part, c);
    float s = 0.0f;
    for (u64 k = 0; k < C::CHUNKS; ++k) s += part[k * C::CH + c];
    return s;
}

// norm_backward_param_kernel's count of blocks done (memc_last_block).
static __device__ unsigned norm_param_blocks_done = 0;

// The weight (bias: o_x is dy's offset too) gradient. Phase 1, a thread per channel, sums the
// partials phase 0 wrote; with C::LAST_FINISHES (batch and group norms, whose channels' sums
// are short) there is no phase 1: the grid's last block to finish phase 0 sums them, its
// threads taking every blockDim.x-th channel.
template <typename T, typename TD, typename TW, typename C>
__device__ void norm_backward_param_kernel(char* arena, u64 o_x, u64 o_dy, u64 o_dw, u64 o_ws, u64 phase) {
    float* part = tensor_at<float>(arena, o_ws);
    TW* dw = tensor_at<TW>(arena, o_dw);
    if (phase != 0) {
        const u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x;
        if (c < C::CH) st(dw, c, norm_param_finish<C>(part, c));
        return;
    }
    const T* x = tensor_at<T>(arena, o_x);
    const TD* dy = tensor_at<TD>(arena, o_dy);
    if (C::KIND <= 1) norm_rows_partial<T, TD, C>(x, dy, part);
    else if (C::SAMPLE_SLICES) sample_slices_partial<T, TD, C>(x, dy, part);
    else if (C::KIND == 2 && !C::BIAS) batch_weight_partial<T, TD, C>(x, dy, part);
    else norm_channel_partial<T, TD, C>(x, dy, part);
    if (!C::LAST_FINISHES || !memc_last_block(&norm_param_blocks_done)) return;
    for (u64 c = threadIdx.x; c < C::CH; c += blockDim.x) st(dw, c, norm_param_finish<C>(part, c));
}

// ---- layer/RMS input, weight and bias gradients in one pass, one launch ------------------
// norm_backward_kernel's count of blocks done (memc_last_block).
static __device__ unsigned norm_backward_blocks_done = 0;

// Block k takes rows [k RPB, (k + 1) RPB) as norm_rows_partial does (thread t owns
// channels t + j blockDim.x, j < C::CPT), stores each row's dx (with C::ACC, g + dx as a
// separate rounding) at out[0 ..] and keeps its channels' sums of dy xhat, of dy (C::BIAS)
// and of dx rounded to TS (C::SUM), written to ws[(q CHUNKS + k) CH + c] for the q-th sum
// it keeps (0 the weight's, then the bias's, then the rounded dx's); with C::COPY it also
// stores dx rounded to TS from the byte of out[CP_AT] on. The grid's last block to finish
// (memc_last_block) then sums each over the chunks in order into out[DW_AT + c],
// out[DB_AT + c] and out[DS_AT + c]: the same fixed order whichever block that is.
template <typename T, typename TW, typename TD, typename TG, typename TS, typename C>
__device__ void norm_backward_kernel(char* arena, u64 o_x, u64 o_w, u64 o_dy, u64 o_g, u64 o_out, u64 o_ws) {
    T* out = tensor_at<T>(arena, o_out);
    float* part = tensor_at<float>(arena, o_ws);
    constexpr u64 SQ = C::BIAS ? 2 : 1;
    const T* x = tensor_at<T>(arena, o_x);
    const TW* w = tensor_at<TW>(arena, o_w);
    const TD* dy = tensor_at<TD>(arena, o_dy);
    const TG* acc = tensor_at<TG>(arena, o_g);
    float aw[C::CPT], ab[C::CPT], as[C::CPT];
#pragma unroll
    for (int j = 0; j < (int)C::CPT; ++j) aw[j] = ab[j] = as[j] = 0.0f;
    const u64 r0 = (u64)blockIdx.x * C::RPB, r1 = r0 + C::RPB < C::GROUPS ? r0 + C::RPB : C::GROUPS;
    for (u64 r = r0; r < r1; ++r) {
        float xv[C::CPT], gv[C::CPT];
        const float2 ms = norm_row_stats<T, C>(x, r, xv);
        const float mean = ms.x, rstd = ms.y;
        float sg = 0.0f, sgx = 0.0f;
#pragma unroll
        for (int j = 0; j < (int)C::CPT; ++j) {
            const u64 c = threadIdx.x + (u64)j * blockDim.x;
            xv[j] = (xv[j] - mean) * rstd;
            const float d = c < C::CH ? ld(dy, r * C::CH + c) : 0.0f;
            gv[j] = c < C::CH ? d * ld(w, c) : 0.0f;
            sg += gv[j];
            sgx += gv[j] * xv[j];
            aw[j] += d * xv[j];
            ab[j] += d;
        }
        const float mg = C::KIND == 1 ? 0.0f : block_sum(sg) / (float)C::CH;
        const float mgx = block_sum(sgx) / (float)C::CH;
#pragma unroll
        for (int j = 0; j < (int)C::CPT; ++j) {
            const u64 c = threadIdx.x + (u64)j * blockDim.x;
            if (c < C::CH) {
                const u64 i = r * C::CH + c;
                const float d = rstd * (gv[j] - mg - xv[j] * mgx);
                const float stored = to_f32(from_f32<T>(C::ACC ? __fadd_rn(ld(acc, i), d) : d));
                st(out, i, stored);
                if (C::COPY) st(reinterpret_cast<TS*>(out + C::CP_AT), i, stored);
                if (C::SUM) as[j] += to_f32(from_f32<TS>(stored));
            }
        }
    }
#pragma unroll
    for (int j = 0; j < (int)C::CPT; ++j) {
        const u64 c = threadIdx.x + (u64)j * blockDim.x;
        if (c < C::CH) {
            part[(u64)blockIdx.x * C::CH + c] = aw[j];
            if (C::BIAS) part[(C::CHUNKS + (u64)blockIdx.x) * C::CH + c] = ab[j];
            if (C::SUM) part[(SQ * C::CHUNKS + (u64)blockIdx.x) * C::CH + c] = as[j];
        }
    }
    if (!memc_last_block(&norm_backward_blocks_done)) return;
    // The last block: thread t sums its channels over the chunks in order, all its channels'
    // loads of a chunk at once.
#pragma unroll
    for (int j = 0; j < (int)C::CPT; ++j) aw[j] = ab[j] = as[j] = 0.0f;
    for (u64 k = 0; k < C::CHUNKS; ++k) {
#pragma unroll
        for (int j = 0; j < (int)C::CPT; ++j) {
            const u64 c = threadIdx.x + (u64)j * blockDim.x;
            if (c >= C::CH) continue;
            aw[j] += __ldcg(part + k * C::CH + c);
            if (C::BIAS) ab[j] += __ldcg(part + (C::CHUNKS + k) * C::CH + c);
            if (C::SUM) as[j] += __ldcg(part + (SQ * C::CHUNKS + k) * C::CH + c);
        }
    }
#pragma unroll
    for (int j = 0; j < (int)C::CPT; ++j) {
        const u64 c = threadIdx.x + (u64)j * blockDim.x;
        if (c >= C::CH) continue;
        st(out, C::DW_AT + c, aw[j]);
        if (C::BIAS) st(out, C::DB_AT + c, ab[j]);
        if (C::SUM) st(out, C::DS_AT + c, as[j]);
    }
}
