//! Reductions over broadcast dims: sum_to (also the norm bias gradient), max_to and its
//! first-maximum backward. One block per output element, fixed-order tree: deterministic.

// Output element j reduces x over R elements: base offset strided<OUT, OST>(j) plus
// strided<RSH, RST>(r) for r in 0..R. C::MAX selects max (else sum).
template <typename T, typename TO, typename C>
__device__ void reduce_kernel(char* arena, u64 o_x, u64 o_out) {
    const T* x = tensor_at<T>(arena, o_x);
    TO* out = tensor_at<TO>(arena, o_out);
    for (u64 j = blockIdx.x; j < C::N; j += gridDim.x) {
        const u64 base = strided<typename C::OUT, typename C::OST>(j);
        float acc = C::MAX ? MEMC_NEG_INF : 0.0f;
        for (u64 r = threadIdx.x; r < C::R; r += blockDim.x) {
            const float v = ld(x, base + strided<typename C::RSH, typename C::RST>(r));
            acc = C::MAX ? fmaxf(acc, v) : acc + v;
        }
        acc = C::MAX ? block_max(acc) : block_sum(acc);
        if (threadIdx.x == 0) st(out, j, acc);
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
