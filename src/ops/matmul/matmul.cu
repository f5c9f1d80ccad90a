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
