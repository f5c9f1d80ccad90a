// Dequantize: a packed weight (u8 buffer, layouts in src/ops/quant/pack.rs) to the compute
// precision, one weight per thread of a grid-stride loop. Products and sums are rounded
// separately (__fmul_rn, __fadd_rn: never contracted into an FMA), so the bits equal the CPU
// backend's.

// The NF4 levels by their f32 bits (bitsandbytes' values).
__device__ __forceinline__ float nf4_level(int q) {
    switch (q) {
        case 0: return __int_as_float(0xbf800000);
        case 1: return __int_as_float(0xbf3239b1);
        case 2: return __int_as_float(0xbf066b30);
        case 3: return __int_as_float(0xbeca32a0);
        case 4: return __int_as_float(0xbe91a24d);
        case 5: return __int_as_float(0xbe3d353f);
        case 6: return __int_as_float(0xbdba7871);
        case 7: return 0.0f;
        case 8: return __int_as_float(0x3da2faff);
        case 9: return __int_as_float(0x3e24cae3);
        case 10: return __int_as_float(0x3e7c04dd);
        case 11: return __int_as_float(0x3ead033a);
        case 12: return __int_as_float(0x3ee1a4b8);
        case 13: return __int_as_float(0x3f1007ab);
        case 14: return __int_as_float(0x3f3913b3);
        default: return 1.0f;
    }
}

// int8: out[i] = code[i] * scale[channel(i)]; C: N weights, COLS per row, OUT_AXIS, SCALES
// (byte offset of the f32 scales in the packed buffer).
template <typename TO, typename C> __device__ void dequantize_int8(char* arena, u64 o_in, u64 o_out) {
    const signed char* codes = tensor_at<signed char>(arena, o_in);
    const float* scales = tensor_at<float>(arena, o_in + C::SCALES);
    TO* out = tensor_at<TO>(arena, o_out);
    MEMC_GRID_LOOP(i, C::N) {
        const u64 c = C::OUT_AXIS == 0 ? i / C::COLS : i % C::COLS;
        st(out, i, __fmul_rn((float)codes[i], scales[c]));
    }
}

// nf4: out[i] = NF4[q_i] * (absmax_code[b] * scale[b / 256] + mean), b = i / 64; C: N,
// ABSMAX, SCALES, MEAN (byte offsets of the parts in the packed buffer).
template <typename TO, typename C> __device__ void dequantize_nf4(char* arena, u64 o_in, u64 o_out) {
    const unsigned char* codes = tensor_at<unsigned char>(arena, o_in);
    const signed char* absmax = tensor_at<signed char>(arena, o_in + C::ABSMAX);
    const float* scales = tensor_at<float>(arena, o_in + C::SCALES);
    const float mean = *tensor_at<float>(arena, o_in + C::MEAN);
    TO* out = tensor_at<TO>(arena, o_out);
    MEMC_GRID_LOOP(i, C::N) {
        const u64 b = i / 64;
        const float a = __fadd_rn(__fmul_rn((float)absmax[b], scales[b / 256]), mean);
        const unsigned char byte = codes[i / 2];
        const int q = (i & 1) ? (byte & 15) : (byte >> 4);
        st(out, i, __fmul_rn(nf4_level(q), a));
    }
}
