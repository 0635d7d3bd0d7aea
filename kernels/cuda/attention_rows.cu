// The row steps of causal attention between its GEMMs (kernels/src/gpu/attention.rs issues the
// GEMMs). Rows are the B*Hq*T query rows of probs-shaped [B,Hq,T,S] tensors; query row t sees
// keys s < visible = S - T + t + 1, and every kernel here writes exactly 0 past that limit.
//
// One warp per row (8 rows per 256-thread block), no shared memory and no barrier: lane l
// handles s = l, l + 32, ...; lane partials are combined by a butterfly. The order is fixed by
// S alone, so the same inputs give the same bits.

#define KILN_ROWS_PER_BLOCK 8

// The query row of this thread's warp, or -1 past the last row.
__device__ __forceinline__ i64 kiln_warp_row(i64 rows) {
    const i64 row = (i64)blockIdx.x * KILN_ROWS_PER_BLOCK + threadIdx.x / KILN_WARP;
    return row < rows ? row : -1;
}

// Keys visible to query row `row`, clamped to 0..=kv_len as decode's kernels clamp theirs: no
// shape can make a loop below reach outside the row.
__device__ __forceinline__ i64 kiln_visible(i64 row, i64 q_len, i64 kv_len) {
    const i64 visible = kv_len - q_len + row % q_len + 1;
    return visible < 0 ? 0 : (visible > kv_len ? kv_len : visible);
}

// In place: probs holds raw scores q.k (the GEMM's output); each row becomes
// softmax(score * scale) over the visible keys, 0 past them. The scaled score is rounded
// before the max is subtracted, as the CPU computes it (no contraction into an FMA).
extern "C" __global__ void attention_softmax_f32(float* probs, i64 rows, i64 q_len, i64 kv_len,
                                                 float scale) {
    kiln_grid_dependency_wait();
    const i64 row = kiln_warp_row(rows);
    if (row < 0) return;
    const int lane = threadIdx.x % KILN_WARP;
    const i64 visible = kiln_visible(row, q_len, kv_len);
    float* p = probs + row * kv_len;
    float max = -__int_as_float(0x7f800000);
    for (i64 s = lane; s < visible; s += KILN_WARP) max = kiln_max(max, __fmul_rn(p[s], scale));
    max = kiln_warp_max(max);
    float sum = 0.0f;
    for (i64 s = lane; s < visible; s += KILN_WARP) {
        const float e = expf(__fsub_rn(__fmul_rn(p[s], scale), max));
        p[s] = e;
        sum += e;
    }
    sum = kiln_warp_sum(sum);
    for (i64 s = lane; s < visible; s += KILN_WARP) p[s] = __fdiv_rn(p[s], sum);
    for (i64 s = visible + lane; s < kv_len; s += KILN_WARP) p[s] = 0.0f;
}

// In place on ds, which holds dP = dO . v (the GEMM's output):
// dS = (P * (dP - sum_s P*dP)) * scale over the visible keys, 0 past them; and
// masked_probs = P over the visible keys, 0 past them (the grad_v GEMM reads every key, and
// the backward must not trust probs past the limit).
extern "C" __global__ void attention_softmax_backward_f32(float* ds, float* masked_probs,
                                                          const float* probs, i64 rows,
                                                          i64 q_len, i64 kv_len, float scale) {
    kiln_grid_dependency_wait();
    const i64 row = kiln_warp_row(rows);
    if (row < 0) return;
    const int lane = threadIdx.x % KILN_WARP;
    const i64 visible = kiln_visible(row, q_len, kv_len);
    const float* p = probs + row * kv_len;
    float* d = ds + row * kv_len;
    float* pm = masked_probs + row * kv_len;
    float p_dot_dp = 0.0f;
    for (i64 s = lane; s < visible; s += KILN_WARP) {
        p_dot_dp = __fadd_rn(p_dot_dp, __fmul_rn(p[s], d[s]));
    }
    p_dot_dp = kiln_warp_sum(p_dot_dp);
    for (i64 s = lane; s < visible; s += KILN_WARP) {
        const float ps = p[s];
        d[s] = __fmul_rn(__fmul_rn(ps, __fsub_rn(d[s], p_dot_dp)), scale);
        pm[s] = ps;
    }
    for (i64 s = visible + lane; s < kv_len; s += KILN_WARP) {
        d[s] = 0.0f;
        pm[s] = 0.0f;
    }
}
