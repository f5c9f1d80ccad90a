//! Embedding lookup and its deterministic scatter-add backward (each output row sums the dy
//! rows of its id in id-list order, owned by one block, so no atomics).

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

// Exclusive prefix sum of v over the block's threads in thread order; `total` gets the sum
// over the block. Every thread of the block must call it (blockDim.x a multiple of 32).
__device__ __forceinline__ unsigned block_exclusive_scan(unsigned v, unsigned& total) {
    __shared__ unsigned memc_scan[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    unsigned x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) memc_scan[warp] = x;
    __syncthreads();
    unsigned before = 0;
    total = 0;
    for (int w = 0; w < nw; ++w) {
        const unsigned s = memc_scan[w];
        if (w < warp) before += s;
        total += s;
    }
    return before + x - v;
}

// dtable[r, d] = sum over i with ids[i] == r of dy[i, d], added in id-list order from 0 (the
// CPU backend's order: f32 results are bitwise equal); ids outside 0..ROWS and the padding
// row's id C::SKIP (ROWS when there is none) are skipped.
// Each block owns tiles of C::RT rows (grid-stride) and reads every id once per tile: in
// windows of C::BLOCK ids, the ids in its tile are compacted in order into shared memory,
// then their dy rows are added to the tile's accumulators, thread t holding columns
// t + j * BLOCK (j < C::CPT) of every row of the tile in registers. Work: one pass over the
// ids per tile and one over dy in all, with no atomics.
template <typename TD, typename T, typename C>
__device__ void embedding_backward_kernel(char* arena, u64 o_ids, u64 o_dy, u64 o_dt) {
    const int* ids = tensor_at<int>(arena, o_ids);
    const TD* dy = tensor_at<TD>(arena, o_dy);
    T* dt = tensor_at<T>(arena, o_dt);
    __shared__ unsigned hit_at[C::BLOCK];
    __shared__ unsigned hit_row[C::BLOCK];
    for (u64 tile = blockIdx.x; tile < C::TILES; tile += gridDim.x) {
        const u64 r0 = tile * C::RT;
        float acc[C::RT][C::CPT];
#pragma unroll
        for (int q = 0; q < (int)C::RT; ++q)
#pragma unroll
            for (int j = 0; j < (int)C::CPT; ++j) acc[q][j] = 0.0f;
        for (u64 w0 = 0; w0 < C::NIDS; w0 += C::BLOCK) {
            const u64 i = w0 + threadIdx.x;
            const u64 id = i < C::NIDS ? (u64)(long long)ids[i] : C::SKIP;
            const u64 rel = id != C::SKIP ? id - r0 : ~0ull;
            const unsigned hit = rel < C::RT ? 1u : 0u;
            unsigned count;
            const unsigned at = block_exclusive_scan(hit, count);
            if (hit) {
                hit_at[at] = threadIdx.x;
                hit_row[at] = (unsigned)rel;
            }
            __syncthreads();
            for (unsigned h = 0; h < count; ++h) {
                const u64 row = (w0 + hit_at[h]) * C::D;
                const unsigned q0 = hit_row[h];
                float v[C::CPT];
#pragma unroll
                for (int j = 0; j < (int)C::CPT; ++j) {
                    const u64 d = threadIdx.x + (u64)j * C::BLOCK;
                    v[j] = d < C::D ? ld(dy, row + d) : 0.0f;
                }
#pragma unroll
                for (int q = 0; q < (int)C::RT; ++q)
                    if ((unsigned)q == q0)
#pragma unroll
                        for (int j = 0; j < (int)C::CPT; ++j) acc[q][j] += v[j];
            }
            __syncthreads();
        }
#pragma unroll
        for (int q = 0; q < (int)C::RT; ++q) {
            const u64 r = r0 + (u64)q;
#pragma unroll
            for (int j = 0; j < (int)C::CPT; ++j) {
                const u64 d = threadIdx.x + (u64)j * C::BLOCK;
                if (r < C::ROWS && d < C::D) st(dt, r * C::D + d, acc[q][j]);
            }
        }
    }
}
