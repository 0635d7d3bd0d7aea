// Softmax over the last dim and its backward: one block per row, fixed-order block reductions.

// out[r, :] = softmax(x[r, :]), max-subtracted as the CPU.
extern "C" __global__ void softmax_f32(float* out, const float* x, i64 rows, i64 cols) {
    __shared__ float scratch[KILN_WARP];
    const i64 row = blockIdx.x;
    if (row >= rows) return;
    const float* x_row = x + row * cols;
    float* out_row = out + row * cols;
    float max = -__int_as_float(0x7f800000);
    for (i64 j = threadIdx.x; j < cols; j += blockDim.x) max = kiln_max(max, x_row[j]);
    max = kiln_block_max(max, scratch);
    float sum = 0.0f;
    for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
        float e = expf(x_row[j] - max);
        out_row[j] = e;
        sum += e;
    }
    sum = kiln_block_sum(sum, scratch);
    for (i64 j = threadIdx.x; j < cols; j += blockDim.x) out_row[j] = out_row[j] / sum;
}

// grad_x = y * (grad_out - sum(grad_out * y)) per row.
extern "C" __global__ void softmax_backward_f32(float* grad_x, const float* y,
                                                const float* grad_out, i64 rows, i64 cols) {
    __shared__ float scratch[KILN_WARP];
    const i64 row = blockIdx.x;
    if (row >= rows) return;
    const float* y_row = y + row * cols;
    const float* g_row = grad_out + row * cols;
    float dot = 0.0f;
    for (i64 j = threadIdx.x; j < cols; j += blockDim.x) dot += y_row[j] * g_row[j];
    dot = kiln_block_sum(dot, scratch);
    for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
        grad_x[row * cols + j] = y_row[j] * (g_row[j] - dot);
    }
}
