// Cross-entropy over rows of logits [N,V] with targets [N] (rows whose target is ignore_index
// do not count), and its backward. One block per row; a row's max and sum of exponentials are
// found in one pass (online: each thread keeps (max, sum) and rescales), then combined in a
// fixed order.

struct KilnMaxSum {
    float max;
    float sum;
};

__device__ __forceinline__ KilnMaxSum kiln_merge(KilnMaxSum a, KilnMaxSum b) {
    KilnMaxSum r;
    r.max = kiln_max(a.max, b.max);
    if (r.max == -__int_as_float(0x7f800000)) {
        r.sum = 0.0f;
    } else {
        r.sum = a.sum * expf(a.max - r.max) + b.sum * expf(b.max - r.max);
    }
    return r;
}

// (max, sum of exp(x - max)) of a row, the same in every thread of the block.
__device__ KilnMaxSum kiln_row_max_sum(const float* row, i64 vocab) {
    __shared__ float maxes[KILN_WARP];
    __shared__ float sums[KILN_WARP];
    KilnMaxSum acc;
    acc.max = -__int_as_float(0x7f800000);
    acc.sum = 0.0f;
    for (i64 j = threadIdx.x; j < vocab; j += blockDim.x) {
        KilnMaxSum one;
        one.max = row[j];
        one.sum = 1.0f;
        acc = kiln_merge(acc, one);
    }
    for (int lane_mask = KILN_WARP / 2; lane_mask > 0; lane_mask >>= 1) {
        KilnMaxSum other;
        other.max = __shfl_xor_sync(KILN_FULL_MASK, acc.max, lane_mask);
        other.sum = __shfl_xor_sync(KILN_FULL_MASK, acc.sum, lane_mask);
        acc = kiln_merge(acc, other);
    }
    const int lane = threadIdx.x % KILN_WARP;
    const int warp = threadIdx.x / KILN_WARP;
    __syncthreads();
    if (lane == 0) {
        maxes[warp] = acc.max;
        sums[warp] = acc.sum;
    }
    __syncthreads();
    KilnMaxSum total = {maxes[0], sums[0]};
    for (int w = 1; w < (int)(blockDim.x / KILN_WARP); ++w) {
        KilnMaxSum next = {maxes[w], sums[w]};
        total = kiln_merge(total, next);
    }
    return total;
}

// Pass 1: row_loss[r] = log(sum) - (row[target] - max), 0 for an ignored row, NaN for a target
// outside 0..V (which raises the fault word).
extern "C" __global__ void cross_entropy_rows_f32(float* row_loss, const float* logits,
                                                  const i64* targets, i64 rows, i64 vocab,
                                                  i64 ignore_index, int* fault) {
    kiln_grid_dependency_wait();
    const i64 r = blockIdx.x;
    if (r >= rows) return;
    const i64 target = targets[r];
    if (target == ignore_index) {
        if (threadIdx.x == 0) row_loss[r] = 0.0f;
        return;
    }
    const float* row = logits + r * vocab;
    KilnMaxSum ms = kiln_row_max_sum(row, vocab);
    if (threadIdx.x == 0) {
        const bool valid = target >= 0 && target < vocab;
        if (!valid) kiln_raise(fault);
        row_loss[r] = valid ? logf(ms.sum) - (row[target] - ms.max) : __int_as_float(0x7fc00000);
    }
}

// Pass 2 (one block): loss = sum of counted row losses / count (0/0 = NaN with no counted row).
extern "C" __global__ void cross_entropy_mean_f32(float* loss, const float* row_loss,
                                                  const i64* targets, i64 rows,
                                                  i64 ignore_index) {
    kiln_grid_dependency_wait();
    __shared__ float scratch[KILN_WARP];
    float total = 0.0f;
    float counted = 0.0f;
    for (i64 r = threadIdx.x; r < rows; r += blockDim.x) {
        if (targets[r] != ignore_index) {
            total += row_loss[r];
            counted += 1.0f;
        }
    }
    total = kiln_block_sum(total, scratch);
    counted = kiln_block_sum(counted, scratch);
    if (threadIdx.x == 0) loss[0] = total / counted;
}

// grad[r, j] = (exp(x - max) / sum - onehot) * grad_loss / count; 0 for ignored rows; a row
// whose target is outside 0..V is NaN and raises the fault word.
// Each block counts the counted rows itself (exact in f32 below 2^24 rows).
extern "C" __global__ void cross_entropy_backward_f32(float* grad, const float* logits,
                                                      const i64* targets, const float* grad_loss,
                                                      i64 rows, i64 vocab, i64 ignore_index,
                                                      int* fault) {
    kiln_grid_dependency_wait();
    __shared__ float scratch[KILN_WARP];
    const i64 r = blockIdx.x;
    if (r >= rows) return;
    float counted = 0.0f;
    for (i64 i = threadIdx.x; i < rows; i += blockDim.x) {
        if (targets[i] != ignore_index) counted += 1.0f;
    }
    counted = kiln_block_sum(counted, scratch);
    const i64 target = targets[r];
    float* grad_row = grad + r * vocab;
    if (target == ignore_index) {
        for (i64 j = threadIdx.x; j < vocab; j += blockDim.x) grad_row[j] = 0.0f;
        return;
    }
    if (target < 0 || target >= vocab) {
        if (threadIdx.x == 0) kiln_raise(fault);
        for (i64 j = threadIdx.x; j < vocab; j += blockDim.x) grad_row[j] = __int_as_float(0x7fc00000);
        return;
    }
    const float per_row = grad_loss[0] / counted;
    const float* row = logits + r * vocab;
    KilnMaxSum ms = kiln_row_max_sum(row, vocab);
    for (i64 j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float one_hot = j == target ? 1.0f : 0.0f;
        grad_row[j] = (expf(row[j] - ms.max) / ms.sum - one_hot) * per_row;
    }
}
