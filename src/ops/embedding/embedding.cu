//! Embedding lookup and its deterministic scatter-add backward (gather formulation: each
//! output row sums the dy rows of its id in id-list order, so no atomics).

// out[i, d] = table[ids[i], d]; an id outside 0..ROWS yields NaN.
template <typename T, typename C> __device__ void embedding_kernel(char* arena, u64 o_table, u64 o_ids, u64 o_out) {
    const T* table = tensor_at<T>(arena, o_table);
    const int* ids = tensor_at<int>(arena, o_ids);
    T* out = tensor_at<T>(arena, o_out);
    MEMC_GRID_LOOP(i, C::N) {
        const int id = ids[i / C::D];
        const bool ok = id >= 0 && (u64)id < C::ROWS;
        out[i] = ok ? table[(u64)id * C::D + i % C::D] : from_f32<T>(MEMC_NAN);
    }
}

// dtable[r, d] = sum over i with ids[i] == r of dy[i, d]. Grid: (ceil(D / blockDim), ROWS).
template <typename TD, typename T, typename C>
__device__ void embedding_backward_kernel(char* arena, u64 o_ids, u64 o_dy, u64 o_dt) {
    const int* ids = tensor_at<int>(arena, o_ids);
    const TD* dy = tensor_at<TD>(arena, o_dy);
    T* dt = tensor_at<T>(arena, o_dt);
    const u64 d = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (u64 r = blockIdx.y; r < C::ROWS; r += gridDim.y) {
        if (d >= C::D) continue;
        float acc = 0.0f;
        for (u64 i = 0; i < C::NIDS; ++i)
            if ((u64)(long long)ids[i] == r) acc += ld(dy, i * C::D + d);
        st(dt, r * C::D + d, acc);
    }
}
