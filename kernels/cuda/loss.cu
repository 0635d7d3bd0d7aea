// Cross-entropy over rows of logits [N,V] with targets [N] (rows whose target is ignore_index
// do not count), and its backward. One block per row; a row's max and sum of exponentials are
// found in one pass over it (kiln_row_max_sum), every sum in a fixed order.

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

// (max, sum of exp(x - max)) of a row, the same in every thread of the block. The row goes in
// segments of KILN_CE_HELD x 4 elements a thread, held in registers: the segment's max over
// the block, then the sum of exp(x - max) over it (one exp an element), the segments merged
// in order (kiln_merge). Thread t holds elements first + (u * blockDim.x + t) * 4 + e of a
// segment (u < KILN_CE_HELD, e < 4), read as float4 where the row allows (a multiple of 4
// elements from a 16-byte aligned start), else one at a time: the same elements either way, so
// the same bits. Elements past the row are -inf.
#define KILN_CE_HELD 8

// This thread's elements of the segment of `row` from `first` into `held` (-inf past the row).
__device__ __forceinline__ void kiln_ce_load(float (&held)[KILN_CE_HELD][4], const float* row,
                                             i64 first, i64 width, bool vectors) {
#pragma unroll
    for (int u = 0; u < KILN_CE_HELD; ++u) {
        const i64 j = first + ((i64)u * blockDim.x + threadIdx.x) * 4;
        if (vectors && j < width) {
            const float4 v = *(const float4*)(row + j);
            held[u][0] = v.x;
            held[u][1] = v.y;
            held[u][2] = v.z;
            held[u][3] = v.w;
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                held[u][e] = j + e < width ? row[j + e] : -__int_as_float(0x7f800000);
            }
        }
    }
}

__device__ KilnMaxSum kiln_row_max_sum(const float* row, i64 width) {
    __shared__ float scratch[KILN_WARP];
    const bool vectors = width % 4 == 0 && ((unsigned long long)row & 15) == 0;
    const i64 segment = (i64)KILN_CE_HELD * 4 * blockDim.x;
    KilnMaxSum acc;
    acc.max = -__int_as_float(0x7f800000);
    acc.sum = 0.0f;
    for (i64 first = 0; first < width; first += segment) {
        float held[KILN_CE_HELD][4];
        kiln_ce_load(held, row, first, width, vectors);
        float m = -__int_as_float(0x7f800000);
#pragma unroll
        for (int u = 0; u < KILN_CE_HELD; ++u) {
#pragma unroll
            for (int e = 0; e < 4; ++e) m = kiln_max(m, held[u][e]);
        }
        KilnMaxSum part;
        part.max = kiln_block_max(m, scratch);
        float sum = 0.0f;
        if (part.max != -__int_as_float(0x7f800000)) {
#pragma unroll
            for (int u = 0; u < KILN_CE_HELD; ++u) {
#pragma unroll
                for (int e = 0; e < 4; ++e) sum += expf(held[u][e] - part.max);
            }
        }
        part.sum = kiln_block_sum(sum, scratch);
        acc = kiln_merge(acc, part);
    }
    return acc;
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

// Four gradient elements from element j on (j a multiple of 4, the row's start aligned to the
// vector: float4, or 8 bytes of bf16).
__device__ __forceinline__ void kiln_ce_grad_store(float* out, i64 j, float4 v) {
    kiln_store4((float4*)out, j / 4, v);
}
__device__ __forceinline__ void kiln_ce_grad_store(bf16_bits* out, i64 j, float4 v) {
    kiln_store4((uint2*)out, j / 4, v);
}

// grad[r, j] = (exp(logits[r, j] - lse[r]) - [first_column + j == target]) * scale, in the
// GEMM dtype; 0 on an ignored row, NaN on a row whose target is outside 0..V (raising the fault
// word). In place when Out is float (each element read, then written, by one thread). One
// block per row; KILN_CE_HELD vectors of four elements a thread, all loaded before the first is
// written, where the rows allow (a multiple of 4 elements from starts aligned to the vectors),
// else one element at a time: each element's value the same either way.
template <typename Out>
__device__ void kiln_chunked_ce_grad(Out* grad, const float* logits, const i64* targets,
                                     const float* lse, const float* scale, i64 rows, i64 width,
                                     i64 first_column, i64 vocab, i64 ignore_index, int* fault) {
    const i64 r = blockIdx.x;
    if (r >= rows) return;
    const i64 target = targets[r];
    const float* row = logits + r * width;
    Out* out = grad + r * width;
    const bool vectors = width % 4 == 0 && ((unsigned long long)row & 15) == 0 &&
                         ((unsigned long long)out & (4 * sizeof(Out) - 1)) == 0;
    float fill = 0.0f;  // an ignored row's gradient
    if (target != ignore_index && (target < 0 || target >= vocab)) {
        if (threadIdx.x == 0) kiln_raise(fault);
        fill = __int_as_float(0x7fc00000);
    }
    if (target == ignore_index || fill != 0.0f) {
        for (i64 j = threadIdx.x; j < width; j += blockDim.x) kiln_store(out, j, fill);
        return;
    }
    const float row_lse = lse[r];
    const float per_row = scale[0];
    const i64 hot = target - first_column;  // the target's column in this chunk, if it is here
    if (!vectors) {
        for (i64 j = threadIdx.x; j < width; j += blockDim.x) {
            const float one_hot = j == hot ? 1.0f : 0.0f;
            kiln_store(out, j, (expf(row[j] - row_lse) - one_hot) * per_row);
        }
        return;
    }
    // KILN_CE_HELD vectors a thread loaded before the first is written.
    const i64 span = (i64)KILN_CE_HELD * 4 * blockDim.x;
    for (i64 first = 0; first < width; first += span) {
        float4 x[KILN_CE_HELD];
#pragma unroll
        for (int u = 0; u < KILN_CE_HELD; ++u) {
            const i64 j = first + ((i64)u * blockDim.x + threadIdx.x) * 4;
            if (j < width) x[u] = *(const float4*)(row + j);
        }
#pragma unroll
        for (int u = 0; u < KILN_CE_HELD; ++u) {
            const i64 j = first + ((i64)u * blockDim.x + threadIdx.x) * 4;
            if (j >= width) continue;
            const float e[4] = {x[u].x, x[u].y, x[u].z, x[u].w};
            float g[4];
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const float one_hot = j + t == hot ? 1.0f : 0.0f;
                g[t] = (expf(e[t] - row_lse) - one_hot) * per_row;
            }
            kiln_ce_grad_store(out, j, make_float4(g[0], g[1], g[2], g[3]));
        }
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

// The LM-head loss and its gradient in one (LinearCrossEntropyGrad, kernels/src/gpu/loss.rs):
// row r of a chunk's logits [rows, vocab] (f32) gives row_loss[r] and the row's gradient
// (exp(x - lse) - [j == target]) * scale[0] in Out, written over the logits in place: the
// gradient's row r starts where the logits' row r does, so a bf16 row fills the first half of
// its row's bytes. The row's max and sum come first (kiln_row_max_sum, which also gives the
// target's logit to thread 0 before anything is written); then each segment of KILN_CE_HELD
// vectors a thread is loaded by every thread before a barrier and written after it: what a
// segment writes lies within the segments loaded by then. An ignored row: loss 0, gradient 0;
// a target outside 0..V: NaN for both, and the fault word. One block per row.
template <typename Out>
__device__ void kiln_fused_ce_row(float* logits, float* row_loss, const i64* targets,
                                  const float* scale, i64 rows, i64 vocab, i64 ignore_index,
                                  int* fault) {
    const i64 r = blockIdx.x;
    if (r >= rows) return;
    const i64 target = targets[r];
    float* row = logits + r * vocab;
    Out* out = (Out*)row;
    float fill = 0.0f;  // an ignored row's loss and gradient
    if (target != ignore_index && (target < 0 || target >= vocab)) {
        if (threadIdx.x == 0) kiln_raise(fault);
        fill = __int_as_float(0x7fc00000);
    }
    if (target == ignore_index || fill != 0.0f) {
        if (threadIdx.x == 0) row_loss[r] = fill;
        for (i64 j = threadIdx.x; j < vocab; j += blockDim.x) kiln_store(out, j, fill);
        return;
    }
    const KilnMaxSum ms = kiln_row_max_sum(row, vocab);
    const float log_sum = logf(ms.sum);
    const float lse = ms.max + log_sum;
    if (threadIdx.x == 0) row_loss[r] = log_sum - (row[target] - ms.max);
    const float per_row = scale[0];
    const bool vectors = vocab % 4 == 0 && ((unsigned long long)row & 15) == 0;
    const i64 span = (i64)KILN_CE_HELD * 4 * blockDim.x;
    for (i64 first = 0; first < vocab; first += span) {
        float held[KILN_CE_HELD][4];
        kiln_ce_load(held, row, first, vocab, vectors);
        __syncthreads();
#pragma unroll
        for (int u = 0; u < KILN_CE_HELD; ++u) {
            const i64 j = first + ((i64)u * blockDim.x + threadIdx.x) * 4;
            float g[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float one_hot = j + e == target ? 1.0f : 0.0f;
                g[e] = (expf(held[u][e] - lse) - one_hot) * per_row;
            }
            if (vectors && j < vocab) {
                kiln_ce_grad_store(out, j, make_float4(g[0], g[1], g[2], g[3]));
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (j + e < vocab) kiln_store(out, j + e, g[e]);
                }
            }
        }
    }
}

extern "C" __global__ void fused_ce_rows_f32(float* logits, float* row_loss, const i64* targets,
                                             const float* scale, i64 rows, i64 vocab,
                                             i64 ignore_index, int* fault) {
    kiln_grid_dependency_wait();
    kiln_fused_ce_row<float>(logits, row_loss, targets, scale, rows, vocab, ignore_index, fault);
}

extern "C" __global__ void fused_ce_rows_bf16(float* logits, float* row_loss,
                                              const i64* targets, const float* scale, i64 rows,
                                              i64 vocab, i64 ignore_index, int* fault) {
    kiln_grid_dependency_wait();
    kiln_fused_ce_row<bf16_bits>(logits, row_loss, targets, scale, rows, vocab, ignore_index,
                                 fault);
}
