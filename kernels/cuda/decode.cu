// Attention over a KV cache split over keys ("flash decoding"): decode has few query rows
// (B·Hq·T blocks would leave most of the GPU idle), so each block takes one chunk of cache rows
// of one KV head, for every query head of its group, and writes a partial result per query
// row (chunk max m, sum of exp l, unnormalized output acc[D]); a second kernel combines the
// chunks of each row in chunk order. Every sum is in a fixed order: the same bits on every run.
//
// Layouts: q [B,Hq,T,D]; caches [S,Hkv,Smax,D]; positions [B] (query t of row b at position
// positions[b] + t sees positions 0..=that of its cache row: rows[b] of a pool of `slots`, or b
// when rows is null); out [B,T,Hq,D]; partials
// [B,Hq,T,splits,D+2] f32 as (m, l, acc[0..D]).

extern __shared__ float kiln_shared[];

// Elements each thread loads per round before storing them.
#define KILN_DECODE_ROUND 8

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
                                            const C* v_cache, const i64* positions,
                                            const i64* rows, i64 slots, i64 q_heads,
                                            i64 kv_heads, i64 q_len, i64 capacity, i64 head_dim,
                                            i64 chunk, float scale, int* fault) {
    const i64 split = blockIdx.x, kv = blockIdx.y, row = blockIdx.z;
    const i64 splits = gridDim.x;
    const i64 b = row / q_len, t = row % q_len;
    const i64 group = q_heads / kv_heads;
    // A position outside 0..=capacity - T or a slot outside the pool raises the fault word;
    // the clamp keeps every read inside the cache. A padding row (or a bad slot) reads no
    // key: its output is 0.
    const i64 slot = kiln_slot(rows, b, slots);
    const i64 kv_first = ((slot < 0 ? 0 : slot) * kv_heads + kv) * capacity * head_dim;
    const i64 position = positions[b];
    const bool bad = position < 0 || position + q_len > capacity || slot == KILN_BAD_SLOT;
    if (bad && threadIdx.x == 0) kiln_raise(fault);
    i64 visible = slot < 0 ? 0 : position + t + 1;
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
    // The chunk's rows are contiguous in the cache. Each thread issues all the loads of a
    // round before it stores any (a store waits for its load; a load per round trip would
    // serialize the latency).
    const C* k_chunk = k_cache + kv_first + first * head_dim;
    const C* v_chunk = v_cache + kv_first + first * head_dim;
    const int n = (int)(count * head_dim), dim = (int)head_dim;
    for (int base = threadIdx.x; base < n; base += KILN_DECODE_ROUND * threads) {
        float k_values[KILN_DECODE_ROUND], v_values[KILN_DECODE_ROUND];
#pragma unroll
        for (int u = 0; u < KILN_DECODE_ROUND; ++u) {
            const int i = base + u * (int)threads;
            k_values[u] = i < n ? kiln_load(k_chunk, i) : 0.0f;
            v_values[u] = i < n ? kiln_load(v_chunk, i) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < KILN_DECODE_ROUND; ++u) {
            const int i = base + u * (int)threads;
            if (i < n) {
                keys[(i / dim) * stride + i % dim] = k_values[u];
                values[i] = v_values[u];
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < (int)(group * count); i += threads) {
        const int h = i / (int)count, key = i % (int)count;
        const float* q_row = q_shared + h * head_dim;
        const float* k_row = keys + key * stride;
        float dot = 0.0f;
#pragma unroll 8
        for (int d = 0; d < dim; ++d) dot += q_row[d] * k_row[d];
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
#pragma unroll 8
        for (int key = 0; key < (int)count; ++key) acc += p[key] * values[key * head_dim + d];
        float* out = partials + (((b * q_heads + kv * group + h) * q_len + t) * splits + split) *
                                    (head_dim + 2);
        out[2 + d] = acc;
    }
}

extern "C" __global__ void cached_attention_split_f32(float* partials, const float* q,
                                                      const float* k_cache,
                                                      const float* v_cache,
                                                      const i64* positions, const i64* rows,
                                                      i64 slots, i64 q_heads, i64 kv_heads,
                                                      i64 q_len, i64 capacity, i64 head_dim,
                                                      i64 chunk, float scale, int* fault) {
    kiln_grid_dependency_wait();
    kiln_cached_attention_split(partials, q, k_cache, v_cache, positions, rows, slots, q_heads,
                                kv_heads, q_len, capacity, head_dim, chunk, scale, fault);
}

extern "C" __global__ void cached_attention_split_f32_bf16(
    float* partials, const float* q, const bf16_bits* k_cache, const bf16_bits* v_cache,
    const i64* positions, const i64* rows, i64 slots, i64 q_heads, i64 kv_heads, i64 q_len,
    i64 capacity, i64 head_dim, i64 chunk, float scale, int* fault) {
    kiln_grid_dependency_wait();
    kiln_cached_attention_split(partials, q, k_cache, v_cache, positions, rows, slots, q_heads,
                                kv_heads, q_len, capacity, head_dim, chunk, scale, fault);
}

// One block per (query head, b·T + t): out = sum_c acc_c · e^(m_c − M) / sum_c l_c · e^(m_c − M),
// M the largest chunk max. Empty chunks (m = −inf, l = 0) add nothing; a row with no key at
// all (padding) is 0. Dynamic shared memory:
// 2·splits floats (each chunk's max, then its weight e^(m_c − M)). M and the total are block
// reductions (fixed order); each output element sums the chunks in chunk order, its loads
// issued KILN_DECODE_ROUND at a time.
extern "C" __global__ void cached_attention_combine_f32(float* out, const float* partials,
                                                        i64 q_heads, i64 q_len, i64 head_dim,
                                                        i64 splits) {
    kiln_grid_dependency_wait();
    __shared__ float scratch[KILN_WARP];
    const i64 h = blockIdx.y, row = blockIdx.z;
    const i64 b = row / q_len, t = row % q_len;
    const i64 q_index = (b * q_heads + h) * q_len + t;
    const i64 stride = head_dim + 2;
    const float* part = partials + q_index * splits * stride;
    float* maxima = kiln_shared;
    float* weights = kiln_shared + splits;
    float top = -__int_as_float(0x7f800000), sums = 0.0f;
    for (i64 c = threadIdx.x; c < splits; c += blockDim.x) {
        maxima[c] = part[c * stride];
        top = kiln_max(top, maxima[c]);
        sums += part[c * stride + 1];
    }
    top = kiln_block_max(top, scratch);
    sums = kiln_block_sum(sums, scratch);
    // No key at all (a padding row): every chunk is empty (m = -inf, l = 0) and the output is
    // 0. Keys whose scores are all -inf give l = NaN, and NaN, as on the CPU.
    const bool empty = top == -__int_as_float(0x7f800000) && sums == 0.0f;
    float total = 0.0f;
    for (i64 c = threadIdx.x; c < splits; c += blockDim.x) {
        weights[c] = expf(maxima[c] - top);
        total += part[c * stride + 1] * weights[c];
    }
    total = kiln_block_sum(total, scratch);
    float* out_row = out + ((b * q_len + t) * q_heads + h) * head_dim;
    for (i64 d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (i64 c0 = 0; c0 < splits; c0 += KILN_DECODE_ROUND) {
            float chunk[KILN_DECODE_ROUND];
#pragma unroll
            for (int u = 0; u < KILN_DECODE_ROUND; ++u) {
                chunk[u] = c0 + u < splits ? part[(c0 + u) * stride + 2 + d] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < KILN_DECODE_ROUND; ++u) {
                if (c0 + u < splits) acc += chunk[u] * weights[c0 + u];
            }
        }
        out_row[d] = empty ? 0.0f : acc / total;
    }
}
