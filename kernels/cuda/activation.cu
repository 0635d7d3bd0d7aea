// Softmax over the last dim and its backward: one block per row, fixed-order block reductions.

// out[r, :] = softmax(x[r, :]), max-subtracted as the CPU.
extern "C" __global__ void softmax_f32(float* out, const float* x, i64 rows, i64 cols) {
    kiln_grid_dependency_wait();
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
    kiln_grid_dependency_wait();
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

// (value, index) pairs: the larger value wins, equal values go to the lower index.
__device__ __forceinline__ void kiln_better(float& value, i64& index, float other_value,
                                            i64 other_index) {
    if (other_value > value || (other_value == value && other_index < index)) {
        value = other_value;
        index = other_index;
    }
}

__device__ void kiln_warp_better(float& value, i64& index) {
    for (int offset = KILN_WARP / 2; offset > 0; offset /= 2) {
        const float other_value = kiln_shfl_down(value, offset);
        const i64 other_index = kiln_shfl_down(index, offset);
        kiln_better(value, index, other_value, other_index);
    }
}

// out[r] = the index of the largest x[r, :], ties to the lowest index, as the CPU; -1 for a
// row with no largest element (a NaN, all -inf, or empty). Needs blockDim.x a multiple of
// KILN_WARP, at most 1024 (the builder launches BLOCK_THREADS). Each thread keeps its stride's first largest element (index
// `cols` stands for none yet), then warps and the block reduce the pairs in a fixed order.
extern "C" __global__ void argmax_f32(i64* out, const float* x, i64 rows, i64 cols) {
    kiln_grid_dependency_wait();
    __shared__ float values[KILN_WARP];
    __shared__ i64 indices[KILN_WARP];
    const i64 row = blockIdx.x;
    if (row >= rows) return;
    const float* x_row = x + row * cols;
    float best = -__int_as_float(0x7f800000);
    i64 at = cols;
    int nan = 0;
    for (i64 j = threadIdx.x; j < cols; j += blockDim.x) {
        const float v = x_row[j];
        nan |= v != v;
        if (at == cols || v > best) {
            best = v;
            at = j;
        }
    }
    nan = __syncthreads_or(nan);
    kiln_warp_better(best, at);
    const int lane = threadIdx.x % KILN_WARP, warp = threadIdx.x / KILN_WARP;
    if (lane == 0) {
        values[warp] = best;
        indices[warp] = at;
    }
    __syncthreads();
    if (warp == 0) {
        const int warps = blockDim.x / KILN_WARP;
        best = lane < warps ? values[lane] : -__int_as_float(0x7f800000);
        at = lane < warps ? indices[lane] : cols;
        kiln_warp_better(best, at);
        const bool none = nan || at == cols || best == -__int_as_float(0x7f800000);
        if (lane == 0) out[row] = none ? -1 : at;
    }
}
