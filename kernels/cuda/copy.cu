// Copies: a strided view materialized row-major (rank <= 6, elements of 2, 4 or 8 bytes, moved
// as raw bits), and f32 <-> bf16 casts (round to nearest even, NaN kept as NaN).

// dims/strides are padded at the front to rank 6 (dim 1, stride 0); strides in elements;
// src points at the view's first element.
#define KILN_STRIDED_COPY(name, T)                                                            \
    extern "C" __global__ void name(T* dst, const T* src, i64 n, i64 d0, i64 d1, i64 d2,       \
                                    i64 d3, i64 d4, i64 d5, i64 s0, i64 s1, i64 s2, i64 s3,    \
                                    i64 s4, i64 s5) {                                          \
        KILN_FOR_EACH(index, n) {                                                              \
            i64 rest = index;                                                                  \
            i64 offset = (rest % d5) * s5;                                                     \
            rest /= d5;                                                                        \
            offset += (rest % d4) * s4;                                                        \
            rest /= d4;                                                                        \
            offset += (rest % d3) * s3;                                                        \
            rest /= d3;                                                                        \
            offset += (rest % d2) * s2;                                                        \
            rest /= d2;                                                                        \
            offset += (rest % d1) * s1;                                                        \
            rest /= d1;                                                                        \
            offset += rest * s0;                                                               \
            dst[index] = src[offset];                                                          \
        }                                                                                      \
    }

KILN_STRIDED_COPY(strided_copy_b16, unsigned short)
KILN_STRIDED_COPY(strided_copy_b32, unsigned int)
KILN_STRIDED_COPY(strided_copy_b64, unsigned long long)

extern "C" __global__ void cast_f32_to_bf16(bf16_bits* dst, const float* src, i64 n) {
    KILN_FOR_EACH(i, n) { dst[i] = kiln_f32_to_bf16(src[i]); }
}

extern "C" __global__ void cast_bf16_to_f32(float* dst, const bf16_bits* src, i64 n) {
    KILN_FOR_EACH(i, n) { dst[i] = kiln_bf16_to_f32(src[i]); }
}
