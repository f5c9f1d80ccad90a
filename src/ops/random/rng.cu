//! Counter-based RNG (splitmix64 hash of seed, step, index; identical to memc's CPU
//! kmisc::rng) and inverted dropout, whose backward is the same kernel on dy.

__device__ __forceinline__ u64 memc_mix(u64 z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
__device__ __forceinline__ u64 memc_hash(u64 seed, u64 step, u64 index, u64 lane) {
    return memc_mix(memc_mix(memc_mix(memc_mix(seed) ^ step) ^ index) ^ lane);
}
// 24 random bits as a float in [0, 1), exactly as the CPU `uniform01`.
__device__ __forceinline__ float memc_uniform01(u64 seed, u64 step, u64 index) {
    return (float)(memc_hash(seed, step, index, 0) >> 40) * (1.0f / 16777216.0f);
}

// 32 random bits, exactly as the CPU `bits`.
__device__ __forceinline__ unsigned memc_bits(u64 seed, u64 step, u64 index) {
    return (unsigned)(memc_hash(seed, step, index, 3) >> 32);
}

// out[i] = x[i] / (1 - P) if uniform01(SEED, step, i) >= P, else 0.
template <typename T, typename C> __device__ void dropout_kernel(char* arena, u64 o_x, u64 o_out, u64 step) {
    const T* x = tensor_at<T>(arena, o_x);
    T* out = tensor_at<T>(arena, o_out);
    const float scale = 1.0f / (1.0f - C::P);
    MEMC_GRID_LOOP(i, C::N) {
        const bool keep = memc_uniform01(C::SEED, step, i) >= C::P;
        st(out, i, keep ? ld(x, i) * scale : 0.0f);
    }
}
