// Tensor-core helpers shared by the modules that multiply on tensor cores (linear_mma.cu;
// flash.cu and flash_backward.cu), and every other inline-PTX primitive those modules use: one
// m16n8k16 bf16 (or f16) mma.sync with f32 accumulation, ldmatrix (.x4, plain and .trans),
// cp.async (16 and 4 bytes, with its commit and wait), the bf16x2 and f16x2 conversions and
// ex2.approx; and the packing of two f32 into one bf16x2 (or f16x2) fragment word (f16's
// conversions are common.cuh's).
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type";
// g = lane / 4, t = lane % 4): A (16 x 16, row-major) a0 = row g, cols 2t, 2t+1; a1 = row g+8,
// same cols; a2 = row g, cols 2t+8, 2t+9; a3 = row g+8, cols 2t+8, 2t+9. B (16 x 8) b0 = k rows
// 2t, 2t+1 of col g; b1 = k rows 2t+8, 2t+9. C/D (16 x 8 f32) c0, c1 = row g, cols 2t, 2t+1;
// c2, c3 = row g+8, same cols. Each word holds its lower index in its low half.
//
// Two paths behind one interface. NVRTC by default: the inline PTX (sm_80+, NVIDIA only).
// The portable path, under KILN_MMA_EMULATED: hipRTC (__HIPCC_RTC__, where no PTX exists), or
// NVRTC with KILN_PORTABLE_MMA defined (portable_mma.cuh prepended), so that the emulation runs
// and is checked on NVIDIA against the CPU reference. It emulates each primitive in plain code
// on the ordinary ALUs, far slower than tensor cores: a path for correctness, not speed. It
// keeps the fragments (every lane ends up with the words the hardware would give it, so the
// kernels' index math is the same on both paths), moves words only within each group of 32
// lanes (kiln_shfl: a 64-lane AMD wavefront is two independent groups), and sums each mma's
// products in f32 in a fixed k order: results within f32 rounding of the hardware mma, not
// bit-identical to it (whose internal order and precision are its own). cp.async becomes a
// synchronous copy, which is one of the schedules the asynchronous copy allows, so the
// kernels' wait + __syncthreads still order every copy before its reads. Its lane is
// threadIdx.x % 32: the kernels launch 1-D blocks of whole groups, and every lane of a group
// calls each primitive together (as .sync.aligned already requires of the PTX).

#if defined(__HIPCC_RTC__) || defined(KILN_PORTABLE_MMA)
#define KILN_MMA_EMULATED 1
#endif

// A 16-bit float of a fragment word as f32: bf16, or f16 (F16).
template <bool F16> __device__ __forceinline__ float kiln_mma_widen(unsigned int bits) {
    if constexpr (F16) {
        return kiln_f16_to_f32((unsigned short)(bits & 0xffffu));
    } else {
        return kiln_bf16_to_f32((bf16_bits)(bits & 0xffffu));
    }
}

// d += A * B for one m16n8k16 (bf16 in, or f16 in with F16; f32 accumulate), A and B as their
// fragment registers. Emulated: lane (g, t) computes its c0..c3 = (row g, col 2t), (g, 2t+1),
// (g+8, 2t), (g+8, 2t+1). It needs A rows g and g+8 and B cols 2t and 2t+1 over k = 0..15. By
// the layouts above, the word of k = 8h + 2q and 8h + 2q + 1 (h = 0, 1; q = 0..3; low and high
// half) is, of A row r (r < 8), register a0 (h = 0) or a2 (h = 1) of lane 4r + q, and of row
// r + 8, a1 or a3 of the same lane; of B col n, b0 (h = 0) or b1 (h = 1) of lane 4n + q. Each
// product of two bf16 (or two f16) is exact in f32; they are summed in k order 0..15 from
// zero, then added to d.
template <bool F16>
__device__ __forceinline__ void kiln_mma_16(float (&d)[4], unsigned int a0, unsigned int a1,
                                           unsigned int a2, unsigned int a3, unsigned int b0,
                                           unsigned int b1) {
#ifdef KILN_MMA_EMULATED
    const int lane = threadIdx.x % KILN_WARP, g = lane / 4, t = lane % 4;
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const unsigned int row_g = kiln_shfl(h == 0 ? a0 : a2, 4 * g + q);
            const unsigned int row_g8 = kiln_shfl(h == 0 ? a1 : a3, 4 * g + q);
            const unsigned int col_2t = kiln_shfl(h == 0 ? b0 : b1, 4 * (2 * t) + q);
            const unsigned int col_2t1 = kiln_shfl(h == 0 ? b0 : b1, 4 * (2 * t + 1) + q);
#pragma unroll
            for (int half = 0; half < 2; ++half) { // k = 8h + 2q + half
                const int shift = 16 * half;
                const float x_g = kiln_mma_widen<F16>(row_g >> shift);
                const float x_g8 = kiln_mma_widen<F16>(row_g8 >> shift);
                const float y_2t = kiln_mma_widen<F16>(col_2t >> shift);
                const float y_2t1 = kiln_mma_widen<F16>(col_2t1 >> shift);
                sum[0] = fmaf(x_g, y_2t, sum[0]);
                sum[1] = fmaf(x_g, y_2t1, sum[1]);
                sum[2] = fmaf(x_g8, y_2t, sum[2]);
                sum[3] = fmaf(x_g8, y_2t1, sum[3]);
            }
        }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) d[c] += sum[c];
#else
// The one instruction, of the operands' type (a string literal: "bf16" or "f16").
#define KILN_MMA_16_PTX(type)                                                                  \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." type "." type ".f32 "              \
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"          \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                             \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
    if constexpr (F16) {
        KILN_MMA_16_PTX("f16");
    } else {
        KILN_MMA_16_PTX("bf16");
    }
#undef KILN_MMA_16_PTX
#endif
}

__device__ __forceinline__ void kiln_mma_bf16(float (&d)[4], unsigned int a0, unsigned int a1,
                                              unsigned int a2, unsigned int a3, unsigned int b0,
                                              unsigned int b1) {
    kiln_mma_16<false>(d, a0, a1, a2, a3, b0, b1);
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: four 8 x 8 matrices of 16-bit elements from shared
// memory, each row 16 bytes at a 16-byte-aligned address. Lane i supplies `row`, the address of
// row i % 8 of matrix i / 8. Lane l receives in r[j] the word of matrix j's row l / 4, columns
// 2(l % 4) (low half) and 2(l % 4) + 1 (high half): the mma fragment layout. Emulated: the row
// address comes from lane 8j + l / 4, the word is read at element 2(l % 4) of it.
__device__ __forceinline__ void kiln_ldmatrix_x4(unsigned int (&r)[4], const bf16_bits* row) {
#ifdef KILN_MMA_EMULATED
    const int lane = threadIdx.x % KILN_WARP;
    const unsigned long long mine = (unsigned long long)row;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const bf16_bits* from = (const bf16_bits*)kiln_shfl(mine, 8 * j + lane / 4);
        r[j] = *(const unsigned int*)(from + 2 * (lane % 4));
    }
#else
    const unsigned int at = (unsigned int)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
#endif
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: as kiln_ldmatrix_x4, each matrix read
// column-major. Lane l receives in r[j] the elements (row 2(l % 4), column l / 4) (low half) and
// (row 2(l % 4) + 1, column l / 4) (high half) of matrix j as stored: the fragment word of row
// l / 4 of its transpose. Emulated: the two row addresses come from lanes 8j + 2(l % 4) and
// 8j + 2(l % 4) + 1, each element is read at element l / 4 of its row.
__device__ __forceinline__ void kiln_ldmatrix_x4_trans(unsigned int (&r)[4],
                                                       const bf16_bits* row) {
#ifdef KILN_MMA_EMULATED
    const int lane = threadIdx.x % KILN_WARP;
    const unsigned long long mine = (unsigned long long)row;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const bf16_bits* low = (const bf16_bits*)kiln_shfl(mine, 8 * j + 2 * (lane % 4));
        const bf16_bits* high = (const bf16_bits*)kiln_shfl(mine, 8 * j + 2 * (lane % 4) + 1);
        r[j] = (unsigned int)low[lane / 4] | ((unsigned int)high[lane / 4] << 16);
    }
#else
    const unsigned int at = (unsigned int)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
#endif
}

// 16 bytes global -> shared (both 16-byte aligned), asynchronously (cp.async.cg: cached in L2
// only); zeros when !valid, and `src` is not read then (src-size 0). Complete once a
// kiln_cp_async_wait leaves its group behind. Emulated: copied at once, as 4 words.
__device__ __forceinline__ void kiln_cp_async16(void* dst, const void* src, bool valid) {
#ifdef KILN_MMA_EMULATED
    uint4 value = make_uint4(0u, 0u, 0u, 0u);
    if (valid) value = *(const uint4*)src;
    *(uint4*)dst = value;
#else
    const unsigned int at = (unsigned int)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(src),
                 "r"(valid ? 16 : 0));
#endif
}

// 4 bytes global -> shared, asynchronously (cp.async.ca); zero when !valid (src not read).
// Emulated: copied at once, as a word (the bits as they are).
__device__ __forceinline__ void kiln_cp_async4(void* dst, const void* src, bool valid) {
#ifdef KILN_MMA_EMULATED
    unsigned int value = 0u;
    if (valid) value = *(const unsigned int*)src;
    *(unsigned int*)dst = value;
#else
    const unsigned int at = (unsigned int)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(at), "l"(src),
                 "r"(valid ? 4 : 0));
#endif
}

// Closes this thread's group of copies issued since the last commit. Emulated: nothing (the
// copies are done).
__device__ __forceinline__ void kiln_cp_async_commit() {
#ifndef KILN_MMA_EMULATED
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most `pending` of this thread's committed copy groups are still in flight
// (other threads' copies need a barrier after it). Emulated: nothing (none is in flight).
template <int pending> __device__ __forceinline__ void kiln_cp_async_wait() {
#ifndef KILN_MMA_EMULATED
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
#endif
}

// Two f32 rounded to nearest even as one bf16x2 word, or f16x2 with F16 (`low` in the low
// half). PTX: the hardware conversion (cvt.rn.bf16x2.f32, cvt.rn.f16x2.f32: to f16 it rounds to
// subnormals and past 65504 to an infinity). Its bits are kiln_f32_to_bf16's (kiln_f32_to_f16's)
// for every value but NaN: those keep a NaN's sign and upper payload (quieted), the conversion
// gives the canonical NaN 0x7fff (CUDA's CUDART_NAN_BF16, as its own software conversion in
// cuda_bf16.hpp). Emulated: the software conversion, with 0x7fff for a NaN, so the same bits.
template <bool F16> __device__ __forceinline__ unsigned int kiln_cvt_16x2(float low, float high) {
#ifdef KILN_MMA_EMULATED
    const auto round = [](float x) {
        return x != x ? 0x7fffu
                      : (unsigned int)(F16 ? kiln_f32_to_f16(x) : kiln_f32_to_bf16(x));
    };
    return round(low) | (round(high) << 16);
#else
    unsigned int word;
    if constexpr (F16) {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(word) : "f"(high), "f"(low));
    } else {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(word) : "f"(high), "f"(low));
    }
    return word;
#endif
}

// 2^x. PTX: the special function unit alone (ex2.approx.ftz: 2 ulp; results below f32's normal
// range flush to 0, where the CPU reference keeps them subnormal). Emulated: exp2f (CUDA's and
// HIP's device library), more accurate and keeping subnormal results: not the same bits.
__device__ __forceinline__ float kiln_exp2_approx(float x) {
#ifdef KILN_MMA_EMULATED
    return exp2f(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#endif
}

// Two f32 rounded to bf16, packed as one word (the lower k in the low half), in software: the
// same bits on every path (NaN as kiln_f32_to_bf16 makes it).
__device__ __forceinline__ unsigned int kiln_mma_pack(float low, float high) {
    return (unsigned int)kiln_f32_to_bf16(low) | ((unsigned int)kiln_f32_to_bf16(high) << 16);
}

// The same in f16 (NaN as kiln_f32_to_f16 makes it).
__device__ __forceinline__ unsigned int kiln_mma_pack_f16(float low, float high) {
    return (unsigned int)kiln_f32_to_f16(low) | ((unsigned int)kiln_f32_to_f16(high) << 16);
}
