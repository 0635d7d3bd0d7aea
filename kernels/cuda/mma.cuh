// Tensor-core helpers shared by the modules that multiply on tensor cores (linear_mma.cu,
// flash.cu): one m16n8k16 bf16 mma.sync with f32 accumulation (inline PTX, sm_80+; NVIDIA
// only) and the packing of two f32 into one bf16x2 fragment word.
//
// Fragment layouts (PTX ISA, m16n8k16, g = lane / 4, t = lane % 4): A (16 x 16, row-major)
// a0 = row g, cols 2t, 2t+1; a1 = row g+8, same cols; a2 = row g, cols 2t+8, 2t+9; a3 = row
// g+8, cols 2t+8, 2t+9. B (16 x 8) b0 = k rows 2t, 2t+1 of col g; b1 = k rows 2t+8, 2t+9. C/D
// (16 x 8 f32) c0, c1 = row g, cols 2t, 2t+1; c2, c3 = row g+8, same cols. Each word holds its
// lower index in its low half.

// d += A * B for one m16n8k16 (bf16 in, f32 accumulate), A and B as their fragment registers.
__device__ __forceinline__ void kiln_mma_bf16(float (&d)[4], unsigned int a0, unsigned int a1,
                                              unsigned int a2, unsigned int a3, unsigned int b0,
                                              unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two f32 rounded to bf16, packed as one word (the lower k in the low half).
__device__ __forceinline__ unsigned int kiln_mma_pack(float low, float high) {
    return (unsigned int)kiln_f32_to_bf16(low) | ((unsigned int)kiln_f32_to_bf16(high) << 16);
}

