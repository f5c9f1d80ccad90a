//! Tensor-core helpers of attention's MMA kernels (after `attention.cu`): the
//! `mma.sync.m16n8k16` primitive over 16-bit operands with fp32 accumulators, and the
//! fragment loads the kernels share. A warp multiplies a 16-row operand held in registers
//! (`mma_load_rows`, or scores reused in place by `mma_pack_scores`) by tiles of rows of a
//! shared-memory array `X[row * LD + d]` read either as `X^T` (`mma_b_t`: the product with
//! the rows' transposes, as in `Q K^T`) or as `X` (`mma_b`: as in `P V`).

// mma.sync.m16n8k16's fragments, lane = 4 * g + t: A (16 x 16, row-major) regs a0..a3 hold
// rows g, g+8, g, g+8 at columns 2t, 2t+1 (a0, a1) and 2t+8, 2t+9 (a2, a3), two 16-bit values
// a register, the lower column in the low half; B (16 x 8, k x n) regs b0, b1 hold rows
// 2t, 2t+1 and 2t+8, 2t+9 of column g; the fp32 accumulators d0..d3 hold (g, 2t), (g, 2t+1),
// (g+8, 2t), (g+8, 2t+1).
__device__ __forceinline__ unsigned short mma_bits(__half v) { return __half_as_ushort(v); }
__device__ __forceinline__ unsigned short mma_bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
// Two 16-bit values as one MMA register, `lo` in the low half.
template <typename T> __device__ __forceinline__ unsigned mma_pack(T lo, T hi) {
    return (unsigned)mma_bits(lo) | ((unsigned)mma_bits(hi) << 16);
}
template <typename T> __device__ __forceinline__ unsigned mma_pack_f32(float lo, float hi) {
    return mma_pack<T>(from_f32<T>(lo), from_f32<T>(hi));
}
// d += a b over one m16n8k16 tile (every lane of the warp calls it).
template <typename T> __device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]);
#ifdef __CUDACC_RTC__
template <> __device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#else
template <> inline void mma_16816<__nv_bfloat16>(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    memc_sim::mma_16816<__nv_bfloat16>(d, a, b);
}
template <> inline void mma_16816<__half>(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    memc_sim::mma_16816<__half>(d, a, b);
}
#endif

// Registers of a 16 x (16 KS) row-major A operand from rows at element offsets `at0` (row g)
// and `at1` (row g + 8) of `x`; a row that is not `ok` reads zeros.
template <typename T, int KS>
__device__ __forceinline__ void mma_load_rows(unsigned (&a)[KS][4], const T* x, u64 at0, bool ok0, u64 at1, bool ok1) {
    const int t = (threadIdx.x & 31) & 3;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int reg = 0; reg < 4; ++reg) {
            const bool hi = reg & 1;
            const u64 at = (hi ? at1 : at0) + ks * 16 + 2 * t + ((reg & 2) ? 8 : 0);
            a[ks][reg] = (hi ? ok1 : ok0) ? mma_pack<T>(x[at], x[at + 1]) : 0u;
        }
}
// B registers of `X^T` for the k-step `ks` and the 8 rows from `r0` of a shared array with
// row stride LD: B(k, n) = X[(r0 + n) * LD + 16 ks + k].
template <typename T, int LD> __device__ __forceinline__ void mma_b_t(unsigned (&b)[2], const T* X, int r0, int ks) {
    const int lane = threadIdx.x & 31;
    const T* p = &X[(r0 + (lane >> 2)) * LD + ks * 16 + 2 * (lane & 3)];
    b[0] = mma_pack<T>(p[0], p[1]);
    b[1] = mma_pack<T>(p[8], p[9]);
}
// B registers of `X` for the 16 rows from `r0` and the 8 columns from `c0`: B(k, n) =
// X[(r0 + k) * LD + c0 + n].
template <typename T, int LD> __device__ __forceinline__ void mma_b(unsigned (&b)[2], const T* X, int r0, int c0) {
    const int lane = threadIdx.x & 31;
    const T* p = &X[(r0 + 2 * (lane & 3)) * LD + c0 + (lane >> 2)];
    b[0] = mma_pack<T>(p[0], p[LD]);
    b[1] = mma_pack<T>(p[8 * LD], p[9 * LD]);
}
// The A registers of columns 16 kk .. 16 kk + 15 of fp32 accumulator tiles `s` (8 columns a
// tile), rounded to T: a tile's accumulators lie as the A operand's.
template <typename T, int ST> __device__ __forceinline__ void mma_pack_scores(unsigned (&a)[4], const float (&s)[ST][4], int kk) {
    a[0] = mma_pack_f32<T>(s[2 * kk][0], s[2 * kk][1]);
    a[1] = mma_pack_f32<T>(s[2 * kk][2], s[2 * kk][3]);
    a[2] = mma_pack_f32<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = mma_pack_f32<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}
// mma_pack_scores's A registers split in two: `hi`, the scores rounded to T, and `lo`, what
// that rounding left, rounded to T; hi + lo carries about twice T's significant bits, so two
// MMAs by the same B give the product of the fp32 scores almost as fp32 would.
template <typename T, int ST>
__device__ __forceinline__ void mma_split_scores(unsigned (&hi)[4], unsigned (&lo)[4], const float (&s)[ST][4], int kk) {
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {
        const float* pair = &s[2 * kk + (reg >> 1)][2 * (reg & 1)];
        const T h0 = from_f32<T>(pair[0]), h1 = from_f32<T>(pair[1]);
        hi[reg] = mma_pack<T>(h0, h1);
        lo[reg] = mma_pack_f32<T>(pair[0] - to_f32(h0), pair[1] - to_f32(h1));
    }
}
// acc (16 x 8 NT) += S X for the warp's fp32 scores S (16 x 8 ST, as accumulator tiles,
// rounded to T as the A operand) and the shared array X (8 ST rows, row stride LD).
template <typename T, int ST, int NT, int LD>
__device__ __forceinline__ void mma_add_scores_times(float (&acc)[NT][4], const float (&s)[ST][4], const T* X) {
#pragma unroll
    for (int kk = 0; kk < ST / 2; ++kk) {
        unsigned sa[4];
        mma_pack_scores<T, ST>(sa, s, kk);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            unsigned xb[2];
            mma_b<T, LD>(xb, X, kk * 16, nt * 8);
            mma_16816<T>(acc[nt], sa, xb);
        }
    }
}
// Zeroes `n` accumulator tiles.
template <int N> __device__ __forceinline__ void mma_zero(float (&acc)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][c] = 0.0f;
}
// acc (16 x 8 ST) = A X^T for the warp's 16-row operand A (16 KS columns, in registers) and
// the 8 ST rows of the shared array X (row stride LD): as in Q K^T.
template <typename T, int KS, int ST, int LD>
__device__ __forceinline__ void mma_rows_times_t(float (&acc)[ST][4], const unsigned (&a)[KS][4], const T* X) {
    mma_zero<ST>(acc);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int nt = 0; nt < ST; ++nt) {
            unsigned xb[2];
            mma_b_t<T, LD>(xb, X, nt * 8, ks);
            mma_16816<T>(acc[nt], a[ks], xb);
        }
}
// Each of the lane's two rows' value summed (or, with `max`, maximized) over the quad of
// lanes holding that row's columns.
__device__ __forceinline__ float mma_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float mma_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
