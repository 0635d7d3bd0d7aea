// Copies: a strided view materialized row-major (rank <= 6, elements of 2, 4 or 8 bytes, moved
// as raw bits, or f32 rounded to bf16 as copied), and f32 <-> bf16 casts (round to nearest
// even, NaN kept as NaN).

// Where the strided copy puts element `i`: the bits as they are, f32 rounded to bf16, or both
// (the f32 value and its rounding, mixed precision's gradient read both ways).
template <typename T> struct KilnStoreBits {
    T* dst;
    __device__ void operator()(i64 i, T v) const { dst[i] = v; }
};
struct KilnStoreRounded {
    bf16_bits* dst;
    __device__ void operator()(i64 i, float v) const { dst[i] = kiln_f32_to_bf16(v); }
};
struct KilnStoreBoth {
    float* dst;
    bf16_bits* rounded;
    __device__ void operator()(i64 i, float v) const {
        dst[i] = v;
        rounded[i] = kiln_f32_to_bf16(v);
    }
};

// dims/strides are padded at the front to rank 6 (dim 1, stride 0); strides in elements;
// src points at the view's first element.
template <typename S, typename Store>
__device__ void kiln_strided_copy(const S* src, i64 n, const i64 dims[6], const i64 strides[6],
                                  Store store) {
    KILN_FOR_EACH(index, n) {
        i64 rest = index;
        i64 offset = 0;
        for (int axis = 5; axis > 0; --axis) {
            offset += (rest % dims[axis]) * strides[axis];
            rest /= dims[axis];
        }
        offset += rest * strides[0];
        store(index, src[offset]);
    }
}

#define KILN_STRIDED_CALL(src, store)                                                        \
    const i64 dims[6] = {d0, d1, d2, d3, d4, d5};                                            \
    const i64 strides[6] = {s0, s1, s2, s3, s4, s5};                                         \
    kiln_strided_copy(src, n, dims, strides, store)

extern "C" __global__ void strided_copy_b16(unsigned short* dst, const unsigned short* src,
                                            i64 n, i64 d0, i64 d1, i64 d2, i64 d3, i64 d4,
                                            i64 d5, i64 s0, i64 s1, i64 s2, i64 s3, i64 s4,
                                            i64 s5) {
    kiln_grid_dependency_wait();
    KILN_STRIDED_CALL(src, KilnStoreBits<unsigned short>{dst});
}

extern "C" __global__ void strided_copy_b32(unsigned int* dst, const unsigned int* src, i64 n,
                                            i64 d0, i64 d1, i64 d2, i64 d3, i64 d4, i64 d5,
                                            i64 s0, i64 s1, i64 s2, i64 s3, i64 s4, i64 s5) {
    kiln_grid_dependency_wait();
    KILN_STRIDED_CALL(src, KilnStoreBits<unsigned int>{dst});
}

extern "C" __global__ void strided_copy_b64(unsigned long long* dst,
                                            const unsigned long long* src, i64 n, i64 d0,
                                            i64 d1, i64 d2, i64 d3, i64 d4, i64 d5, i64 s0,
                                            i64 s1, i64 s2, i64 s3, i64 s4, i64 s5) {
    kiln_grid_dependency_wait();
    KILN_STRIDED_CALL(src, KilnStoreBits<unsigned long long>{dst});
}

extern "C" __global__ void strided_round_f32_to_bf16(bf16_bits* dst, const float* src, i64 n,
                                                     i64 d0, i64 d1, i64 d2, i64 d3, i64 d4,
                                                     i64 d5, i64 s0, i64 s1, i64 s2, i64 s3,
                                                     i64 s4, i64 s5) {
    kiln_grid_dependency_wait();
    KILN_STRIDED_CALL(src, KilnStoreRounded{dst});
}

extern "C" __global__ void strided_copy_f32_and_bf16(float* dst, bf16_bits* rounded,
                                                     const float* src, i64 n, i64 d0, i64 d1,
                                                     i64 d2, i64 d3, i64 d4, i64 d5, i64 s0,
                                                     i64 s1, i64 s2, i64 s3, i64 s4, i64 s5) {
    kiln_grid_dependency_wait();
    KILN_STRIDED_CALL(src, (KilnStoreBoth{dst, rounded}));
}

extern "C" __global__ void cast_f32_to_bf16(bf16_bits* dst, const float* src, i64 n) {
    kiln_grid_dependency_wait();
    KILN_FOR_EACH(i, n) { dst[i] = kiln_f32_to_bf16(src[i]); }
}

extern "C" __global__ void cast_bf16_to_f32(float* dst, const bf16_bits* src, i64 n) {
    kiln_grid_dependency_wait();
    KILN_FOR_EACH(i, n) { dst[i] = kiln_bf16_to_f32(src[i]); }
}

// Four elements per thread (n4 = n / 4): 16-byte f32 and 8-byte bf16 accesses, element 0 in
// the low bits (little endian), the same rounding as the scalar kernels.
extern "C" __global__ void cast_f32_to_bf16_vec4(uint2* dst, const float4* src, i64 n4) {
    kiln_grid_dependency_wait();
    KILN_FOR_EACH(i, n4) { kiln_store4(dst, i, src[i]); }
}

extern "C" __global__ void cast_bf16_to_f32_vec4(float4* dst, const uint2* src, i64 n4) {
    kiln_grid_dependency_wait();
    KILN_FOR_EACH(i, n4) {
        const uint2 v = src[i];
        dst[i] = make_float4(kiln_bf16_to_f32((bf16_bits)(v.x & 0xffffu)),
                             kiln_bf16_to_f32((bf16_bits)(v.x >> 16)),
                             kiln_bf16_to_f32((bf16_bits)(v.y & 0xffffu)),
                             kiln_bf16_to_f32((bf16_bits)(v.y >> 16)));
    }
}
