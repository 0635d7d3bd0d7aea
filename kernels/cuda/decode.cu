// Attention over a KV cache split over keys ("flash decoding"): decode has few query rows
// (B·Hq·T blocks would leave most of the GPU idle), so each block takes one chunk of cache rows
// of one KV head, for every query head of its group, and writes a partial result per query
// row (chunk max m, sum of exp l, unnormalized output acc[D]); a second kernel combines the
// chunks of each row in chunk order. Every sum is in a fixed order: the same bits on every run.
//
// Layouts: q [B,Hq,T,D]; caches [B,Hkv,Smax,D]; positions [B] (query t of row b at position
// positions[b] + t sees cache rows 0..=that); out [B,T,Hq,D]; partials
// [B,Hq,T,splits,D+2] f32 as (m, l, acc[0..D]).

extern __shared__ float kiln_shared[];

// One block per (chunk, KV head, b·T + t): the `group` query heads of one KV head share its
// chunk of cache rows, read once. Dynamic shared memory, in floats: q [group][D], keys
// [chunk][D + 1] (padded: the score loop reads rows, not columns), values [chunk][D], scores
// [group][chunk]. Steps, each with the whole block:
// 1. q, and the chunk's keys and values widened to f32, loaded with consecutive threads on
//    consecutive elements (coalesced);
// 2. one thread per (head, key) score, its dot product in d order;
// 3. one warp per head: the chunk max m and sum l of exp(score - m) by fixed butterflies;
// 4. one thread per (head, d): acc = sum over keys, in key order, of p · v.
template <typename C>
__device__ void kiln_cached_attention_split(float* partials, const float* q, const C* k_cache,
                                            const C* v_cache, const i64* positions, i64 q_heads,
                                            i64 kv_heads, i64 q_len, i64 capacity, i64 head_dim,
                                            i64 chunk, float scale, int* fault) {
    const i64 split = blockIdx.x, kv = blockIdx.y, row = blockIdx.z;
    const i64 splits = gridDim.x;
    const i64 b = row / q_len, t = row % q_len;
    const i64 group = q_heads / kv_heads;
    const i64 kv_first = (b * kv_heads + kv) * capacity * head_dim;
    // A position outside 0..=capacity - T raises the fault word; the clamp keeps every read
    // inside the cache.
    const i64 position = positions[b];
    if ((position < 0 || position + q_len > capacity) && threadIdx.x == 0) kiln_raise(fault);
    i64 visible = position + t + 1;
    visible = visible < 0 ? 0 : (visible > capacity ? capacity : visible);
    const i64 first = split * chunk;
    const i64 count = visible > first ? (visible - first < chunk ? visible - first : chunk) : 0;
    const i64 stride = head_dim + 1;
    float* q_shared = kiln_shared;
    float* keys = q_shared + group * head_dim;
    float* values = keys + chunk * stride;
    float* scores = values + chunk * head_dim;
    const i64 threads = blockDim.x;

    for (i64 i = threadIdx.x; i < group * head_dim; i += threads) {
        const i64 h = kv * group + i / head_dim;
        q_shared[i] = q[((b * q_heads + h) * q_len + t) * head_dim + i % head_dim];
    }
    const i64 first_element = kv_first + first * head_dim;
    for (i64 i = threadIdx.x; i < count * head_dim; i += threads) {
        keys[(i / head_dim) * stride + i % head_dim] = kiln_load(k_cache, first_element + i);
        values[i] = kiln_load(v_cache, first_element + i);
    }
    __syncthreads();
    for (i64 i = threadIdx.x; i < group * count; i += threads) {
        const i64 h = i / count, key = i % count;
        const float* q_row = q_shared + h * head_dim;
        const float* k_row = keys + key * stride;
        float dot = 0.0f;
        for (i64 d = 0; d < head_dim; ++d) dot += q_row[d] * k_row[d];
        scores[h * chunk + key] = dot * scale;
    }
    __syncthreads();
    const int lane = threadIdx.x % KILN_WARP;
    const i64 warps = threads / KILN_WARP;
    for (i64 h = threadIdx.x / KILN_WARP; h < group; h += warps) {
        float* s = scores + h * chunk;
        float m = -__int_as_float(0x7f800000);
        for (i64 key = lane; key < count; key += KILN_WARP) m = kiln_max(m, s[key]);
        m = kiln_warp_max(m);
        float l = 0.0f;
        for (i64 key = lane; key < count; key += KILN_WARP) {
            const float p = expf(s[key] - m);
            s[key] = p;
            l += p;
        }
        l = kiln_warp_sum(l);
        if (lane == 0) {
            float* out = partials + (((b * q_heads + kv * group + h) * q_len + t) * splits + split) *
                                        (head_dim + 2);
            out[0] = m;
            out[1] = l;
        }
    }
    __syncthreads();
    for (i64 i = threadIdx.x; i < group * head_dim; i += threads) {
        const i64 h = i / head_dim, d = i % head_dim;
        const float* p = scores + h * chunk;
        float acc = 0.0f;
        for (i64 key = 0; key < count; ++key) acc += p[key] * values[key * head_dim + d];
        float* out = partials + (((b * q_heads + kv * group + h) * q_len + t) * splits + split) *
                                    (head_dim + 2);
        out[2 + d] = acc;
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
