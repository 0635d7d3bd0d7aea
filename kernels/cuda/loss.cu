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
        other.max = kiln_shfl_xor(acc.max, lane_mask);
        other.sum = kiln_shfl_xor(acc.sum, lane_mask);
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

// The chunked LM-head loss (kernels/src/loss/chunked.rs): the logits of one vocabulary chunk,
// columns first_column..first_column+width, lie in a workspace [N, width] between GEMMs.

// stats [N,3] (max, sum of exp(x - max), target logit): the chunk's (max, sum) merged into
// the row's, from (-inf, 0) on the first chunk; the target's logit taken where it lies.
// One block per row.
extern "C" __global__ void chunked_ce_update_f32(float* stats, const float* logits,
                                                 const i64* targets, i64 rows, i64 width,
                                                 i64 first_column) {
    kiln_grid_dependency_wait();
    const i64 r = blockIdx.x;
    if (r >= rows) return;
    const float* row = logits + r * width;
    const KilnMaxSum chunk = kiln_row_max_sum(row, width);
    if (threadIdx.x == 0) {
        float* s = stats + r * 3;
        KilnMaxSum prior;
        prior.max = first_column == 0 ? -__int_as_float(0x7f800000) : s[0];
        prior.sum = first_column == 0 ? 0.0f : s[1];
        const KilnMaxSum merged = kiln_merge(prior, chunk);
        s[0] = merged.max;
        s[1] = merged.sum;
        const i64 column = targets[r] - first_column;
        if (column >= 0 && column < width) s[2] = row[column];
    }
}

// lse[r] = max + log(sum) and row_loss[r] = log(sum) - (target logit - max) after the last
// chunk (a vocabulary of 0 has no chunk: max = -inf, sum = 0); 0 for an ignored row, NaN for
// a target outside 0..V (which raises the fault word). One thread per row.
extern "C" __global__ void chunked_ce_finish_f32(float* row_loss, float* lse, const float* stats,
                                                 const i64* targets, i64 rows, i64 vocab,
                                                 i64 ignore_index, int* fault) {
    kiln_grid_dependency_wait();
    for (i64 r = blockIdx.x * (i64)blockDim.x + threadIdx.x; r < rows;
         r += (i64)gridDim.x * blockDim.x) {
        const float max = vocab > 0 ? stats[r * 3] : -__int_as_float(0x7f800000);
        const float log_sum = logf(vocab > 0 ? stats[r * 3 + 1] : 0.0f);
        lse[r] = max + log_sum;
        const i64 target = targets[r];
        if (target == ignore_index) {
            row_loss[r] = 0.0f;
            continue;
        }
        const bool valid = target >= 0 && target < vocab;
        if (!valid) kiln_raise(fault);
        row_loss[r] = valid ? log_sum - (stats[r * 3 + 2] - max) : __int_as_float(0x7fc00000);
    }
}

// scale[0] = grad_loss / (rows not ignored), one block (0/0 with none: only ignored rows
// would read it, and they do not).
extern "C" __global__ void chunked_ce_scale_f32(float* scale, const i64* targets,
                                                const float* grad_loss, i64 rows,
                                                i64 ignore_index) {
    kiln_grid_dependency_wait();
    __shared__ float scratch[KILN_WARP];
    float counted = 0.0f;
    for (i64 r = threadIdx.x; r < rows; r += blockDim.x) {
        if (targets[r] != ignore_index) counted += 1.0f;
    }
    counted = kiln_block_sum(counted, scratch);
    if (threadIdx.x == 0) scale[0] = grad_loss[0] / counted;
}

// grad[r, j] = (exp(logits[r, j] - lse[r]) - [first_column + j == target]) * scale, in the
// GEMM dtype; 0 on an ignored row, NaN on a row whose target is outside 0..V (raising the fault
// word). In place when Out is float (each element read, then written, by one thread). One
// block per row.
template <typename Out>
__device__ void kiln_chunked_ce_grad(Out* grad, const float* logits, const i64* targets,
                                     const float* lse, const float* scale, i64 rows, i64 width,
                                     i64 first_column, i64 vocab, i64 ignore_index, int* fault) {
    const i64 r = blockIdx.x;
    if (r >= rows) return;
    const i64 target = targets[r];
    const float* row = logits + r * width;
    Out* out = grad + r * width;
    if (target == ignore_index) {
        for (i64 j = threadIdx.x; j < width; j += blockDim.x) kiln_store(out, j, 0.0f);
        return;
    }
    if (target < 0 || target >= vocab) {
        if (threadIdx.x == 0) kiln_raise(fault);
        for (i64 j = threadIdx.x; j < width; j += blockDim.x) {
            kiln_store(out, j, __int_as_float(0x7fc00000));
        }
        return;
    }
    const float row_lse = lse[r];
    const float per_row = scale[0];
    for (i64 j = threadIdx.x; j < width; j += blockDim.x) {
        const float one_hot = first_column + j == target ? 1.0f : 0.0f;
        kiln_store(out, j, (expf(row[j] - row_lse) - one_hot) * per_row);
    }
}

extern "C" __global__ void chunked_ce_grad_f32(float* grad, const float* logits,
                                               const i64* targets, const float* lse,
                                               const float* scale, i64 rows, i64 width,
                                               i64 first_column, i64 vocab, i64 ignore_index,
                                               int* fault) {
    kiln_grid_dependency_wait();
    kiln_chunked_ce_grad(grad, logits, targets, lse, scale, rows, width, first_column, vocab,
                         ignore_index, fault);
}

extern "C" __global__ void chunked_ce_grad_bf16(bf16_bits* grad, const float* logits,
                                                const i64* targets, const float* lse,
                                                const float* scale, i64 rows, i64 width,
                                                i64 first_column, i64 vocab, i64 ignore_index,
                                                int* fault) {
    kiln_grid_dependency_wait();
    kiln_chunked_ce_grad(grad, logits, targets, lse, scale, rows, width, first_column, vocab,
                         ignore_index, fault);
}
