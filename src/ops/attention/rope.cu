//! Rotary position embedding (rotate-half convention) over x = [B, T, HEADS * HD]: pair
//! (i, i + HD/2) of each head at position t rotates by t * BASE^(-2i/HD) (angle in fp64,
//! rotation in fp32); INVERSE rotates back (the exact backward).

template <typename T, typename C> __device__ void rope_kernel(char* arena, u64 o_x, u64 o_out) {
    const T* x = tensor_at<T>(arena, o_x);
    T* out = tensor_at<T>(arena, o_out);
    constexpr u64 HALF = C::HD / 2, WIDTH = C::HEADS * C::HD;
    // one thread per (row, head, i < HALF) pair
    MEMC_GRID_LOOP(j, C::ROWS * C::HEADS * HALF) {
        const u64 i = j % HALF, h = (j / HALF) % C::HEADS, row = j / (HALF * C::HEADS);
        const double pos = (double)(row % C::T);
        const double freq = pow((double)C::BASE, -2.0 * (double)i / (double)C::HD);
        double sd, cd;
        sincos(pos * freq, &sd, &cd);
        const float s = (float)(C::INVERSE ? -sd : sd), c = (float)cd;
        const u64 lo = row * WIDTH + h * C::HD + i, hi = lo + HALF;
        const float a = ld(x, lo), b = ld(x, hi);
        st(out, lo, a * c - b * s);
        st(out, hi, b * c + a * s);
    }
}
