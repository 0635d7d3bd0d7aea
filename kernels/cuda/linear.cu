// Skinny fused linear layer for decode: y_g[r, j] = sum_k x[r, k] * w_g[j, k] (+ bias_g[j]) for
// one row (m = 1) and up to three weight groups g sharing x (q/k/v), optionally with the SwiGLU
// epilogue out = silu(y_0) * y_1 (gate and up), on CUDA cores; and linear_reduce, the split-K
// reduce and epilogue of this kernel and of the tensor-core kernels (linear_mma.cu, 2..32
// rows). Weights and bias are bf16, accumulation and outputs f32. The builder
// (kernels/src/gpu/linear.rs) checks every size and alignment.
//
// Decode is bound by the weight bytes: every weight byte is read from memory once for all
// rows, with as many bytes in flight as possible.
//
// Threads. A block of 256 threads is 32 teams of 8 lanes (a warp holds 4 teams). A team owns
// KILN_LINEAR_COLS = 4 "virtual" columns; the block a tile of 128. Virtual columns are the
// groups' output columns one after the other (group 0's n0, then group 1's, group 2's), or,
// with SwiGLU, a team's first two are gate columns j0, j0+1 and its last two the up columns
// j0, j0+1, so that gate and up of one j end in the same thread.
//
// Loads. Lane l of a team reads the 16-byte vectors (8 bf16) l, l + 8, l + 16, ... of each of
// its 4 weight rows, so a team reads 128 contiguous bytes of a row per load instruction (a whole
// cache line when k is a multiple of 64). Per step a thread issues 4 columns x UNROLL vectors
// of independent 16-byte loads into registers before its first FMA; a stage's first step is
// issued before x is staged, so the staging latency hides behind it, and the first stage's
// before the wait for x's producer (linear_common.cuh), so that the weights' latency hides
// behind the kernel before. With ROWS = 1, UNROLL = 4:
// 16 loads per thread, 117 registers (ptxas, NVRTC 13.0, sm_90), 2 blocks per SM, 128 KB of
// weight bytes in flight per SM; Little's law at ~4.3 TB/s over 132 SMs with ~1 us of loaded
// latency wants ~30 KB. (The body is a template over ROWS; buckets of 2 to 16 rows, measured
// to lose to cuBLASLt at 8 rows since their FMAs are compute-bound there, were replaced by the
// tensor-core kernels of linear_mma.cu.)
//
// x. The block stages its k range of x in shared memory in stages of stage_k elements (all
// ROWS rows, f32, already rounded to bf16 when x is f32, zeros in rows m..ROWS), so every weight
// row meets every row of x from shared memory. The layout keeps each lane's 16-byte reads
// conflict-free: within every 64 elements (8 vectors), the low halves (elements 0..3) of the 8
// vectors come first, then the high halves; the 4 teams of a warp read the same addresses
// (broadcast). The builder keeps ROWS * stage_k * 4 <= 32 KB.
//
// Split-K. Block (x, y) covers column tile x and k range [y * split_k, (y + 1) * split_k); the
// builder's linear_plan picks split_k from the shape alone (enough blocks for the SMs when the
// columns are few). With one split the block adds bias, applies SwiGLU and writes the outputs.
// With more, it writes its f32 sums to partial[y][r][virtual column] (gate's columns, then
// up's, with SwiGLU), and the splits are summed in increasing order, bias added and the
// epilogue applied (kiln_linear_finish) either by linear_reduce, a launch of its own, or (this
// kernel, where the device has thread block clusters and a tile has at most 16 splits) by the
// tile's splits themselves, launched as one cluster: each finishes a share of the tile once the
// cluster's barrier says every partial is written (kiln_linear_cluster_finish). The same bits
// either way. The tensor-core kernels keep linear_reduce: in clusters they measured slower.
//
// RoPE and cache epilogue (a q/k/v `Linear` with `rope_kv`, decode's projection, RoPE and
// cache append in one op). Groups 0, 1, 2 are q, k, v, each n a multiple of the head size D.
// The launch always leaves partial sums (one split's are y itself, written there without
// bias), and the finish takes a pair of columns (i, i + D/2) of a q or k head at a time: both
// summed, biased, rotated at the row's position (rope.cuh, as the RoPE kernels) and written to
// q_rot [B,Hq,T,D] or into the k cache; v's columns are summed, biased and written into the v
// cache (y_2 viewed as [B,Hkv,T,D]), as the cache kernels write (cache.cuh). In clusters (a
// tile's pairs lie in the tile: 128 % D == 0, the builder checks it) or by linear_reduce_rope.
//
// Determinism. Each lane adds its products in increasing k; the 8 lanes of a team combine by a
// fixed butterfly; splits combine in increasing order. No atomics, nothing depends on timing.

#define KILN_LINEAR_TEAM 8
#define KILN_LINEAR_COLS 4
#define KILN_LINEAR_HALF (KILN_LINEAR_COLS / 2)

// Sum over the 8 lanes of a team (every lane of the team gets the same bits).
__device__ __forceinline__ float kiln_linear_team_sum(float value) {
    for (int lane_mask = KILN_LINEAR_TEAM / 2; lane_mask > 0; lane_mask >>= 1) {
        value += kiln_shfl_xor(value, lane_mask);
    }
    return value;
}

// Virtual column c of team `team` with SwiGLU: gate j = team * 2 + c for c < 2, up j for c >= 2.
__device__ __forceinline__ i64 kiln_linear_swiglu_j(i64 team, int c) {
    return team * KILN_LINEAR_HALF + (c % KILN_LINEAR_HALF);
}

// Stages x[0..m, k0..k0 + len) (len a multiple of 8) into `xs` (ROWS rows of stage_k floats in
// the half-split layout of the header; rows m..ROWS are zeros).
template <int ROWS>
__device__ __forceinline__ void kiln_linear_stage(float* xs, const void* x, int x_f32, i64 m,
                                                  i64 ldx, i64 k0, int len, int stage_k) {
    const int vecs = len / 8;
    for (int i = threadIdx.x; i < ROWS * vecs; i += blockDim.x) {
        const int r = i / vecs;
        const int v = i % vecs;
        float e[8];
        if (r >= m) {
#pragma unroll
            for (int t = 0; t < 8; ++t) e[t] = 0.0f;
        } else if (x_f32) {
            const float4* row = (const float4*)((const float*)x + r * ldx + k0);
            const float4 lo = row[2 * v];
            const float4 hi = row[2 * v + 1];
            const float raw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
            for (int t = 0; t < 8; ++t) e[t] = kiln_bf16_to_f32(kiln_f32_to_bf16(raw[t]));
        } else {
            const uint4 q = ((const uint4*)((const bf16_bits*)x + r * ldx + k0))[v];
            const unsigned int words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                e[2 * t] = kiln_linear_low(words[t]);
                e[2 * t + 1] = kiln_linear_high(words[t]);
            }
        }
        float* at = xs + r * stage_k + (v / 8) * 64 + (v % 8) * 4;
        *(float4*)at = make_float4(e[0], e[1], e[2], e[3]);
        *(float4*)(at + 32) = make_float4(e[4], e[5], e[6], e[7]);
    }
}

// wv[c][u] = vector first + lane + 8u of weight row c, for the vectors below `left` of valid
// columns (zeros elsewhere): COLS x UNROLL independent 16-byte loads.
template <int UNROLL>
__device__ __forceinline__ void kiln_linear_load(uint4 (&wv)[KILN_LINEAR_COLS][UNROLL],
                                                 const uint4* const (&rows)[KILN_LINEAR_COLS],
                                                 const bool (&valid)[KILN_LINEAR_COLS], i64 first,
                                                 int lane, int left) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int v = lane + KILN_LINEAR_TEAM * u;
#pragma unroll
        for (int c = 0; c < KILN_LINEAR_COLS; ++c) {
            wv[c][u] = make_uint4(0u, 0u, 0u, 0u);
            if (valid[c] && v < left) wv[c][u] = rows[c][first + v];
        }
    }
}

// The main kernel's body for ROWS >= m rows and UNROLL vectors per column per step.
template <int ROWS, int UNROLL>
__device__ __forceinline__ void kiln_linear_body(
    const KilnLinearOut& out, float* partial, const bf16_bits* w0, const bf16_bits* w1,
    const bf16_bits* w2, i64 n0, i64 n1, i64 n2, const void* x, int x_f32, i64 m, i64 k,
    i64 ldx, i64 split_k, i64 stage_k, int swiglu) {
    extern __shared__ float4 kiln_linear_smem[];
    float* xs = (float*)kiln_linear_smem;
    const int lane = threadIdx.x % KILN_LINEAR_TEAM;
    const i64 team = (i64)blockIdx.x * (blockDim.x / KILN_LINEAR_TEAM) +
                     threadIdx.x / KILN_LINEAR_TEAM;
    const i64 n_virtual = swiglu ? 2 * n0 : n0 + n1 + n2;

    // This team's weight rows; a column past the end keeps a valid pointer and never loads.
    const uint4* rows[KILN_LINEAR_COLS];
    bool valid[KILN_LINEAR_COLS];
#pragma unroll
    for (int c = 0; c < KILN_LINEAR_COLS; ++c) {
        const bf16_bits* w = w0;
        i64 j = 0;
        if (swiglu) {
            j = kiln_linear_swiglu_j(team, c);
            valid[c] = j < n0;
            if (c >= KILN_LINEAR_HALF) w = w1;
        } else {
            const i64 v = team * KILN_LINEAR_COLS + c;
            int g = 0;
            kiln_linear_locate(v, n0, n1, &g, &j);
            valid[c] = v < n_virtual;
            w = g == 0 ? w0 : (g == 1 ? w1 : w2);
        }
        rows[c] = (const uint4*)(w + (valid[c] ? j : 0) * k);
    }

    float acc[ROWS][KILN_LINEAR_COLS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int c = 0; c < KILN_LINEAR_COLS; ++c) acc[r][c] = 0.0f;
    }

    const int stride = (int)stage_k;  // floats between rows of xs
    bool waited = false;
    const i64 k_begin = (i64)blockIdx.y * split_k;
    const i64 k_end = k_begin + split_k < k ? k_begin + split_k : k;
#pragma unroll 1
    for (i64 k0 = k_begin; k0 < k_end; k0 += stage_k) {
        const int len = (int)(k_end - k0 < stage_k ? k_end - k0 : stage_k);
        const int vecs = len / 8;
        const i64 first = k0 / 8;  // the stage's first vector within a weight row
        __syncthreads();  // the previous stage's reads of xs are done
        // The first step's weights are in flight while x is staged.
        uint4 wv[KILN_LINEAR_COLS][UNROLL];
        kiln_linear_load<UNROLL>(wv, rows, valid, first, lane, vecs);
        kiln_linear_wait_once(&waited);
        kiln_linear_stage<ROWS>(xs, x, x_f32, m, ldx, k0, len, stride);
        __syncthreads();
#pragma unroll 1
        for (int base = 0; base < vecs; base += KILN_LINEAR_TEAM * UNROLL) {
            if (base > 0) kiln_linear_load<UNROLL>(wv, rows, valid, first + base, lane, vecs - base);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int v = base + lane + KILN_LINEAR_TEAM * u;
                if (v >= vecs) continue;
                float wf[KILN_LINEAR_COLS][8];
#pragma unroll
                for (int c = 0; c < KILN_LINEAR_COLS; ++c) {
                    const unsigned int words[4] = {wv[c][u].x, wv[c][u].y, wv[c][u].z,
                                                   wv[c][u].w};
#pragma unroll
                    for (int t = 0; t < 4; ++t) {
                        wf[c][2 * t] = kiln_linear_low(words[t]);
                        wf[c][2 * t + 1] = kiln_linear_high(words[t]);
                    }
                }
                // v % 8 == lane: base is a multiple of 8.
                const float* xv = xs + (v / 8) * 64 + lane * 4;
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    const float4 lo = *(const float4*)(xv + r * stride);
                    const float4 hi = *(const float4*)(xv + r * stride + 32);
                    const float e[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
                    for (int c = 0; c < KILN_LINEAR_COLS; ++c) {
#pragma unroll
                        for (int t = 0; t < 8; ++t) acc[r][c] += wf[c][t] * e[t];
                    }
                }
            }
        }
    }

    kiln_linear_wait_once(&waited);
    // Every lane of the team gets every sum; lane (r * COLS + c) % 8 stores (r, c).
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int c = 0; c < KILN_LINEAR_COLS; ++c) acc[r][c] = kiln_linear_team_sum(acc[r][c]);
    }
    const bool split = gridDim.y > 1;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int c = 0; c < KILN_LINEAR_COLS; ++c) {
            if (r >= m || !valid[c] || (r * KILN_LINEAR_COLS + c) % KILN_LINEAR_TEAM != lane) {
                continue;
            }
            if (swiglu) {
                const i64 j = kiln_linear_swiglu_j(team, c);
                if (split) {
                    const i64 v = c < KILN_LINEAR_HALF ? j : n0 + j;
                    partial[((i64)blockIdx.y * m + r) * n_virtual + v] = acc[r][c];
                } else if (c < KILN_LINEAR_HALF) {
                    kiln_linear_write_swiglu(out, r, j, acc[r][c], acc[r][c + KILN_LINEAR_HALF]);
                }
            } else {
                const i64 v = team * KILN_LINEAR_COLS + c;
                if (split) {
                    partial[((i64)blockIdx.y * m + r) * n_virtual + v] = acc[r][c];
                } else {
                    int g = 0;
                    i64 j = 0;
                    kiln_linear_locate(v, n0, n1, &g, &j);
                    kiln_linear_write(out, g, r, j, acc[r][c]);
                }
            }
        }
    }
}

// sum over s < splits of at[s * stride], in increasing s, the loads of a round issued
// before the adds (one load in flight at a time would serialize the splits' latency).
#define KILN_LINEAR_ROUND 8
__device__ __forceinline__ float kiln_linear_split_sum(const float* at, i64 stride, i64 splits) {
    float sum = at[0];
    for (i64 s0 = 1; s0 < splits; s0 += KILN_LINEAR_ROUND) {
        float part[KILN_LINEAR_ROUND];
#pragma unroll
        for (int u = 0; u < KILN_LINEAR_ROUND; ++u) {
            part[u] = s0 + u < splits ? at[(s0 + u) * stride] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < KILN_LINEAR_ROUND; ++u) {
            if (s0 + u < splits) sum += part[u];
        }
    }
    return sum;
}

// kiln_linear_split_sum of two columns (at and at + offset) in the same rounds of loads: each
// column's splits added in increasing order, so each sum has the bits of kiln_linear_split_sum.
__device__ __forceinline__ void kiln_linear_split_sum_pair(const float* at, i64 offset,
                                                           i64 stride, i64 splits, float* lo,
                                                           float* hi) {
    float sum_lo = at[0], sum_hi = at[offset];
    for (i64 s0 = 1; s0 < splits; s0 += KILN_LINEAR_ROUND) {
        float part_lo[KILN_LINEAR_ROUND], part_hi[KILN_LINEAR_ROUND];
#pragma unroll
        for (int u = 0; u < KILN_LINEAR_ROUND; ++u) {
            const bool in = s0 + u < splits;
            part_lo[u] = in ? at[(s0 + u) * stride] : 0.0f;
            part_hi[u] = in ? at[(s0 + u) * stride + offset] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < KILN_LINEAR_ROUND; ++u) {
            if (s0 + u < splits) {
                sum_lo += part_lo[u];
                sum_hi += part_hi[u];
            }
        }
    }
    *lo = sum_lo;
    *hi = sum_hi;
}

// Output (r, v) of a split launch (v < n0 with SwiGLU, else < n0 + n1 + n2) from `partial`
// ([splits][m][virtual columns], the main kernels' layout): the splits summed in increasing
// order, bias added, the epilogue applied. linear_reduce and the cluster finish both use it,
// so either gives the same bits.
__device__ __forceinline__ void kiln_linear_finish(const KilnLinearOut& out, const float* partial,
                                                   i64 r, i64 v, i64 n0, i64 n1, i64 n2, i64 m,
                                                   i64 splits, int swiglu) {
    const i64 n_virtual = swiglu ? 2 * n0 : n0 + n1 + n2;
    const float* at = partial + r * n_virtual + v;
    const i64 split_stride = m * n_virtual;
    if (swiglu) {  // gate's and up's splits in the same rounds
        float gate, up;
        kiln_linear_split_sum_pair(at, n0, split_stride, splits, &gate, &up);
        kiln_linear_write_swiglu(out, r, v, gate, up);
    } else {
        int g = 0;
        i64 j = 0;
        kiln_linear_locate(v, n0, n1, &g, &j);
        kiln_linear_write(out, g, r, j, kiln_linear_split_sum(at, split_stride, splits));
    }
}

// The RoPE and cache epilogue's outputs (see the header): bf16 caches [S,Hkv,Smax,D], the
// rope positions [B,T] (row r = b * seq + t), the cache positions [B] and rows (or null).
struct KilnLinearRope {
    float* q_rot;
    bf16_bits *k_cache, *v_cache;
    const i64 *rope_positions, *positions, *rows;
    i64 slots, seq, capacity, head_dim;
    float theta;
    int* fault;
};

// The struct from the kernels' parameters of those names (the signature checks of
// kernels/src/gpu/tests.rs read parameter lists as written).
#define KILN_LINEAR_ROPE                                                                     \
    const KilnLinearRope rope = {q_rot,  k_cache,  v_cache,  rope_positions, positions, rows, \
                                 slots,  seq,      capacity, head_dim,       theta,     fault}

// One output of a q/k/v launch with the RoPE and cache epilogue, as far as the kernel's inputs
// give it (kiln_linear_rope_item): everything but the partial sums. A cluster finds an item
// before its barrier; only the sums, the rotation and the stores follow the wait.
struct KilnLinearRopeItem {
    i64 at = -1;    // the item's column's first partial sum (lo's) in `partial`; < 0: none
    i64 half = 0;   // hi's column from lo's (D/2); 0 for a v column
    i64 dst = -1;  // into q_rot (group 0) or the item's cache; < 0: no store (padding row)
    int g = 0;     // the group: 0 q, 1 k, 2 v
    int has_lo = 0, has_hi = 0;
    float bias_lo = 0.0f, bias_hi = 0.0f;
    float cos_a = 0.0f, sin_a = 0.0f;
};

// Output (r, v) of a q/k/v launch with the RoPE and cache epilogue (v < n0 + n1 + n2), from
// `partial` as kiln_linear_finish reads it: column i < D/2 of a q or k head finishes its pair
// with column i + D/2 (which itself does nothing); a v column its element of the v cache.
__device__ __forceinline__ KilnLinearRopeItem kiln_linear_rope_item(const KilnLinearOut& out,
                                                                    const KilnLinearRope& rope,
                                                                    i64 r, i64 v, i64 n0, i64 n1,
                                                                    i64 n2) {
    KilnLinearRopeItem item;
    const i64 d = rope.head_dim, half = d / 2, seq = rope.seq;
    int g = 0;
    i64 j = 0;
    kiln_linear_locate(v, n0, n1, &g, &j);
    item.g = g;
    const bf16_bits* bias = g == 0 ? out.b0 : (g == 1 ? out.b1 : out.b2);
    const int has = g == 0 ? out.has_b0 : (g == 1 ? out.has_b1 : out.has_b2);
    if (g == 2) {
        item.at = r * (n0 + n1 + n2) + v;
        item.has_lo = has;
        if (has) item.bias_lo = kiln_bf16_to_f32(bias[j]);
        // y_2 [M, n2] viewed as [B,Hkv,T,D].
        const i64 heads = n2 / d, flat = r * n2 + j;
        const i64 b = flat / (heads * seq * d), h = (flat / (seq * d)) % heads;
        item.dst = kiln_cache_at(rope.positions, rope.rows, rope.slots, b, h, (flat / d) % seq,
                                 flat % d, heads, rope.capacity, seq, d, rope.fault);
        return item;
    }
    const i64 i = j % d;
    if (i >= half) return item;
    item.at = r * (n0 + n1 + n2) + v;
    item.half = half;
    item.has_lo = item.has_hi = has;
    if (has) {
        item.bias_lo = kiln_bf16_to_f32(bias[j]);
        item.bias_hi = kiln_bf16_to_f32(bias[j + half]);
    }
    const i64 position = rope.rope_positions[r];
    if (position < 0) kiln_raise(rope.fault);
    kiln_rope_angle(rope.theta, position, i, d, &item.cos_a, &item.sin_a);
    const i64 b = r / seq, t = r % seq, h = j / d;
    item.dst = g == 0 ? ((b * (n0 / d) + h) * seq + t) * d + i
                      : kiln_cache_at(rope.positions, rope.rows, rope.slots, b, h, t, i, n1 / d,
                                      rope.capacity, seq, d, rope.fault);
    return item;
}

// The item's sums over `splits` splits of `partial` (`split_stride` floats apart), its biases,
// its rotation and its stores.
__device__ __forceinline__ void kiln_linear_rope_finish(const KilnLinearRopeItem& item,
                                                        const KilnLinearRope& rope,
                                                        const float* partial, i64 split_stride,
                                                        i64 splits) {
    if (item.at < 0) return;
    if (item.g == 2) {
        float value = kiln_linear_split_sum(partial + item.at, split_stride, splits);
        if (item.has_lo) value = value + item.bias_lo;
        if (item.dst >= 0) kiln_store(rope.v_cache, item.dst, value);
        return;
    }
    float lo, hi;
    kiln_linear_split_sum_pair(partial + item.at, item.half, split_stride, splits, &lo, &hi);
    if (item.has_lo) lo = lo + item.bias_lo;
    if (item.has_hi) hi = hi + item.bias_hi;
    const float rotated_lo = kiln_rope_lo(lo, hi, item.cos_a, item.sin_a);
    const float rotated_hi = kiln_rope_hi(lo, hi, item.cos_a, item.sin_a);
    if (item.dst < 0) return;
    if (item.g == 0) {
        rope.q_rot[item.dst] = rotated_lo;
        rope.q_rot[item.dst + item.half] = rotated_hi;
    } else {
        kiln_store(rope.k_cache, item.dst, rotated_lo);
        kiln_store(rope.k_cache, item.dst + item.half, rotated_hi);
    }
}

// The y-th of gridDim.y contiguous shares of `count` outputs: [begin, end).
__device__ __forceinline__ void kiln_linear_cluster_share(i64 count, i64* begin, i64* end) {
    const i64 splits = gridDim.y;
    const i64 share = (count + splits - 1) / splits;
    *begin = (i64)blockIdx.y * share;
    *end = *begin + share < count ? *begin + share : count;
}

// The tile's virtual columns (a team's 4 columns each).
#define KILN_LINEAR_TILE ((i64)(blockDim.x / KILN_LINEAR_TEAM) * KILN_LINEAR_COLS)

// The finish of a split launch inside the kernel, with no reduce launch: the builder launches
// each column tile's gridDim.y splits as one cluster (at most 16 blocks, Hopper's limit).
// Once every block of the cluster has written its partial sums (kiln_cluster_sync orders
// them, in global memory, before the reads), block y finishes its share
// (kiln_linear_cluster_share) of the tile's m * width outputs (width = the tile's 128
// virtual columns, or its 64 outputs with SwiGLU), each by kiln_linear_finish. Every thread of
// the block calls it.
__device__ __forceinline__ void kiln_linear_cluster_finish(const KilnLinearOut& out,
                                                           const float* partial, i64 n0, i64 n1,
                                                           i64 n2, i64 m, int swiglu) {
    kiln_cluster_sync();
    const i64 n_out = swiglu ? n0 : n0 + n1 + n2;
    const i64 width = swiglu ? KILN_LINEAR_TILE / 2 : KILN_LINEAR_TILE;
    i64 begin = 0, end = 0;
    kiln_linear_cluster_share(m * width, &begin, &end);
    for (i64 i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const i64 v = (i64)blockIdx.x * width + i % width;
        if (v >= n_out) continue;
        kiln_linear_finish(out, partial, i / width, v, n0, n1, n2, m, gridDim.y, swiglu);
    }
}

// Output i of the cluster's tile (row i / tile) with the RoPE and cache epilogue.
__device__ __forceinline__ KilnLinearRopeItem kiln_linear_rope_tile_item(
    const KilnLinearOut& out, const KilnLinearRope& rope, i64 i, i64 n0, i64 n1, i64 n2) {
    const i64 v = (i64)blockIdx.x * KILN_LINEAR_TILE + i % KILN_LINEAR_TILE;
    if (v >= n0 + n1 + n2) return {};
    return kiln_linear_rope_item(out, rope, i / KILN_LINEAR_TILE, v, n0, n1, n2);
}

// kiln_linear_cluster_finish with the RoPE and cache epilogue: output i of the block's share
// by kiln_linear_rope_item and kiln_linear_rope_finish. A thread's first item (its only one
// while the share fits the block) is found before the cluster's barrier, since it reads the
// kernel's inputs alone. Measured (BENCHMARKS.md, thirty-third session): no faster at one row
// than finding it after the barrier, since the split that arrives last finds its items too.
__device__ __forceinline__ void kiln_linear_rope_cluster_finish(const KilnLinearOut& out,
                                                                const KilnLinearRope& rope,
                                                                const float* partial, i64 n0,
                                                                i64 n1, i64 n2, i64 m) {
    i64 begin = 0, end = 0;
    kiln_linear_cluster_share(m * KILN_LINEAR_TILE, &begin, &end);
    i64 i = begin + threadIdx.x;
    KilnLinearRopeItem item;
    if (i < end) item = kiln_linear_rope_tile_item(out, rope, i, n0, n1, n2);
    kiln_cluster_sync();
    const i64 split_stride = m * (n0 + n1 + n2);
    while (i < end) {
        kiln_linear_rope_finish(item, rope, partial, split_stride, gridDim.y);
        i += blockDim.x;
        if (i < end) item = kiln_linear_rope_tile_item(out, rope, i, n0, n1, n2);
    }
}

// The main kernel for one row (m = 1; more rows take linear_mma.cu). Unused groups have n = 0
// and any valid pointers; b_g is read only when has_b_g is nonzero; `partial` is written only
// with more than one split (gridDim.y > 1); with cluster_finish the launch's clusters are its
// column tiles' splits, which finish it (kiln_linear_cluster_finish), else linear_reduce does.

extern "C" __global__ void linear_r1(float* y0, float* y1, float* y2, float* partial,
                                     const bf16_bits* w0, const bf16_bits* w1, const bf16_bits* w2,
                                     const bf16_bits* b0, const bf16_bits* b1, const bf16_bits* b2,
                                     int has_b0, int has_b1, int has_b2, i64 n0, i64 n1, i64 n2,
                                     i64 ldo0, i64 ldo1, i64 ldo2, const void* x, int x_f32, i64 m,
                                     i64 k, i64 ldx, i64 split_k, i64 stage_k, int swiglu,
                                     int cluster_finish) {
    KILN_LINEAR_OUT;  // the body waits for the producers (kiln_linear_wait_once)
    kiln_linear_body<1, 4>(out, partial, w0, w1, w2, n0, n1, n2, x, x_f32, m, k, ldx,
                                split_k, stage_k, swiglu);
    if (cluster_finish) kiln_linear_cluster_finish(out, partial, n0, n1, n2, m, swiglu);
}

// linear_r1 of a q/k/v launch with the RoPE and cache epilogue, finished in its clusters (the
// builder launches it with k split into 2 to 16 ranges, one cluster per column tile). Bounded
// to two blocks of 256 threads per SM, as linear_r1 runs (the split rule counts on it): 113
// registers, no spills (111 unbounded; the bound keeps the occupancy when the body grows).
#define KILN_LINEAR_R1_BOUNDS __launch_bounds__(256, 2)
extern "C" __global__ void KILN_LINEAR_R1_BOUNDS linear_r1_rope(
    float* y0, float* y1, float* y2, float* partial, const bf16_bits* w0, const bf16_bits* w1,
    const bf16_bits* w2, const bf16_bits* b0, const bf16_bits* b1, const bf16_bits* b2,
    int has_b0, int has_b1, int has_b2, i64 n0, i64 n1, i64 n2, i64 ldo0, i64 ldo1, i64 ldo2,
    const void* x, int x_f32, i64 m, i64 k, i64 ldx, i64 split_k, i64 stage_k, float* q_rot,
    bf16_bits* k_cache, bf16_bits* v_cache, const i64* rope_positions, const i64* positions,
    const i64* rows, i64 slots, i64 seq, i64 capacity, i64 head_dim, float theta, int* fault) {
    KILN_LINEAR_OUT;
    KILN_LINEAR_ROPE;
    kiln_linear_body<1, 4>(out, partial, w0, w1, w2, n0, n1, n2, x, x_f32, m, k, ldx, split_k,
                           stage_k, 0);
    kiln_linear_rope_cluster_finish(out, rope, partial, n0, n1, n2, m);
}

extern "C" __global__ void linear_reduce(float* y0, float* y1, float* y2, const float* partial,
                                         const bf16_bits* b0, const bf16_bits* b1,
                                         const bf16_bits* b2, int has_b0, int has_b1,
                                         int has_b2, i64 n0, i64 n1, i64 n2, i64 ldo0, i64 ldo1,
                                         i64 ldo2, i64 m, i64 splits, int swiglu) {
    kiln_grid_dependency_wait();
    KILN_LINEAR_OUT;
    const i64 n_out = swiglu ? n0 : n0 + n1 + n2;
    KILN_FOR_EACH(i, m * n_out) {
        kiln_linear_finish(out, partial, i / n_out, i % n_out, n0, n1, n2, m, splits, swiglu);
    }
}

// linear_reduce of a q/k/v launch with the RoPE and cache epilogue (any main kernel's partial
// sums, one split's included).
extern "C" __global__ void linear_reduce_rope(const float* partial, const bf16_bits* b0,
                                              const bf16_bits* b1, const bf16_bits* b2,
                                              int has_b0, int has_b1, int has_b2, i64 n0, i64 n1,
                                              i64 n2, i64 m, i64 splits, float* q_rot,
                                              bf16_bits* k_cache, bf16_bits* v_cache,
                                              const i64* rope_positions, const i64* positions,
                                              const i64* rows, i64 slots, i64 seq, i64 capacity,
                                              i64 head_dim, float theta, int* fault) {
    kiln_grid_dependency_wait();
    const KilnLinearOut out = {nullptr, nullptr, nullptr, b0, b1, b2, has_b0, has_b1, has_b2,
                               0,       0,       0};
    KILN_LINEAR_ROPE;
    const i64 n_out = n0 + n1 + n2;
    KILN_FOR_EACH(i, m * n_out) {
        const KilnLinearRopeItem item =
            kiln_linear_rope_item(out, rope, i / n_out, i % n_out, n0, n1, n2);
        kiln_linear_rope_finish(item, rope, partial, m * n_out, splits);
    }
}

// linear_reduce with the residual add and RMSNorm of the next layer (a one-group `Linear` with
// add_rmsnorm, no SwiGLU): one block per row r of up to 1024 threads, one column each where
// n allows (the splits of a column summed in the rounds of kiln_linear_split_sum):
// sum[r, j] = (splits' sum + bias[j]) + residual[r, j], then normed[r, j] = (sum * rstd) *
// weight[j] with rstd from the row's sum of squares in a fixed order (the block's). The norm
// weight W is f32 or bf16. The bound keeps the registers within a block of 1024 threads
// (the builder's NORM_THREADS).
#define KILN_NORM_BOUNDS __launch_bounds__(1024)
template <typename W>
__device__ void kiln_linear_reduce_add_rmsnorm(float* sum_out, float* normed,
                                               const float* partial, const bf16_bits* bias,
                                               int has_bias, const float* residual,
                                               const W* weight, i64 n, i64 m, i64 splits,
                                               float eps) {
    __shared__ float scratch[KILN_WARP];
    const i64 r = blockIdx.x;
    if (r >= m) return;
    float squares = 0.0f;
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) {
        float y = kiln_linear_split_sum(partial + r * n + j, m * n, splits);
        if (has_bias) y += kiln_bf16_to_f32(bias[j]);
        const float s = y + residual[r * n + j];
        sum_out[r * n + j] = s;
        squares += s * s;
    }
    const float rstd = kiln_inverse_rms(kiln_block_sum(squares, scratch), n, eps);
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) {
        normed[r * n + j] = (sum_out[r * n + j] * rstd) * kiln_load(weight, j);
    }
}

extern "C" __global__ void KILN_NORM_BOUNDS linear_reduce_add_rmsnorm(
    float* sum_out, float* normed, const float* partial, const bf16_bits* bias, int has_bias,
    const float* residual, const float* weight, i64 n, i64 m, i64 splits, float eps) {
    kiln_grid_dependency_wait();
    kiln_linear_reduce_add_rmsnorm(sum_out, normed, partial, bias, has_bias, residual, weight, n,
                                   m, splits, eps);
}

extern "C" __global__ void KILN_NORM_BOUNDS linear_reduce_add_rmsnorm_bf16(
    float* sum_out, float* normed, const float* partial, const bf16_bits* bias, int has_bias,
    const float* residual, const bf16_bits* weight, i64 n, i64 m, i64 splits, float eps) {
    kiln_grid_dependency_wait();
    kiln_linear_reduce_add_rmsnorm(sum_out, normed, partial, bias, has_bias, residual, weight, n,
                                   m, splits, eps);
}
