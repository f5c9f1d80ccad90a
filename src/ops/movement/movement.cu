//! Data movement: strided gathers (reshape, broadcast_to, permute, slice), zero-padding
//! inverse of slice, and concatenation. Elements are copied bit-exactly (no fp32 round trip).

// out[i] = x[C::BASE + strided<OUT, SX>(i)]: reshape (identity strides), broadcast_to
// (stride 0 on broadcast dims), permute (permuted strides) and slice (BASE = start offset).
template <typename T, typename C> __device__ void gather_kernel(char* arena, u64 o_x, u64 o_out) {
    const T* x = tensor_at<T>(arena, o_x);
    T* out = tensor_at<T>(arena, o_out);
    MEMC_GRID_LOOP(i, C::N) out[i] = x[C::BASE + strided<typename C::OUT, typename C::SX>(i)];
}

// Output viewed as [OUTER, FULL, INNER]; x as [OUTER, LEN, INNER] placed at START along the
// middle axis, zeros elsewhere.
template <typename T, typename C> __device__ void pad_slice_kernel(char* arena, u64 o_x, u64 o_out) {
    const T* x = tensor_at<T>(arena, o_x);
    T* out = tensor_at<T>(arena, o_out);
    MEMC_GRID_LOOP(i, C::N) {
        const u64 inner = i % C::INNER, mid = (i / C::INNER) % C::FULL, outer = i / (C::INNER * C::FULL);
        if (mid >= C::START && mid < C::START + C::LEN)
            out[i] = x[(outer * C::LEN + (mid - C::START)) * C::INNER + inner];
        else
            out[i] = from_f32<T>(0.0f);
    }
}

// One part of a concatenation: x viewed as [OUTER, WIDTH] lands at columns AT..AT+WIDTH of
// out viewed as [OUTER, TOTAL]. A concat kernel calls this once per input (disjoint writes).
template <typename T, typename C> __device__ void concat_part(char* arena, u64 o_x, u64 o_out) {
    const T* x = tensor_at<T>(arena, o_x);
    T* out = tensor_at<T>(arena, o_out);
    MEMC_GRID_LOOP(i, C::N) {
        const u64 row = i / C::WIDTH, col = i % C::WIDTH;
        out[row * C::TOTAL + C::AT + col] = x[i];
    }
}
