//! Reductions over broadcast dims: sum_to (also the norm bias gradient), max_to and its
//! first-maximum backward. One block per output element (or per slice of one, then a thread
//! per output over its slices), fixed-order tree: deterministic.

// Output element j reduces x over R elements: base offset strided<OUT, OST>(j) plus
// strided<RSH, RST>(r) for r in 0..R. C::MAX selects max (else sum). With C::SLICES > 1 the
// R elements split into slices of C::SLICE: phase 0 writes slice s of output j to
// part[j * SLICES + s] (a block a slice), phase 1 combines each output's slices in order (a
// thread an output); unsplit, o_ws and phase are unused.
template <typename T, typename TO, typename C>
__device__ void reduce_kernel(char* arena, u64 o_x, u64 o_out, u64 o_ws, u64 phase) {
    const T* x = tensor_at<T>(arena, o_x);
    TO* out = tensor_at<TO>(arena, o_out);
    float* part = tensor_at<float>(arena, o_ws);
    if (C::SLICES > 1 && phase != 0) {
        const u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x;
        if (j >= C::N) return;
        float acc = C::MAX ? MEMC_NEG_INF : 0.0f;
        for (u64 s = 0; s < C::SLICES; ++s) {
            const float v = part[j * C::SLICES + s];
            acc = C::MAX ? fmaxf(acc, v) : acc + v;
        }
        st(out, j, acc);
        return;
    }
    for (u64 k = blockIdx.x; k < C::N * C::SLICES; k += gridDim.x) {
        const u64 j = k / C::SLICES, r0 = (k % C::SLICES) * C::SLICE;
        const u64 r1 = r0 + C::SLICE < C::R ? r0 + C::SLICE : C::R;
        const u64 base = strided<typename C::OUT, typename C::OST>(j);
        float acc = C::MAX ? MEMC_NEG_INF : 0.0f;
        for (u64 r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
            const float v = ld(x, base + strided<typename C::RSH, typename C::RST>(r));
            acc = C::MAX ? fmaxf(acc, v) : acc + v;
        }
        acc = C::MAX ? block_max(acc) : block_sum(acc);
        if (threadIdx.x == 0) {
            if (C::SLICES > 1) part[k] = acc;
            else st(out, j, acc);
        }
    }
}

// (x, y, dy) -> dx: within each group (as in reduce_kernel), dy[j] goes to the first element
// (row-major) equal to y[j]; every other element of dx is 0.
template <typename T, typename TY, typename TD, typename C>
__device__ void max_to_backward_kernel(char* arena, u64 o_x, u64 o_y, u64 o_dy, u64 o_dx) {
    const T* x = tensor_at<T>(arena, o_x);
    const TY* y = tensor_at<TY>(arena, o_y);
    const TD* dy = tensor_at<TD>(arena, o_dy);
    T* dx = tensor_at<T>(arena, o_dx);
    for (u64 j = blockIdx.x; j < C::N; j += gridDim.x) {
        const u64 base = strided<typename C::OUT, typename C::OST>(j);
        const float m = ld(y, j);
        u64 first = ~0ull;
        for (u64 r = threadIdx.x; r < C::R; r += blockDim.x) {
            if (ld(x, base + strided<typename C::RSH, typename C::RST>(r)) == m && r < first) first = r;
        }
        first = block_min_u64(first);
        const float g = ld(dy, j);
        for (u64 r = threadIdx.x; r < C::R; r += blockDim.x)
            st(dx, base + strided<typename C::RSH, typename C::RST>(r), r == first ? g : 0.0f);
    }
}
