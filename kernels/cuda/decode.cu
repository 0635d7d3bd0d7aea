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

extern __shared__ __align__(16) float kiln_shared[];  // float4 accesses below

// Elements, or 16-byte vectors, each thread loads per round before storing them.
#define KILN_DECODE_ROUND 8
#define KILN_DECODE_VECTORS 2

// q_shared[h][d] = q[b, kv * group + h, t, d] for the group's query heads: the block's
// threads in turn, four floats a load where the rows are 16-byte aligned.
__device__ __forceinline__ void kiln_decode_stage_q(float* q_shared, const float* q, i64 b, i64 t,
                                                    i64 kv, int group, i64 q_heads, i64 q_len,
                                                    int dim) {
    const float* first = q + ((b * q_heads + kv * group) * q_len + t) * dim;
    const i64 head_step = q_len * dim;  // between the group's heads
    if (dim % 4 == 0 && ((unsigned long long)first & 15) == 0) {
        const int quads = dim / 4;
        for (int i = threadIdx.x; i < group * quads; i += blockDim.x) {
            const int h = i / quads;
            ((float4*)q_shared)[i] = *(const float4*)(first + h * head_step + 4 * (i - h * quads));
        }
        return;
    }
    for (int i = threadIdx.x; i < group * dim; i += blockDim.x) {
        const int h = i / dim;
        q_shared[i] = first[h * head_step + (i - h * dim)];
    }
}

// The elements of a 16-byte vector as f32: 4 f32, or 8 bf16 widened (low half first).
__device__ __forceinline__ void kiln_decode_widen(const uint4& raw, const float*, float (&e)[8]) {
    e[0] = __uint_as_float(raw.x);
    e[1] = __uint_as_float(raw.y);
    e[2] = __uint_as_float(raw.z);
    e[3] = __uint_as_float(raw.w);
}
__device__ __forceinline__ void kiln_decode_widen(const uint4& raw, const bf16_bits*,
                                                  float (&e)[8]) {
    const unsigned int words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        e[2 * w] = kiln_bf16_to_f32((bf16_bits)(words[w] & 0xffffu));
        e[2 * w + 1] = kiln_bf16_to_f32((bf16_bits)(words[w] >> 16));
    }
}

// The four running sums of a dot product (term 4j + u in sums[u], the last n % 4 terms in
// sums[0]: four independent chains of adds instead of one), added in a fixed order.
__device__ __forceinline__ float kiln_decode_total(const float (&sums)[4]) {
    return (sums[0] + sums[1]) + (sums[2] + sums[3]);
}

// Rows [from, to) of a chunk of keys and values (contiguous in the cache, rows of `dim`
// elements) into shared memory as f32: keys with rows `stride` floats apart, values dense.
// Each thread issues all the loads of a round before it stores any (a store waits for its
// load; a load per round trip would serialize the latency): 16-byte vectors where the rows
// allow (dim a multiple of a vector's elements, the chunk 16-byte aligned), else elements.
template <typename C>
__device__ __forceinline__ void kiln_decode_stage_rows(float* keys, float* values,
                                                       const C* k_chunk, const C* v_chunk,
                                                       int from, int to, int dim, int stride) {
    constexpr int per = 16 / (int)sizeof(C);  // elements of a vector
    const bool vectors = dim % per == 0 && ((unsigned long long)k_chunk & 15) == 0 &&
                         ((unsigned long long)v_chunk & 15) == 0;
    // Values are stored 16 bytes at a time where their rows start 16-byte aligned.
    const bool dense_vectors = ((unsigned long long)values & 15) == 0;
    const int threads = blockDim.x;
    if (vectors) {
        const int first = from * dim / per, end = to * dim / per;
        for (int base = first + threadIdx.x; base < end; base += KILN_DECODE_VECTORS * threads) {
            uint4 k_raw[KILN_DECODE_VECTORS], v_raw[KILN_DECODE_VECTORS];
#pragma unroll
            for (int u = 0; u < KILN_DECODE_VECTORS; ++u) {
                const int i = base + u * threads;
                if (i < end) {
                    k_raw[u] = ((const uint4*)k_chunk)[i];
                    v_raw[u] = ((const uint4*)v_chunk)[i];
                }
            }
#pragma unroll
            for (int u = 0; u < KILN_DECODE_VECTORS; ++u) {
                const int i = base + u * threads;
                if (i >= end) continue;
                float k_values[8], v_values[8];
                kiln_decode_widen(k_raw[u], k_chunk, k_values);
                kiln_decode_widen(v_raw[u], v_chunk, v_values);
                const int e0 = i * per, row = e0 / dim;  // a vector never crosses a row
                float* key = keys + row * stride + (e0 - row * dim);
                if (stride % 4 == 0) {  // rows and vectors 16-byte aligned (dim % 4 == 0)
#pragma unroll
                    for (int f = 0; f < per / 4; ++f) {
                        ((float4*)key)[f] = make_float4(k_values[4 * f], k_values[4 * f + 1],
                                                        k_values[4 * f + 2], k_values[4 * f + 3]);
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        if (e < per) key[e] = k_values[e];
                    }
                }
                if (dense_vectors) {
                    float4* to = (float4*)(values + e0);
#pragma unroll
                    for (int f = 0; f < per / 4; ++f) {
                        to[f] = make_float4(v_values[4 * f], v_values[4 * f + 1],
                                            v_values[4 * f + 2], v_values[4 * f + 3]);
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        if (e < per) values[e0 + e] = v_values[e];
                    }
                }
            }
        }
        return;
    }
    const int end = to * dim;
    for (int base = from * dim + threadIdx.x; base < end; base += KILN_DECODE_ROUND * threads) {
        float k_values[KILN_DECODE_ROUND], v_values[KILN_DECODE_ROUND];
#pragma unroll
        for (int u = 0; u < KILN_DECODE_ROUND; ++u) {
            const int i = base + u * threads;
            k_values[u] = i < end ? kiln_load(k_chunk, i) : 0.0f;
            v_values[u] = i < end ? kiln_load(v_chunk, i) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < KILN_DECODE_ROUND; ++u) {
            const int i = base + u * threads;
            if (i < end) {
                const int row = i / dim;
                keys[row * stride + (i - row * dim)] = k_values[u];
                values[i] = v_values[u];
            }
        }
    }
}

// rows[r] = the row of head h0 + r · teams in `base` (rows `row_stride` floats apart), for the
// R heads a thread takes at once; a head past the group gets h0's row (its sums are computed
// and never written).
template <int R>
__device__ __forceinline__ void kiln_decode_head_rows(const float* (&rows)[R], const float* base,
                                                      int row_stride, int h0, int teams,
                                                      int group) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int h = h0 + r * teams;
        rows[r] = base + (h < group ? h : h0) * row_stride;
    }
}

// Step 2 of the split (below): scores[h][key] = q[h] · keys[key] · scale for the chunk's keys.
// Thread (key, team), teams = threads / chunk: heads team, team + teams, ... R at a time, so
// each key's row is read from shared memory once for R heads (four floats a load where rows
// are 16-byte aligned; q's rows are one address across the lanes). Each dot product runs as
// four running sums over its terms d mod 4 (the last dim % 4 in sums[0]).
template <int R>
__device__ __forceinline__ void kiln_decode_scores(float* scores, const float* q_shared,
                                                   const float* keys, int count, int chunk,
                                                   int scores_stride, int group, int dim,
                                                   int stride, float scale) {
    const int teams = (int)blockDim.x / chunk;  // chunk <= 64 <= blockDim.x
    const int key = (int)threadIdx.x % chunk, team = (int)threadIdx.x / chunk;
    if (team >= teams || key >= count) return;
    const float* k_row = keys + key * stride;
    for (int h0 = team; h0 < group; h0 += teams * R) {
        const float* q_rows[R];
        kiln_decode_head_rows(q_rows, q_shared, dim, h0, teams, group);
        float sums[R][4];
#pragma unroll
        for (int r = 0; r < R; ++r) sums[r][0] = sums[r][1] = sums[r][2] = sums[r][3] = 0.0f;
        int d = 0;
        if (dim % 4 == 0) {
#pragma unroll 2
            for (; d + 4 <= dim; d += 4) {
                const float4 k = *(const float4*)(k_row + d);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const float4 q = *(const float4*)(q_rows[r] + d);
                    sums[r][0] += q.x * k.x;
                    sums[r][1] += q.y * k.y;
                    sums[r][2] += q.z * k.z;
                    sums[r][3] += q.w * k.w;
                }
            }
        } else {
            for (; d + 4 <= dim; d += 4) {
#pragma unroll
                for (int r = 0; r < R; ++r) {
#pragma unroll
                    for (int u = 0; u < 4; ++u) sums[r][u] += q_rows[r][d + u] * k_row[d + u];
                }
            }
        }
        for (; d < dim; ++d) {
#pragma unroll
            for (int r = 0; r < R; ++r) sums[r][0] += q_rows[r][d] * k_row[d];
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int h = h0 + r * teams;
            if (h < group) scores[h * scores_stride + key] = kiln_decode_total(sums[r]) * scale;
        }
    }
}

// Step 4 of the split: acc[h][d] = sum over the chunk's keys of p[h][key] · values[key][d],
// into out[h · head_step + 2 + d]. Thread (d, team), teams = threads / dim: heads team,
// team + teams, ... R at a time, so each value is read from shared memory once for R heads
// (p four keys a load where rows are 16-byte aligned, one address across a warp's lanes).
// Each sum runs as four running sums over its keys mod 4 (the last count % 4 in sums[0]).
template <int R>
__device__ __forceinline__ void kiln_decode_values(float* out, i64 head_step,
                                                   const float* scores, const float* values,
                                                   int count, int scores_stride, int group,
                                                   int dim) {
    const int threads = (int)blockDim.x;
    const int teams = threads >= dim ? threads / dim : 1;
    for (int i = (int)threadIdx.x; i < teams * dim; i += threads) {
        const int d = i % dim, team = i / dim;
        const float* v = values + d;
        for (int h0 = team; h0 < group; h0 += teams * R) {
            const float* p[R];
            kiln_decode_head_rows(p, scores, scores_stride, h0, teams, group);
            float sums[R][4];
#pragma unroll
            for (int r = 0; r < R; ++r) sums[r][0] = sums[r][1] = sums[r][2] = sums[r][3] = 0.0f;
            int key = 0;
#pragma unroll 2
            for (; key + 4 <= count; key += 4) {
                float value[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) value[u] = v[(key + u) * dim];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float weight[4];
                    if (dim % 4 == 0) {
                        const float4 w = *(const float4*)(p[r] + key);
                        weight[0] = w.x, weight[1] = w.y, weight[2] = w.z, weight[3] = w.w;
                    } else {
#pragma unroll
                        for (int u = 0; u < 4; ++u) weight[u] = p[r][key + u];
                    }
#pragma unroll
                    for (int u = 0; u < 4; ++u) sums[r][u] += weight[u] * value[u];
                }
            }
            for (; key < count; ++key) {
#pragma unroll
                for (int r = 0; r < R; ++r) sums[r][0] += p[r][key] * v[key * dim];
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int h = h0 + r * teams;
                if (h < group) out[h * head_step + 2 + d] = kiln_decode_total(sums[r]);
            }
        }
    }
}

// Heads a thread takes at once: 1 where its team has one (teams = threads / width), else 2.
__device__ __forceinline__ int kiln_decode_heads(int group, int width) {
    const int teams = (int)blockDim.x >= width ? (int)blockDim.x / width : 1;
    return group <= teams ? 1 : 2;
}

// One block per (chunk, KV head, b·T + t): the `group` query heads of one KV head share its
// chunk of cache rows, read once. Dynamic shared memory, in floats: q [group][D], keys
// [chunk][stride] (rows padded: D + 4 where D % 4 == 0, keeping them 16-byte aligned, else
// D + 1; for D a multiple of 8 a quarter warp's row loads fall in distinct banks), values
// [chunk][D], scores [group][chunk rounded up to 4]. Steps, each with the whole block:
// 1. the chunk's keys and values widened to f32 (coalesced), and q: the rows below the
//    position before the wait for the kernel before (the indices are graph inputs, and no op
//    of the program writes those rows: the IR verifier's `attention caches` rule), q and the
//    rows the step itself writes after it;
// 2. the scores (`kiln_decode_scores`);
// 3. one warp per head: the chunk max m and sum l of exp(score - m) by fixed butterflies;
// 4. acc = p · values (`kiln_decode_values`).
// A chunk above the position (no key visible) writes its empty partials (m = −inf, l = 0,
// acc = 0) after the wait and stops.
// Every sum's order is fixed by the head's dims and the chunk, not by the batch or the group.
template <typename C>
__device__ void kiln_cached_attention_split(float* partials, const float* q, const C* k_cache,
                                            const C* v_cache, const i64* positions,
                                            const i64* rows, i64 slots, i64 q_heads,
                                            i64 kv_heads, i64 q_len, i64 capacity, i64 head_dim,
                                            i64 chunk, float scale, int* fault) {
    const i64 split = blockIdx.x, kv = blockIdx.y;
    const i64 splits = gridDim.x;
    // 32-bit quotients (grid sizes and head counts): a 64-bit division is a long routine.
    const int b_t = blockIdx.z, b = b_t / (int)q_len, t = b_t - b * (int)q_len;
    const i64 group = (int)q_heads / (int)kv_heads;
    // A position outside 0..=capacity - T or a slot outside the pool raises the fault word;
    // the clamp keeps every read inside the cache. A padding row (or a bad slot) reads no
    // key: its output is 0.
    const i64 slot = kiln_slot(rows, b, slots);
    const i64 kv_first = ((slot < 0 ? 0 : slot) * kv_heads + kv) * capacity * head_dim;
    const i64 position = positions[b];
    const bool bad = position < 0 || position + q_len > capacity || slot == KILN_BAD_SLOT;
    i64 visible = slot < 0 ? 0 : position + t + 1;
    visible = visible < 0 ? 0 : (visible > capacity ? capacity : visible);
    const i64 first = split * chunk;
    const i64 count = visible > first ? (visible - first < chunk ? visible - first : chunk) : 0;
    const int dim = (int)head_dim;
    const int stride = dim % 4 == 0 ? dim + 4 : dim + 1;
    const int scores_stride = ((int)chunk + 3) / 4 * 4;
    float* q_shared = kiln_shared;
    float* keys = q_shared + group * head_dim;
    float* values = keys + chunk * stride;
    float* scores = values + chunk * head_dim;
    const i64 threads = blockDim.x;

    const C* k_chunk = k_cache + kv_first + first * head_dim;
    const C* v_chunk = v_cache + kv_first + first * head_dim;
    const i64 below = position - first;  // rows of the chunk below the position
    const int settled = (int)(below < 0 ? 0 : (below < count ? below : count));
    kiln_decode_stage_rows(keys, values, k_chunk, v_chunk, 0, settled, dim, stride);
    kiln_grid_dependency_wait();
    if (bad && threadIdx.x == 0) kiln_raise(fault);
    // The partial results of head 0 of the group; head h's are h · head_step floats on.
    float* out = partials + (((b * q_heads + kv * group) * q_len + t) * splits + split) *
                                (head_dim + 2);
    const i64 head_step = q_len * splits * (head_dim + 2);
    if (count == 0) {  // no key of the chunk is visible: m = −inf, l = 0, acc = 0
        for (int i = threadIdx.x; i < (int)group * (dim + 2); i += (int)threads) {
            const int h = i / (dim + 2), e = i - h * (dim + 2);
            out[h * head_step + e] = e == 0 ? -__int_as_float(0x7f800000) : 0.0f;
        }
        return;
    }
    kiln_decode_stage_q(q_shared, q, b, t, kv, (int)group, q_heads, q_len, dim);
    kiln_decode_stage_rows(keys, values, k_chunk, v_chunk, settled, (int)count, dim, stride);
    __syncthreads();
    if (kiln_decode_heads((int)group, (int)chunk) == 1) {
        kiln_decode_scores<1>(scores, q_shared, keys, (int)count, (int)chunk, scores_stride,
                              (int)group, dim, stride, scale);
    } else {
        kiln_decode_scores<2>(scores, q_shared, keys, (int)count, (int)chunk, scores_stride,
                              (int)group, dim, stride, scale);
    }
    __syncthreads();
    const int lane = threadIdx.x % KILN_WARP;
    const int warps = (int)threads / KILN_WARP;
    for (int h = threadIdx.x / KILN_WARP; h < (int)group; h += warps) {
        float* s = scores + h * scores_stride;
        float m = -__int_as_float(0x7f800000);
        for (int key = lane; key < (int)count; key += KILN_WARP) m = kiln_max(m, s[key]);
        m = kiln_warp_max(m);
        float l = 0.0f;
        for (int key = lane; key < (int)count; key += KILN_WARP) {
            const float p = expf(s[key] - m);
            s[key] = p;
            l += p;
        }
        l = kiln_warp_sum(l);
        if (lane == 0) {
            out[h * head_step] = m;
            out[h * head_step + 1] = l;
        }
    }
    __syncthreads();
    if (kiln_decode_heads((int)group, dim) == 1) {
        kiln_decode_values<1>(out, head_step, scores, values, (int)count, scores_stride,
                              (int)group, dim);
    } else {
        kiln_decode_values<2>(out, head_step, scores, values, (int)count, scores_stride,
                              (int)group, dim);
    }
}

// 256 threads (BLOCK_THREADS), at most 64 registers: four blocks a multiprocessor.
#define KILN_DECODE_BOUNDS __launch_bounds__(256, 4)

extern "C" __global__ void KILN_DECODE_BOUNDS cached_attention_split_f32(
    float* partials, const float* q, const float* k_cache, const float* v_cache,
    const i64* positions, const i64* rows, i64 slots, i64 q_heads, i64 kv_heads, i64 q_len,
    i64 capacity, i64 head_dim, i64 chunk, float scale, int* fault) {
    // The body waits once the rows nothing writes are staged.
    kiln_cached_attention_split(partials, q, k_cache, v_cache, positions, rows, slots, q_heads,
                                kv_heads, q_len, capacity, head_dim, chunk, scale, fault);
}

extern "C" __global__ void KILN_DECODE_BOUNDS cached_attention_split_f32_bf16(
    float* partials, const float* q, const bf16_bits* k_cache, const bf16_bits* v_cache,
    const i64* positions, const i64* rows, i64 slots, i64 q_heads, i64 kv_heads, i64 q_len,
    i64 capacity, i64 head_dim, i64 chunk, float scale, int* fault) {
    // The body waits once the rows nothing writes are staged.
    kiln_cached_attention_split(partials, q, k_cache, v_cache, positions, rows, slots, q_heads,
                                kv_heads, q_len, capacity, head_dim, chunk, scale, fault);
}

// One block per (query head, b·T + t), a thread per output element d (blockDim >= head_dim,
// a multiple of 32): out = sum_c acc_c · e^(m_c − M) / sum_c l_c · e^(m_c − M), M the largest
// chunk max. Empty chunks (m = −inf, l = 0) add nothing; a row with no key at all (padding)
// is 0. Warp 0 takes the chunks' (m, l) (lane c: chunks c, c + 32, ...; M and the sums by
// fixed butterflies) and leaves each chunk's weight e^(m_c − M) and the total in shared memory
// (splits + 2 floats, dynamic), while every thread's loads of its first KILN_DECODE_COMBINE
// chunks' acc_c[d] are in flight; after one barrier each thread sums its chunks in chunk order.
#define KILN_DECODE_COMBINE 16
extern "C" __global__ void cached_attention_combine_f32(float* out, const float* partials,
                                                        i64 q_heads, i64 q_len, i64 head_dim,
                                                        i64 splits) {
    kiln_grid_dependency_wait();
    const i64 h = blockIdx.y;
    const int b_t = blockIdx.z, b = b_t / (int)q_len, t = b_t - b * (int)q_len;
    const i64 q_index = (b * q_heads + h) * q_len + t;
    const i64 stride = head_dim + 2;
    const float* part = partials + q_index * splits * stride;
    float* weights = kiln_shared;
    float* total_at = kiln_shared + splits;  // the total, then 1 for an empty row
    const i64 d = threadIdx.x;
    const bool active = d < head_dim;
    float chunk[KILN_DECODE_COMBINE];
#pragma unroll
    for (int u = 0; u < KILN_DECODE_COMBINE; ++u) {
        chunk[u] = active && u < splits ? part[u * stride + 2 + d] : 0.0f;
    }
    if (threadIdx.x < KILN_WARP) {
        const int lane = threadIdx.x;
        float top = -__int_as_float(0x7f800000), sums = 0.0f;
        for (i64 c = lane; c < splits; c += KILN_WARP) {
            const float m = part[c * stride];
            weights[c] = m;
            top = kiln_max(top, m);
            sums += part[c * stride + 1];
        }
        top = kiln_warp_max(top);
        sums = kiln_warp_sum(sums);
        float total = 0.0f;
        for (i64 c = lane; c < splits; c += KILN_WARP) {
            weights[c] = expf(weights[c] - top);
            total += part[c * stride + 1] * weights[c];
        }
        total = kiln_warp_sum(total);
        if (lane == 0) {
            // No key at all (a padding row): every chunk is empty (m = -inf, l = 0) and the
            // output is 0. Keys whose scores are all -inf give l = NaN, and NaN, as on the CPU.
            total_at[0] = total;
            total_at[1] = top == -__int_as_float(0x7f800000) && sums == 0.0f ? 1.0f : 0.0f;
        }
    }
    __syncthreads();
    if (!active) return;
    float acc = 0.0f;
#pragma unroll
    for (int u = 0; u < KILN_DECODE_COMBINE; ++u) {
        if (u < splits) acc += chunk[u] * weights[u];
    }
    for (i64 c0 = KILN_DECODE_COMBINE; c0 < splits; c0 += KILN_DECODE_COMBINE) {
#pragma unroll
        for (int u = 0; u < KILN_DECODE_COMBINE; ++u) {
            chunk[u] = c0 + u < splits ? part[(c0 + u) * stride + 2 + d] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < KILN_DECODE_COMBINE; ++u) {
            if (c0 + u < splits) acc += chunk[u] * weights[c0 + u];
        }
    }
    float* out_row = out + ((b * q_len + t) * q_heads + h) * head_dim;
    out_row[d] = total_at[1] != 0.0f ? 0.0f : acc / total_at[0];
}
