//! memc CUDA prelude: element types, fp32 load/store helpers, compile-time shapes and
//! deterministic block reductions shared by every kernel family.
#pragma once
#ifdef __CUDACC_RTC__
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

typedef unsigned long long u64;
#define MEMC_INF __int_as_float(0x7f800000)
#define MEMC_NEG_INF __int_as_float(0xff800000)
#define MEMC_NAN __int_as_float(0x7fffffff)

// ---- element conversion: every kernel computes in fp32 ---------------------------------
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(int v) { return (float)v; }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ int from_f32<int>(float v) { return (int)v; }

// ---- arena addressing: a tensor is a byte offset from the one arena base ---------------
template <typename T> __device__ __forceinline__ T* tensor_at(char* arena, u64 off) {
    return reinterpret_cast<T*>(arena + off);
}
template <typename T> __device__ __forceinline__ float ld(const T* p, u64 i) { return to_f32(p[i]); }
template <typename T> __device__ __forceinline__ void st(T* p, u64 i, float v) { p[i] = from_f32<T>(v); }

// ---- compile-time shapes: Dims<d0, d1, ...>::at(k), constant-folded in unrolled loops ----
template <u64... V> struct Dims {
    static constexpr int rank = sizeof...(V);
    __device__ static __forceinline__ u64 at(int k) {
        const u64 a[] = {V..., 0ull};
        return a[k];
    }
};

// Offset of flat row-major index `i` of `Shape` in a view with per-dim `Strides`
// (stride 0 = broadcast dim).
template <typename Shape, typename Strides> __device__ __forceinline__ u64 strided(u64 i) {
    u64 off = 0;
#pragma unroll
    for (int k = Shape::rank - 1; k >= 0; --k) {
        const u64 d = Shape::at(k);
        off += (i % d) * Strides::at(k);
        i /= d;
    }
    return off;
}

// Grid-stride loop over [0, n).
#define MEMC_GRID_LOOP(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)(n); i += (u64)gridDim.x * blockDim.x)

// ---- deterministic block reductions (fixed tree for a fixed blockDim) -------------------
// Every thread of the block must call these; all threads get the result. blockDim.x is a
// multiple of 32 and at most 1024. A reduction R names its value type T, its operation
// op(v, other) and its identity.
template <typename R> __device__ __forceinline__ typename R::T warp_reduce(typename R::T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = R::op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Each reduction R has its own shared scratch.
template <typename R> __device__ __forceinline__ typename R::T block_reduce(typename R::T v) {
    __shared__ typename R::T memc_red[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_reduce<R>(v);
    __syncthreads();
    if (lane == 0) memc_red[warp] = v;
    __syncthreads();
    v = lane < nw ? memc_red[lane] : R::identity();
    return warp_reduce<R>(v);
}
template <typename V> struct MemcSum {
    typedef V T;
    static __device__ __forceinline__ V op(V v, V other) { return v + other; }
    static __device__ __forceinline__ V identity() { return (V)0; }
};
struct MemcMax {
    typedef float T;
    static __device__ __forceinline__ float op(float v, float other) { return fmaxf(v, other); }
    static __device__ __forceinline__ float identity() { return MEMC_NEG_INF; }
};
struct MemcMinU64 {
    typedef u64 T;
    static __device__ __forceinline__ u64 op(u64 v, u64 other) { return other < v ? other : v; }
    static __device__ __forceinline__ u64 identity() { return ~0ull; }
};
__device__ __forceinline__ float block_sum(float v) { return block_reduce<MemcSum<float>>(v); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<MemcMax>(v); }
__device__ __forceinline__ u64 block_min_u64(u64 v) { return block_reduce<MemcMinU64>(v); }

// ---- two-stage reductions: per-block partials in the workspace, then one fixed-order sum ---
// The finishing block's sum of p[0..n): thread t adds p[t], p[t + blockDim.x], ... in order,
// then the block's fixed tree. Every thread of the block must call it; all get the sum.
template <typename V> __device__ __forceinline__ V sum_partials(const V* p, u64 n) {
    V s = (V)0;
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) s += p[i];
    return block_reduce<MemcSum<V>>(s);
}

// ---- one-launch reductions: the grid's last block sums the others' partials -------------
// Whether this block is the last of its grid to call this: each thread's earlier global
// writes are fenced before the block takes its ticket from `done`, and every thread of the
// last block fences again after it, so that block's later loads see every block's writes.
// `done` counts the blocks done in the current launch: a module global (zeroed when the
// module loads, its 4 bytes within the context reserve) that the last block resets for the
// next launch, so the kernel must never run beside itself (a step's kernels run in order on
// one stream). Every thread of the block must call it, once a launch; all get the same
// answer.
__device__ __forceinline__ bool memc_last_block(unsigned* done) {
    __shared__ unsigned ticket;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) ticket = atomicAdd(done, 1u);
    __syncthreads();
    const bool last = ticket == gridDim.x * gridDim.y * gridDim.z - 1;
    if (last) __threadfence();
    if (last && threadIdx.x == 0) *done = 0;
    return last;
}

// Block-wide log-sum-exp of x[base + t * stride], t < n: returns {max, log(sum exp(x - max))}
// to every thread (all threads of the block must call it).
template <typename T>
__device__ __forceinline__ float2 block_logsumexp(const T* x, u64 base, u64 n, u64 stride) {
    float m = MEMC_NEG_INF;
    for (u64 t = threadIdx.x; t < n; t += blockDim.x) m = fmaxf(m, ld(x, base + t * stride));
    m = block_max(m);
    float s = 0.0f;
    for (u64 t = threadIdx.x; t < n; t += blockDim.x) s += expf(ld(x, base + t * stride) - m);
    return make_float2(m, logf(block_sum(s)));
}
