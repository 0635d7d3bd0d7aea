// RMSNorm, fused residual add + RMSNorm, and their backwards. One block per row of H.
// rstd = 1 / sqrt(mean(row^2) + eps) (norm.cuh), out = (x * rstd) * weight, as the CPU.

// The weight W is f32 or bf16 (a stored operand); x, residual and the sum are f32; the normed
// rows O are f32, or bf16 rounded as written (`_bf16_out`: mixed precision's input of the GEMMs
// they feed).

// One row per block: with ADD, sum = x + residual written to sum_out and out = rmsnorm(sum);
// without, out = rmsnorm(x). A row of up to KILN_NORM_HELD · blockDim columns is held in
// registers, read once, every load of the thread issued before its first use (a store between
// two loads would keep the second waiting: the pointers may alias); longer rows take the loop,
// where each thread re-reads only the values it read or wrote. Either way each element's
// arithmetic is the same, in the same order: the same bits.
#define KILN_NORM_HELD 8

template <bool ADD, typename O, typename W>
__device__ void kiln_norm_row(float* sum_out, O* out, const float* x, const float* residual,
                              const W* weight, i64 rows, i64 hidden, float eps) {
    __shared__ float scratch[KILN_WARP];
    const i64 row = blockIdx.x;
    if (row >= rows) return;
    const i64 base = row * hidden;
    float squares = 0.0f;
    if (hidden <= KILN_NORM_HELD * (i64)blockDim.x) {
        float held[KILN_NORM_HELD], w[KILN_NORM_HELD];
#pragma unroll
        for (int u = 0; u < KILN_NORM_HELD; ++u) {
            const i64 j = threadIdx.x + u * (i64)blockDim.x;
            const bool inside = j < hidden;
            if constexpr (ADD) {
                held[u] = inside ? x[base + j] + residual[base + j] : 0.0f;
            } else {
                held[u] = inside ? x[base + j] : 0.0f;
            }
            w[u] = inside ? kiln_load(weight, j) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < KILN_NORM_HELD; ++u) {
            const i64 j = threadIdx.x + u * (i64)blockDim.x;
            if (j < hidden) {
                if constexpr (ADD) sum_out[base + j] = held[u];
                squares += held[u] * held[u];
            }
        }
        const float rstd = kiln_inverse_rms(kiln_block_sum(squares, scratch), hidden, eps);
#pragma unroll
        for (int u = 0; u < KILN_NORM_HELD; ++u) {
            const i64 j = threadIdx.x + u * (i64)blockDim.x;
            if (j < hidden) kiln_store(out, base + j, (held[u] * rstd) * w[u]);
        }
        return;
    }
    // The values the second pass reads: the sums written, or x.
    const float* normed = ADD ? sum_out : x;
    for (i64 j = threadIdx.x; j < hidden; j += blockDim.x) {
        if constexpr (ADD) {
            const float s = x[base + j] + residual[base + j];
            sum_out[base + j] = s;
            squares += s * s;
        } else {
            squares += x[base + j] * x[base + j];
        }
    }
    const float rstd = kiln_inverse_rms(kiln_block_sum(squares, scratch), hidden, eps);
    for (i64 j = threadIdx.x; j < hidden; j += blockDim.x) {
        kiln_store(out, base + j, (normed[base + j] * rstd) * kiln_load(weight, j));
    }
}

extern "C" __global__ void rmsnorm_f32(float* out, const float* x, const float* weight, i64 rows,
                                       i64 hidden, float eps) {
    kiln_grid_dependency_wait();
    kiln_norm_row<false>(nullptr, out, x, nullptr, weight, rows, hidden, eps);
}

extern "C" __global__ void rmsnorm_f32_bf16(float* out, const float* x, const bf16_bits* weight,
                                            i64 rows, i64 hidden, float eps) {
    kiln_grid_dependency_wait();
    kiln_norm_row<false>(nullptr, out, x, nullptr, weight, rows, hidden, eps);
}

extern "C" __global__ void rmsnorm_f32_bf16_out(bf16_bits* out, const float* x,
                                                const float* weight, i64 rows, i64 hidden,
                                                float eps) {
    kiln_grid_dependency_wait();
    kiln_norm_row<false>(nullptr, out, x, nullptr, weight, rows, hidden, eps);
}

extern "C" __global__ void rmsnorm_f32_bf16_bf16_out(bf16_bits* out, const float* x,
                                                     const bf16_bits* weight, i64 rows,
                                                     i64 hidden, float eps) {
    kiln_grid_dependency_wait();
    kiln_norm_row<false>(nullptr, out, x, nullptr, weight, rows, hidden, eps);
}

extern "C" __global__ void add_rmsnorm_f32(float* sum_out, float* out, const float* x,
                                           const float* residual, const float* weight, i64 rows,
                                           i64 hidden, float eps) {
    kiln_grid_dependency_wait();
    kiln_norm_row<true>(sum_out, out, x, residual, weight, rows, hidden, eps);
}

extern "C" __global__ void add_rmsnorm_f32_bf16(float* sum_out, float* out, const float* x,
                                                const float* residual, const bf16_bits* weight,
                                                i64 rows, i64 hidden, float eps) {
    kiln_grid_dependency_wait();
    kiln_norm_row<true>(sum_out, out, x, residual, weight, rows, hidden, eps);
}

extern "C" __global__ void add_rmsnorm_f32_bf16_out(float* sum_out, bf16_bits* out,
                                                    const float* x, const float* residual,
                                                    const float* weight, i64 rows, i64 hidden,
                                                    float eps) {
    kiln_grid_dependency_wait();
    kiln_norm_row<true>(sum_out, out, x, residual, weight, rows, hidden, eps);
}

extern "C" __global__ void add_rmsnorm_f32_bf16_bf16_out(float* sum_out, bf16_bits* out,
                                                         const float* x, const float* residual,
                                                         const bf16_bits* weight, i64 rows,
                                                         i64 hidden, float eps) {
    kiln_grid_dependency_wait();
    kiln_norm_row<true>(sum_out, out, x, residual, weight, rows, hidden, eps);
}

// Per row: grad_x = rstd * w * g - x * rstd^3 * sum(g * w * x) / H (+ grad_sum when given),
// and rstd saved to `rstd_out[row]` for the grad_weight kernel. `grad_sum` is read only when
// `has_grad_sum` is nonzero (it may then alias nothing valid). grad_x is written in f32 where
// `grad_x` is not null and rounded to bf16 where `rounded` is not null (mixed precision's
// input of the GEMMs it feeds), either or both. As the forward, a row of up to
// KILN_NORM_HELD · blockDim columns is held in registers, every load issued before the first
// sum; longer rows take the loop. Each element's arithmetic and order are the same either way.
extern "C" __global__ void rmsnorm_backward_rows_f32(float* grad_x, bf16_bits* rounded,
                                                     float* rstd_out, const float* x,
                                                     const float* weight, const float* grad_out,
                                                     const float* grad_sum, int has_grad_sum,
                                                     i64 rows, i64 hidden, float eps) {
    kiln_grid_dependency_wait();
    __shared__ float scratch[KILN_WARP];
    const i64 row = blockIdx.x;
    if (row >= rows) return;
    const i64 base = row * hidden;
    const float* x_row = x + base;
    const float* g_row = grad_out + base;
    float squares = 0.0f;
    float projection = 0.0f;
    if (hidden <= KILN_NORM_HELD * (i64)blockDim.x) {
        float xs[KILN_NORM_HELD], gs[KILN_NORM_HELD], ws[KILN_NORM_HELD], sums[KILN_NORM_HELD];
#pragma unroll
        for (int u = 0; u < KILN_NORM_HELD; ++u) {
            const i64 j = threadIdx.x + u * (i64)blockDim.x;
            const bool inside = j < hidden;
            xs[u] = inside ? x_row[j] : 0.0f;
            gs[u] = inside ? g_row[j] : 0.0f;
            ws[u] = inside ? weight[j] : 0.0f;
            sums[u] = inside && has_grad_sum ? grad_sum[base + j] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < KILN_NORM_HELD; ++u) {
            if (threadIdx.x + u * (i64)blockDim.x < hidden) {
                squares += xs[u] * xs[u];
                projection += gs[u] * ws[u] * xs[u];
            }
        }
        const float rstd = kiln_inverse_rms(kiln_block_sum(squares, scratch), hidden, eps);
        projection = kiln_block_sum(projection, scratch);
        const float through_rstd = rstd * rstd * rstd * projection / (float)hidden;
#pragma unroll
        for (int u = 0; u < KILN_NORM_HELD; ++u) {
            const i64 j = threadIdx.x + u * (i64)blockDim.x;
            if (j < hidden) {
                float gx = rstd * ws[u] * gs[u] - xs[u] * through_rstd;
                if (has_grad_sum) gx += sums[u];
                kiln_store_forms(grad_x, rounded, base + j, gx);
            }
        }
        if (threadIdx.x == 0) rstd_out[row] = rstd;
        return;
    }
    for (i64 j = threadIdx.x; j < hidden; j += blockDim.x) {
        float v = x_row[j];
        squares += v * v;
        projection += g_row[j] * weight[j] * v;
    }
    const float rstd = kiln_inverse_rms(kiln_block_sum(squares, scratch), hidden, eps);
    projection = kiln_block_sum(projection, scratch);
    const float through_rstd = rstd * rstd * rstd * projection / (float)hidden;
    for (i64 j = threadIdx.x; j < hidden; j += blockDim.x) {
        float gx = rstd * weight[j] * g_row[j] - x_row[j] * through_rstd;
        if (has_grad_sum) gx += grad_sum[base + j];
        kiln_store_forms(grad_x, rounded, base + j, gx);
    }
    if (threadIdx.x == 0) rstd_out[row] = rstd;
}

// grad_weight[j] = sum over rows of g[r, j] * (x[r, j] * rstd[r]), or the chunks' partials:
// columns.cuh's split and order.
struct KilnNormWeightTerm {
    const float* x;
    const float* grad_out;
    const float* rstd;
    i64 hidden;
    __device__ float operator()(i64 row, i64 col) const {
        return grad_out[row * hidden + col] * (x[row * hidden + col] * rstd[row]);
    }
};

extern "C" __global__ void rmsnorm_backward_weight_f32(float* grad_weight, const float* x,
                                                       const float* grad_out, const float* rstd,
                                                       i64 rows, i64 hidden, i64 chunk_rows) {
    kiln_grid_dependency_wait();
    kiln_column_sums(grad_weight, rows, hidden, chunk_rows,
                     KilnNormWeightTerm{x, grad_out, rstd, hidden});
}
