// Attention over a KV cache split over keys ("flash decoding"): decode has few query rows
// (B·Hq·T blocks would leave most of the GPU idle), so each block takes one chunk of cache rows
// of one query row and writes a partial result (chunk max m, sum of exp l, unnormalized
// output acc[D]); a second kernel combines the chunks of each row in chunk order. Every sum is
// in a fixed order: the same bits on every run.
//
// Layouts: q [B,Hq,T,D]; caches [B,Hkv,Smax,D]; positions [B] (query t of row b at position
// positions[b] + t sees cache rows 0..=that); out [B,T,Hq,D]; partials
// [B,Hq,T,splits,D+2] f32 as (m, l, acc[0..D]).

extern __shared__ float kiln_shared[];

// One block per (chunk, query head, b·T + t); dynamic shared memory: (D + chunk + blockDim)
// floats. Needs D <= blockDim.
// The caches C are f32 or bf16 (stored operands, widened where read).
template <typename C>
__device__ void kiln_cached_attention_split(float* partials, const float* q, const C* k_cache,
                                            const C* v_cache, const i64* positions, i64 q_heads,
                                            i64 kv_heads, i64 q_len, i64 capacity, i64 head_dim,
                                            i64 chunk, float scale, int* fault) {
    const i64 split = blockIdx.x, h = blockIdx.y, row = blockIdx.z;
    const i64 splits = gridDim.x;
    const i64 b = row / q_len, t = row % q_len;
    const i64 group = q_heads / kv_heads;
    const i64 q_index = (b * q_heads + h) * q_len + t;
    const i64 kv_first = (b * kv_heads + h / group) * capacity * head_dim;
    // A position outside 0..=capacity - T raises the fault word; the clamp keeps every read
    // inside the cache.
    const i64 position = positions[b];
    if ((position < 0 || position + q_len > capacity) && threadIdx.x == 0) kiln_raise(fault);
    i64 visible = position + t + 1;
    visible = visible < 0 ? 0 : (visible > capacity ? capacity : visible);
    const i64 first = split * chunk;
    const i64 count = visible > first ? (visible - first < chunk ? visible - first : chunk) : 0;
    float* q_shared = kiln_shared;
    float* weights = kiln_shared + head_dim;
    float* partial = weights + chunk;
    float* out = partials + (q_index * splits + split) * (head_dim + 2);

    for (i64 d = threadIdx.x; d < head_dim; d += blockDim.x) q_shared[d] = q[q_index * head_dim + d];
    __syncthreads();
    // One thread per key: its whole row, loads independent of each other.
    for (i64 i = threadIdx.x; i < count; i += blockDim.x) {
        const C* key = k_cache + kv_first + (first + i) * head_dim;
        float dot = 0.0f;
        for (i64 d = 0; d < head_dim; ++d) dot += q_shared[d] * kiln_load(key, d);
        weights[i] = dot * scale;
    }
    __syncthreads();
    float m = -__int_as_float(0x7f800000);
    for (i64 i = 0; i < count; ++i) m = kiln_max(m, weights[i]);
    __syncthreads();
    for (i64 i = threadIdx.x; i < count; i += blockDim.x) weights[i] = expf(weights[i] - m);
    __syncthreads();
    float l = 0.0f;
    for (i64 i = 0; i < count; ++i) l += weights[i];
    // acc[d]: `groups` groups of D threads take keys group, group + groups, ...; then the
    // groups' sums are added in group order.
    const i64 groups = blockDim.x / head_dim;
    const i64 d = threadIdx.x % head_dim;
    const i64 g = threadIdx.x / head_dim;
    float acc = 0.0f;
    if (g < groups) {
        for (i64 i = g; i < count; i += groups) {
            acc += weights[i] * kiln_load(v_cache, kv_first + (first + i) * head_dim + d);
        }
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < head_dim) {
        float total = partial[threadIdx.x];
        for (i64 k = 1; k < groups; ++k) total += partial[k * head_dim + threadIdx.x];
        out[2 + threadIdx.x] = total;
    }
    if (threadIdx.x == 0) {
        out[0] = m;
        out[1] = l;
    }
}

extern "C" __global__ void cached_attention_split_f32(float* partials, const float* q,
                                                      const float* k_cache,
                                                      const float* v_cache,
                                                      const i64* positions, i64 q_heads,
                                                      i64 kv_heads, i64 q_len, i64 capacity,
                                                      i64 head_dim, i64 chunk, float scale,
                                                      int* fault) {
    kiln_cached_attention_split(partials, q, k_cache, v_cache, positions, q_heads, kv_heads,
                                q_len, capacity, head_dim, chunk, scale, fault);
}

extern "C" __global__ void cached_attention_split_f32_bf16(
    float* partials, const float* q, const bf16_bits* k_cache, const bf16_bits* v_cache,
    const i64* positions, i64 q_heads, i64 kv_heads, i64 q_len, i64 capacity, i64 head_dim,
    i64 chunk, float scale, int* fault) {
    kiln_cached_attention_split(partials, q, k_cache, v_cache, positions, q_heads, kv_heads,
                                q_len, capacity, head_dim, chunk, scale, fault);
}

// One block per (query head, b·T + t): out = sum_c acc_c · e^(m_c − M) / sum_c l_c · e^(m_c − M),
// M the largest chunk max; chunks in order. Empty chunks (m = −inf, l = 0) add nothing.
extern "C" __global__ void cached_attention_combine_f32(float* out, const float* partials,
                                                        i64 q_heads, i64 q_len, i64 head_dim,
                                                        i64 splits) {
    const i64 h = blockIdx.y, row = blockIdx.z;
    const i64 b = row / q_len, t = row % q_len;
    const i64 q_index = (b * q_heads + h) * q_len + t;
    const i64 stride = head_dim + 2;
    const float* part = partials + q_index * splits * stride;
    float top = -__int_as_float(0x7f800000);
    for (i64 c = 0; c < splits; ++c) top = kiln_max(top, part[c * stride]);
    float total = 0.0f;
    for (i64 c = 0; c < splits; ++c) total += part[c * stride + 1] * expf(part[c * stride] - top);
    float* out_row = out + ((b * q_len + t) * q_heads + h) * head_dim;
    for (i64 d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (i64 c = 0; c < splits; ++c) acc += part[c * stride + 2 + d] * expf(part[c * stride] - top);
        out_row[d] = acc / total;
    }
}
