// RMSNorm's scale of a row, shared by the norm kernels and the skinny linears' norm epilogue:
// rstd = 1 / sqrt(mean(row^2) + eps), from the row's sum of squares, as the CPU.
__device__ __forceinline__ float kiln_inverse_rms(float sum_of_squares, i64 hidden, float eps) {
    float mean = sum_of_squares / (float)hidden;
    return 1.0f / sqrtf(mean + eps);
}
