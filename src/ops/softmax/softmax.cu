//! Softmax and log-softmax along an axis, with their backwards from the forward output.
//! The tensor is viewed as [OUTER, N, INNER]; one block per lane (outer, inner).

template <typename T, typename C> __device__ void softmax_kernel(char* arena, u64 o_x, u64 o_out) {
    const T* x = tensor_at<T>(arena, o_x);
    T* out = tensor_at<T>(arena, o_out);
    for (u64 lane = blockIdx.x; lane < C::OUTER * C::INNER; lane += gridDim.x) {
        const u64 base = (lane / C::INNER) * C::N * C::INNER + lane % C::INNER;
        const float2 lse = block_logsumexp(x, base, C::N, C::INNER);
        const float m = lse.x, l = lse.y;
        for (u64 t = threadIdx.x; t < C::N; t += blockDim.x) {
            const float z = ld(x, base + t * C::INNER) - m - l;
            st(out, base + t * C::INNER, C::LOG ? z : expf(z));
        }
    }
}

// softmax: dx = y * (dy - sum(dy * y)); log-softmax: dx = dy - exp(y) * sum(dy).
template <typename T, typename TD, typename C>
__device__ void softmax_backward_kernel(char* arena, u64 o_y, u64 o_dy, u64 o_dx) {
    const T* y = tensor_at<T>(arena, o_y);
    const TD* dy = tensor_at<TD>(arena, o_dy);
    T* dx = tensor_at<T>(arena, o_dx);
    for (u64 lane = blockIdx.x; lane < C::OUTER * C::INNER; lane += gridDim.x) {
        const u64 base = (lane / C::INNER) * C::N * C::INNER + lane % C::INNER;
        float s = 0.0f;
        for (u64 t = threadIdx.x; t < C::N; t += blockDim.x) {
            const u64 i = base + t * C::INNER;
            s += C::LOG ? ld(dy, i) : ld(dy, i) * ld(y, i);
        }
        s = block_sum(s);
        for (u64 t = threadIdx.x; t < C::N; t += blockDim.x) {
            const u64 i = base + t * C::INNER;
            st(dx, i, C::LOG ? ld(dy, i) - expf(ld(y, i)) * s : ld(y, i) * (ld(dy, i) - s));
        }
    }
}
