// Skinny matrix products for decode: c[r, j] = sum_k a[r, k] * w[j, k] for r < m <= 8 rows,
// with the weights w [n,k] row-major (a MatMul with transpose_b) - memory bound on w.
// One warp per output column j (8 columns per 256-thread block); lanes stride k with 16-byte
// loads (4 f32 or 8 bf16); every row keeps its own f32 accumulator; a butterfly adds the lanes.
// The builder guarantees k, lda and ldw are multiples of the vector width and 16-byte aligned
// pointers. Results are f32 (ldc elements between rows of c).

#define KILN_GEMV_MAX_ROWS 8

__device__ __forceinline__ void kiln_gemv_store(float* c, float acc[KILN_GEMV_MAX_ROWS], i64 m,
                                                i64 col, i64 ldc) {
    const int lane = threadIdx.x % KILN_WARP;
#pragma unroll
    for (int r = 0; r < KILN_GEMV_MAX_ROWS; ++r) {
        float total = kiln_warp_sum(acc[r]);
        if (lane == 0 && r < m) c[r * ldc + col] = total;
    }
}

extern "C" __global__ void gemv_f32(float* c, const float* a, const float* w, i64 m, i64 n,
                                    i64 k, i64 lda, i64 ldw, i64 ldc) {
    const int lane = threadIdx.x % KILN_WARP;
    const i64 col = (i64)blockIdx.x * (blockDim.x / KILN_WARP) + threadIdx.x / KILN_WARP;
    if (col >= n) return;  // the whole warp leaves together
    float acc[KILN_GEMV_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < KILN_GEMV_MAX_ROWS; ++r) acc[r] = 0.0f;
    const float4* w_row = (const float4*)(w + col * ldw);
    const i64 k4 = k / 4;
    for (i64 i = lane; i < k4; i += KILN_WARP) {
        const float4 wv = w_row[i];
#pragma unroll
        for (int r = 0; r < KILN_GEMV_MAX_ROWS; ++r) {
            if (r < m) {
                const float4 av = ((const float4*)(a + r * lda))[i];
                acc[r] += wv.x * av.x;
                acc[r] += wv.y * av.y;
                acc[r] += wv.z * av.z;
                acc[r] += wv.w * av.w;
            }
        }
    }
    kiln_gemv_store(c, acc, m, col, ldc);
}

// The two bf16 values of a 32-bit word as f32 (low half first: little-endian element order).
__device__ __forceinline__ float kiln_bf16_low(unsigned int word) {
    return __uint_as_float(word << 16);
}
__device__ __forceinline__ float kiln_bf16_high(unsigned int word) {
    return __uint_as_float(word & 0xffff0000u);
}

__device__ __forceinline__ float kiln_dot_bf16x8(uint4 x, uint4 y, float acc) {
    acc += kiln_bf16_low(x.x) * kiln_bf16_low(y.x);
    acc += kiln_bf16_high(x.x) * kiln_bf16_high(y.x);
    acc += kiln_bf16_low(x.y) * kiln_bf16_low(y.y);
    acc += kiln_bf16_high(x.y) * kiln_bf16_high(y.y);
    acc += kiln_bf16_low(x.z) * kiln_bf16_low(y.z);
    acc += kiln_bf16_high(x.z) * kiln_bf16_high(y.z);
    acc += kiln_bf16_low(x.w) * kiln_bf16_low(y.w);
    acc += kiln_bf16_high(x.w) * kiln_bf16_high(y.w);
    return acc;
}

// a [m,k] and w [n,k] in bf16 (raw bits); c f32.
extern "C" __global__ void gemv_bf16(float* c, const bf16_bits* a, const bf16_bits* w, i64 m,
                                     i64 n, i64 k, i64 lda, i64 ldw, i64 ldc) {
    const int lane = threadIdx.x % KILN_WARP;
    const i64 col = (i64)blockIdx.x * (blockDim.x / KILN_WARP) + threadIdx.x / KILN_WARP;
    if (col >= n) return;  // the whole warp leaves together
    float acc[KILN_GEMV_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < KILN_GEMV_MAX_ROWS; ++r) acc[r] = 0.0f;
    const uint4* w_row = (const uint4*)(w + col * ldw);
    const i64 k8 = k / 8;
    for (i64 i = lane; i < k8; i += KILN_WARP) {
        const uint4 wv = w_row[i];
#pragma unroll
        for (int r = 0; r < KILN_GEMV_MAX_ROWS; ++r) {
            if (r < m) acc[r] = kiln_dot_bf16x8(wv, ((const uint4*)(a + r * lda))[i], acc[r]);
        }
    }
    kiln_gemv_store(c, acc, m, col, ldc);
}
