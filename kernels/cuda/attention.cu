// Causal GQA attention: forward (probs saved), forward over a KV cache, and backward.
// Layouts: q [B,Hq,T,D]; k, v [B,Hkv,S,D]; out and grad_out [B,T,Hq,D]; probs [B,Hq,T,S].
//
// Row kernels run one block per query row (grid x = t, y = query head, z = batch) with
// dynamic shared memory of (D + blockDim.x) floats. Scores live in the row's probs (or dS)
// row in global memory, so any S works. Dot products over D: one warp per key, lanes split D
// and a butterfly adds the lanes. Sums over keys: thread (d, group) adds keys
// s = group, group + groups, ...; groups are then added in increasing order. All orders are
// fixed by D and blockDim alone.

// Dynamic shared memory of every kernel here (sizes in the header comment).
extern __shared__ float kiln_shared[];

// acc[d] for d < head_dim: partials of thread (d, group) combined in group order; the result
// is valid in threads with threadIdx.x < head_dim (or every thread when groups == 1, which
// loops over d itself). `partial` holds blockDim.x floats.
__device__ __forceinline__ int kiln_groups(i64 head_dim) {
    if (head_dim == 0) return 1;
    int groups = (int)(blockDim.x / head_dim);
    return groups < 1 ? 1 : groups;
}

// out_row[d] = sum_s weights[s] * rows[s * D + d] for s < count.
__device__ void kiln_weighted_row_sum(float* out_row, const float* weights, const float* rows,
                                      i64 count, i64 head_dim, float* partial) {
    const int groups = kiln_groups(head_dim);
    if (groups == 1) {
        for (i64 d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float acc = 0.0f;
            for (i64 s = 0; s < count; ++s) acc += weights[s] * rows[s * head_dim + d];
            out_row[d] = acc;
        }
        return;
    }
    const i64 d = threadIdx.x % head_dim;
    const int group = threadIdx.x / head_dim;
    float acc = 0.0f;
    if (group < groups) {
        for (i64 s = group; s < count; s += groups) acc += weights[s] * rows[s * head_dim + d];
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < head_dim) {
        float total = partial[threadIdx.x];
        for (int g = 1; g < groups; ++g) total += partial[g * head_dim + threadIdx.x];
        out_row[threadIdx.x] = total;
    }
    __syncthreads();
}

// scores[s] = dot(row, keys[s]) * scale for s < count (one warp per key).
__device__ void kiln_row_dots(float* scores, const float* row_shared, const float* keys,
                              i64 count, i64 head_dim, float scale) {
    const int lane = threadIdx.x % KILN_WARP;
    const int warp = threadIdx.x / KILN_WARP;
    const int warps = blockDim.x / KILN_WARP;
    for (i64 s = warp; s < count; s += warps) {
        const float* key = keys + s * head_dim;
        float partial = 0.0f;
        for (i64 d = lane; d < head_dim; d += KILN_WARP) partial += row_shared[d] * key[d];
        partial = kiln_warp_sum(partial);
        if (lane == 0) scores[s] = partial * scale;
    }
}

// One query row: probs[s] = softmax(q . k[s] * scale) over s < visible, 0 for
// visible <= s < probs_len when `zero_masked`; out_row = sum_s probs[s] * v[s].
__device__ void kiln_attend_row(float* out_row, float* probs, i64 probs_len, const float* q_row,
                                const float* keys, const float* values, i64 visible,
                                i64 head_dim, float scale, int zero_masked) {
    __shared__ float scratch[KILN_WARP];
    float* q_shared = kiln_shared;
    float* partial = kiln_shared + head_dim;
    for (i64 d = threadIdx.x; d < head_dim; d += blockDim.x) q_shared[d] = q_row[d];
    __syncthreads();
    kiln_row_dots(probs, q_shared, keys, visible, head_dim, scale);
    __syncthreads();
    float max = -__int_as_float(0x7f800000);
    for (i64 s = threadIdx.x; s < visible; s += blockDim.x) max = fmaxf(max, probs[s]);
    max = kiln_block_max(max, scratch);
    float sum = 0.0f;
    for (i64 s = threadIdx.x; s < visible; s += blockDim.x) {
        float e = expf(probs[s] - max);
        probs[s] = e;
        sum += e;
    }
    sum = kiln_block_sum(sum, scratch);
    for (i64 s = threadIdx.x; s < visible; s += blockDim.x) probs[s] = probs[s] / sum;
    if (zero_masked) {
        for (i64 s = visible + threadIdx.x; s < probs_len; s += blockDim.x) probs[s] = 0.0f;
    }
    __syncthreads();
    kiln_weighted_row_sum(out_row, probs, values, visible, head_dim, partial);
}

// Query t sees keys 0..=S-T+t.
extern "C" __global__ void attention_f32(float* out, float* probs, const float* q,
                                         const float* k, const float* v, i64 q_heads,
                                         i64 kv_heads, i64 q_len, i64 kv_len, i64 head_dim,
                                         float scale) {
    const i64 t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const i64 group = q_heads / kv_heads;
    const i64 q_index = (b * q_heads + h) * q_len + t;
    const i64 kv_first = (b * kv_heads + h / group) * kv_len * head_dim;
    const i64 out_index = (b * q_len + t) * q_heads + h;
    kiln_attend_row(out + out_index * head_dim, probs + q_index * kv_len, kv_len,
                    q + q_index * head_dim, k + kv_first, v + kv_first, kv_len - q_len + t + 1,
                    head_dim, scale, 1);
}

// Query t of batch row b sees cache rows 0..=positions[b]+t (clamped to the cache). The
// probabilities go to the workspace [B,Hq,T,Smax]; rows past the visible ones are not written.
extern "C" __global__ void cached_attention_f32(float* out, float* probs, const float* q,
                                                const float* k_cache, const float* v_cache,
                                                const i64* positions, i64 q_heads,
                                                i64 kv_heads, i64 q_len, i64 capacity,
                                                i64 head_dim, float scale) {
    const i64 t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const i64 group = q_heads / kv_heads;
    const i64 q_index = (b * q_heads + h) * q_len + t;
    const i64 kv_first = (b * kv_heads + h / group) * capacity * head_dim;
    const i64 out_index = (b * q_len + t) * q_heads + h;
    i64 visible = positions[b] + t + 1;
    visible = visible < 0 ? 0 : (visible > capacity ? capacity : visible);
    kiln_attend_row(out + out_index * head_dim, probs + q_index * capacity, capacity,
                    q + q_index * head_dim, k_cache + kv_first, v_cache + kv_first, visible,
                    head_dim, scale, 0);
}

// Backward, pass 1 (one block per query row): dP[s] = dO . v[s];
// dS[s] = P[s] * (dP[s] - sum_s P*dP) * scale into `ds` [B,Hq,T,S] (only s < visible written);
// grad_q = sum_s dS[s] * k[s].
extern "C" __global__ void attention_backward_dq_f32(float* grad_q, float* ds, const float* k,
                                                     const float* v, const float* probs,
                                                     const float* grad_out, i64 q_heads,
                                                     i64 kv_heads, i64 q_len, i64 kv_len,
                                                     i64 head_dim, float scale) {
    __shared__ float scratch[KILN_WARP];
    const i64 t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const i64 group = q_heads / kv_heads;
    const i64 q_index = (b * q_heads + h) * q_len + t;
    const i64 kv_first = (b * kv_heads + h / group) * kv_len * head_dim;
    const float* grad_out_row = grad_out + ((b * q_len + t) * q_heads + h) * head_dim;
    const float* p_row = probs + q_index * kv_len;
    float* ds_row = ds + q_index * kv_len;
    const i64 visible = kv_len - q_len + t + 1;
    float* row_shared = kiln_shared;
    float* partial = kiln_shared + head_dim;
    for (i64 d = threadIdx.x; d < head_dim; d += blockDim.x) row_shared[d] = grad_out_row[d];
    __syncthreads();
    kiln_row_dots(ds_row, row_shared, v + kv_first, visible, head_dim, 1.0f);
    __syncthreads();
    float p_dot_dp = 0.0f;
    for (i64 s = threadIdx.x; s < visible; s += blockDim.x) p_dot_dp += p_row[s] * ds_row[s];
    p_dot_dp = kiln_block_sum(p_dot_dp, scratch);
    for (i64 s = threadIdx.x; s < visible; s += blockDim.x) {
        float p = p_row[s];
        ds_row[s] = p * (ds_row[s] - p_dot_dp) * scale;
    }
    __syncthreads();
    kiln_weighted_row_sum(grad_q + q_index * head_dim, ds_row, k + kv_first, visible, head_dim,
                          partial);
}

// Backward, pass 2 (one block per key row: grid x = s, y = kv head, z = batch):
// grad_k[s] = sum over the group's query heads h and the rows t that see s of dS[h,t,s] * q[h,t];
// grad_v[s] = sum of the same (h, t) of P[h,t,s] * dO[t,h]. Items (h, t) are taken in the
// order h major, t minor; thread (d, group) adds items group, group + groups, ...
extern "C" __global__ void attention_backward_dkv_f32(float* grad_k, float* grad_v,
                                                      const float* q, const float* probs,
                                                      const float* grad_out, const float* ds,
                                                      i64 q_heads, i64 kv_heads, i64 q_len,
                                                      i64 kv_len, i64 head_dim) {
    const i64 s = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const i64 group_size = q_heads / kv_heads;
    // Rows t with S - T + t >= s see key s.
    i64 first_t = s - (kv_len - q_len);
    if (first_t < 0) first_t = 0;
    const i64 rows = q_len - first_t;
    const i64 items = rows > 0 ? group_size * rows : 0;
    const i64 kv_index = (b * kv_heads + kvh) * kv_len + s;
    const int groups = kiln_groups(head_dim);
    float* partial_k = kiln_shared;
    float* partial_v = kiln_shared + blockDim.x;
    for (i64 d0 = 0; d0 < head_dim; d0 += (groups == 1 ? blockDim.x : head_dim)) {
        const i64 d = d0 + (groups == 1 ? threadIdx.x : threadIdx.x % head_dim);
        const int group = groups == 1 ? 0 : (int)(threadIdx.x / head_dim);
        float acc_k = 0.0f, acc_v = 0.0f;
        if (d < head_dim && group < groups) {
            for (i64 item = group; item < items; item += groups) {
                const i64 h = kvh * group_size + item / rows;
                const i64 t = first_t + item % rows;
                const i64 q_index = (b * q_heads + h) * q_len + t;
                acc_k += ds[q_index * kv_len + s] * q[q_index * head_dim + d];
                acc_v += probs[q_index * kv_len + s] *
                         grad_out[((b * q_len + t) * q_heads + h) * head_dim + d];
            }
        }
        partial_k[threadIdx.x] = acc_k;
        partial_v[threadIdx.x] = acc_v;
        __syncthreads();
        if (groups == 1) {
            if (d < head_dim) {
                grad_k[kv_index * head_dim + d] = acc_k;
                grad_v[kv_index * head_dim + d] = acc_v;
            }
        } else if (threadIdx.x < head_dim) {
            float total_k = partial_k[threadIdx.x], total_v = partial_v[threadIdx.x];
            for (int g = 1; g < groups; ++g) {
                total_k += partial_k[g * head_dim + threadIdx.x];
                total_v += partial_v[g * head_dim + threadIdx.x];
            }
            grad_k[kv_index * head_dim + threadIdx.x] = total_k;
            grad_v[kv_index * head_dim + threadIdx.x] = total_v;
        }
        __syncthreads();
    }
}
