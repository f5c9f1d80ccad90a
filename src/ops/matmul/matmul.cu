//! Tiled shared-memory GEMM with fp32 accumulation, shared by matmul and the implicit-GEMM
//! convolutions. `gemm_tiled` computes, for each batch z (blockIdx.z), C[m, n] = sum_k
//! A(z, m, k) B(z, k, n) through an IO object that loads A and B elements as fp32 (0 outside
//! the operand) and stores C. Tiles: 64 x 64 outputs per 256-thread block, 4 x 4 per thread,
//! K in steps of 16.

#define GEMM_BM 64
#define GEMM_BN 64
#define GEMM_BK 16
#define GEMM_THREADS 256

template <typename IO> __device__ __forceinline__ void gemm_tiled(const IO& io, u64 M, u64 N, u64 K) {
    __shared__ float As[GEMM_BK][GEMM_BM + 4];
    __shared__ float Bs[GEMM_BK][GEMM_BN + 4];
    const u64 z = blockIdx.z;
    const u64 m0 = (u64)blockIdx.y * GEMM_BM, n0 = (u64)blockIdx.x * GEMM_BN;
    const int tid = threadIdx.x, tm = tid / 16, tn = tid % 16;
    float acc[4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] = 0.0f;
    for (u64 k0 = 0; k0 < K; k0 += GEMM_BK) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int e = tid + r * GEMM_THREADS;  // 0..1023 over a 16 x 64 tile
            const int kk = e / GEMM_BM, mm = e % GEMM_BM;
            const u64 gm = m0 + mm, gk = k0 + kk;
            As[kk][mm] = (gm < M && gk < K) ? io.a(z, gm, gk) : 0.0f;
            const int nn = e % GEMM_BN;
            const u64 gn = n0 + nn;
            Bs[kk][nn] = (gn < N && gk < K) ? io.b(z, gk, gn) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; ++kk) {
            float av[4], bv[4];
#pragma unroll
            for (int a = 0; a < 4; ++a) av[a] = As[kk][tm + 16 * a];
#pragma unroll
            for (int b = 0; b < 4; ++b) bv[b] = Bs[kk][tn + 16 * b];
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int b = 0; b < 4; ++b) acc[a][b] = fmaf(av[a], bv[b], acc[a][b]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const u64 gm = m0 + tm + 16 * a, gn = n0 + tn + 16 * b;
            if (gm < M && gn < N) io.store(z, gm, gn, acc[a][b]);
        }
}

// Batched matmul: out[z] = op(A[za]) @ op(B[zb]) with numpy-broadcast batch dims. C::BATCH is
// the output batch shape, C::SA / C::SB the matrix strides (in matrices) of A and B at that
// shape (0 on broadcast dims); TA/TB read the stored [K, M] / [N, K] operands transposed.
// Operands are T, the output TO (T, or float for a matmul storing its fp32 accumulator).
template <typename T, typename TO, typename C> struct MatmulIO {
    const T* A;
    const T* B;
    TO* O;
    __device__ float a(u64 z, u64 m, u64 k) const {
        const u64 base = strided<typename C::BATCH, typename C::SA>(z) * (C::M * C::K);
        return ld(A, base + (C::TA ? k * C::M + m : m * C::K + k));
    }
    __device__ float b(u64 z, u64 k, u64 n) const {
        const u64 base = strided<typename C::BATCH, typename C::SB>(z) * (C::K * C::N);
        return ld(B, base + (C::TB ? n * C::K + k : k * C::N + n));
    }
    __device__ void store(u64 z, u64 m, u64 n, float v) const { st(O, z * (C::M * C::N) + m * C::N + n, v); }
};

template <typename T, typename TO, typename C> __device__ void matmul_kernel(char* arena, u64 o_a, u64 o_b, u64 o_out) {
    MatmulIO<T, TO, C> io{tensor_at<T>(arena, o_a), tensor_at<T>(arena, o_b), tensor_at<TO>(arena, o_out)};
    gemm_tiled(io, C::M, C::N, C::K);
}
