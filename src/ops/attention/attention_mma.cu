//! FlashAttention-2's forward on tensor cores for 16-bit q/k/v (after `attention.cu`, whose
//! mask, cap and addressing helpers it shares): one block of four warps per 64 query rows of
//! one head, each warp owning 16 rows. Key/value tiles of C::BK keys stream through shared
//! memory; per tile a warp computes its 16 x BK scores with `mma.sync.m16n8k16` (fp32
//! accumulators), scales, caps and masks them, updates its rows' running maximum and sum
//! (online softmax, fp32, in registers), rescales its 16 x DH output accumulators and adds
//! P V, P rounded to the operands' type as the A operand of the same MMA. The sum uses the
//! fp32 probabilities. A warp skips the tiles none of its rows sees; a query with no visible
//! key outputs zeros. C::DH is a multiple of 16, at most 128.

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

// Grid: (ceil(TQ / 64), H, B), 128 threads. `o_mask` is read only with C::KEY_MASK.
template <typename T, typename C> __device__ void attention_mma_kernel(char* arena, u64 o_q, u64 o_k, u64 o_v, u64 o_mask, u64 o_out) {
    constexpr int DH = (int)C::DH, BK = (int)C::BK, LD = DH + 8;
    constexpr int KS = DH / 16, NT = DH / 8, ST = BK / 8, PK = BK / 16;
    const T* q = tensor_at<T>(arena, o_q);
    const T* k = tensor_at<T>(arena, o_k);
    const T* v = tensor_at<T>(arena, o_v);
    T* out = tensor_at<T>(arena, o_out);
    __shared__ T Ks[BK * LD];
    __shared__ T Vs[BK * LD];
    __shared__ bool Ms[BK];
    const u64 b = blockIdx.z, h = blockIdx.y, kh = h / (C::H / C::KVH);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const u64 i0 = (u64)blockIdx.x * 64, w0 = i0 + 16 * warp;
    const u64 rows[2] = {w0 + g, w0 + g + 8};
    u64 kfirst[2], kend[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        kend[r] = rows[r] < C::TQ ? attn_kend<C>(rows[r]) : 0;
        kfirst[r] = rows[r] < C::TQ ? attn_kfirst<C>(rows[r]) : 0;
    }
    // The keys the block's rows, and this warp's rows, see.
    const u64 last = (i0 + 63 < C::TQ) ? i0 + 63 : C::TQ - 1;
    const u64 kmin = attn_kfirst<C>(i0), kmax = attn_kend<C>(last);
    const bool warp_live = w0 < C::TQ;
    const u64 wlast = (w0 + 15 < C::TQ) ? w0 + 15 : C::TQ - 1;
    const u64 wmin = warp_live ? attn_kfirst<C>(w0) : 0, wmax = warp_live ? attn_kend<C>(wlast) : 0;
    unsigned qa[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int reg = 0; reg < 4; ++reg) {
            const u64 row = rows[reg & 1];
            const u64 col = ks * 16 + 2 * t + ((reg & 2) ? 8 : 0);
            const u64 at = attn_q<C>(b, row, h) + col;
            qa[ks][reg] = row < C::TQ ? mma_pack<T>(q[at], q[at + 1]) : 0u;
        }
    float o[NT][4], m[2] = {MEMC_NEG_INF, MEMC_NEG_INF}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) o[nt][c] = 0.0f;
    for (u64 j0 = kmin; j0 < kmax; j0 += BK) {
        const T zero = from_f32<T>(0.0f);
        for (u64 e = threadIdx.x; e < (u64)BK * DH; e += blockDim.x) {
            const u64 jj = e / DH, d = e % DH, j = j0 + jj;
            Ks[jj * LD + d] = j < C::TK ? k[attn_kv<C>(b, j, kh) + d] : zero;
            Vs[jj * LD + d] = j < C::TK ? v[attn_kv<C>(b, j, kh) + d] : zero;
        }
        for (u64 jj = threadIdx.x; jj < (u64)BK; jj += blockDim.x) Ms[jj] = j0 + jj < C::TK && attn_key_kept<C>(arena, o_mask, b, j0 + jj);
        __syncthreads();
        if (j0 < wmax && j0 + BK > wmin) {
            float s[ST][4];
#pragma unroll
            for (int nt = 0; nt < ST; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) s[nt][c] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ++ks)
#pragma unroll
                for (int nt = 0; nt < ST; ++nt) {
                    const T* kr = &Ks[(nt * 8 + g) * LD + ks * 16 + 2 * t];
                    const unsigned kb[2] = {mma_pack<T>(kr[0], kr[1]), mma_pack<T>(kr[8], kr[9])};
                    mma_16816<T>(s[nt], qa[ks], kb);
                }
            // Scale, cap and mask; each row's maximum over the quad of lanes holding it.
            float mx[2] = {m[0], m[1]};
#pragma unroll
            for (int nt = 0; nt < ST; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int r = c >> 1;
                    const u64 jj = nt * 8 + 2 * t + (c & 1), j = j0 + jj;
                    const bool seen = Ms[jj] && j >= kfirst[r] && j < kend[r];
                    s[nt][c] = seen ? attn_cap<C>(s[nt][c] * C::SCALE) : MEMC_NEG_INF;
                    mx[r] = fmaxf(mx[r], s[nt][c]);
                }
            float corr[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                corr[r] = mx[r] == MEMC_NEG_INF ? 1.0f : expf(m[r] - mx[r]);
                m[r] = mx[r];
                l[r] *= corr[r];
            }
#pragma unroll
            for (int nt = 0; nt < ST; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int r = c >> 1;
                    s[nt][c] = s[nt][c] == MEMC_NEG_INF ? 0.0f : expf(s[nt][c] - m[r]);
                    l[r] += s[nt][c];
                }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) o[nt][c] *= corr[c >> 1];
            // O += P V: the probabilities of 16 keys are the A operand as they lie.
#pragma unroll
            for (int kk = 0; kk < PK; ++kk) {
                const unsigned pa[4] = {
                    mma_pack_f32<T>(s[2 * kk][0], s[2 * kk][1]),
                    mma_pack_f32<T>(s[2 * kk][2], s[2 * kk][3]),
                    mma_pack_f32<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                    mma_pack_f32<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]),
                };
                const T* vr = &Vs[(kk * 16 + 2 * t) * LD + g];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const unsigned vb[2] = {
                        mma_pack<T>(vr[nt * 8], vr[LD + nt * 8]),
                        mma_pack<T>(vr[8 * LD + nt * 8], vr[9 * LD + nt * 8]),
                    };
                    mma_16816<T>(o[nt], pa, vb);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int r = c >> 1;
            if (rows[r] < C::TQ) {
                const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
                st(out, attn_q<C>(b, rows[r], h) + nt * 8 + 2 * t + (c & 1), o[nt][c] * inv);
            }
        }
}

// Without a key mask: the entry takes no mask offset.
template <typename T, typename C> __device__ void attention_mma_kernel(char* arena, u64 o_q, u64 o_k, u64 o_v, u64 o_out) {
    attention_mma_kernel<T, C>(arena, o_q, o_k, o_v, 0, o_out);
}
