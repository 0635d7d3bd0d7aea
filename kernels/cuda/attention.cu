// Causal GQA attention over a KV cache (decode). Layouts: q [B,Hq,T,D]; caches
// [B,Hkv,Smax,D]; out [B,T,Hq,D]; probs scratch [B,Hq,T,Smax]. (Attention with probs saved and
// its backward are GEMMs around the row kernels of attention_rows.cu.)
//
// Row kernels run one block per query row (grid x = t, y = query head, z = batch) with
// dynamic shared memory of (D + blockDim.x) floats. Scores live in the row's probs row in
// global memory, so any S works. Dot products over D: one warp per key, lanes split D and a
// butterfly adds the lanes. Sums over keys: thread (d, group) adds keys s = group,
// group + groups, ...; groups are then added in increasing order. All orders are fixed by D
// and blockDim alone.

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
