// Attention over a bf16 KV cache on tensor cores: decode.cu's split kernel (one block per chunk
// of cache rows of one KV head and one query row; partials [B,Hq,T,splits,D+2] f32 as (m, l,
// acc[0..D]), which decode.cu's cached_attention_combine_f32 combines) with its two products
// as m16n8k16 mma.sync. The function stays decode.cu's, in f32: q and the probabilities are
// f32, and each enters the mma as three bf16 terms, x = hi + mid + lo (hi = r(x), mid =
// r(x − hi), lo = r(x − hi − mid), each difference exact in f32), so each product with a bf16
// key or value element is exact and only the order of the f32 sums differs from the CPU's.
//
// One warp per block (chunk, KV head, b·T + t), the chunk's keys and values in shared memory
// (cp.async, 16-byte rows padded by 8 elements, zeros past the visible keys). The group's
// query heads are the A operand's rows (up to 16; zeros past the group), the keys its columns:
//   S = Q·Kᵀ   C/8 tiles of 8 keys, k = D; scores·scale, −inf past the visible keys;
//   per head   m = max, p = exp(s − m), l = Σ p (a quad's lanes, then butterflies);
//   O = P·V    D/8 tiles of 8 dims, k = C, V through ldmatrix.trans; written unnormalized.
// The rows below the position are staged before the wait for the kernel before (decode.cu
// says why that is safe); q, the fault word and the partials come after it.
//
// Non-finite inputs: a term of an infinity is NaN (inf − inf), and a zero term times an
// infinite key or value element is NaN where f32 gives ±inf. A block whose q rows or visible
// keys and values hold an infinity or a NaN computes its chunk on the CUDA cores instead, with
// decode.cu's arithmetic, so such values reach the outputs they reach on the CPU.

#define KILN_DECODE_MMA_PAD 8

// Keys per chunk: kiln_kernels::gpu::decode::key_chunk (4096 / D, at most 64).
template <int D> struct KilnDecodeMma {
    static constexpr int C = D > 64 ? 32 : 64;
    static constexpr int STRIDE = D + KILN_DECODE_MMA_PAD;
};

// Chunk rows [from, to) of a [rows][D] bf16 matrix (`src` at the chunk's first row) into a
// shared tile, by cp.async; rows at or past `count` are zeros and not read.
template <int D, int C>
__device__ __forceinline__ void kiln_decode_mma_rows(bf16_bits* dst, const bf16_bits* src,
                                                     int from, int to, int count) {
    constexpr int VECTORS = D / 8; // 16-byte vectors per row
    for (int i = from * VECTORS + threadIdx.x; i < to * VECTORS; i += KILN_WARP) {
        const int r = i / VECTORS, c = i % VECTORS;
        const bool valid = r < count;
        kiln_cp_async16(dst + r * KilnDecodeMma<D>::STRIDE + 8 * c,
                        src + (valid ? r * D + 8 * c : 0), valid);
    }
}

__device__ __forceinline__ bool kiln_decode_mma_special(float x) {
    return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}

// Either bf16 of a word is an infinity or a NaN.
__device__ __forceinline__ bool kiln_decode_mma_special(unsigned int w) {
    return (w & 0x7f80u) == 0x7f80u || (w & 0x7f800000u) == 0x7f800000u;
}

__device__ __forceinline__ float kiln_decode_mma_round(float x) {
    return kiln_bf16_to_f32(kiln_f32_to_bf16(x));
}

// Two finite f32 as three bf16x2 words whose sums are theirs: part[0] = r(x), part[1] =
// r(x − part 0), part[2] = r(x − part 0 − part 1).
__device__ __forceinline__ void kiln_decode_mma_terms(float x0, float x1,
                                                      unsigned int (&part)[3][4], int e) {
    const float h0 = kiln_decode_mma_round(x0), h1 = kiln_decode_mma_round(x1);
    const float r0 = x0 - h0, r1 = x1 - h1;
    const float m0 = kiln_decode_mma_round(r0), m1 = kiln_decode_mma_round(r1);
    part[0][e] = kiln_mma_pack(h0, h1);
    part[1][e] = kiln_mma_pack(m0, m1);
    part[2][e] = kiln_mma_pack(r0 - m0, r1 - m1);
}

__device__ __forceinline__ void kiln_decode_mma_terms_product(float (&acc)[4],
                                                              const unsigned int (&a)[3][4],
                                                              unsigned int b0, unsigned int b1) {
#pragma unroll
    for (int term = 0; term < 3; ++term) {
        kiln_mma_bf16(acc, a[term][0], a[term][1], a[term][2], a[term][3], b0, b1);
    }
}

// The chunk on the CUDA cores (decode.cu's arithmetic): one lane per (head, key) score, then
// per head its max, exponentials and sum, then one lane per (head, d) of p · v.
template <int D>
__device__ __forceinline__ void kiln_decode_mma_scalar(float* out, i64 out_stride, float* scores,
                                                       const float* q_rows, i64 head_stride,
                                                       const bf16_bits* ks,
                                                       const bf16_bits* vs, int group,
                                                       int count, float scale) {
    constexpr int C = KilnDecodeMma<D>::C, STRIDE = KilnDecodeMma<D>::STRIDE;
    const int lane = threadIdx.x;
    for (int i = lane; i < group * count; i += KILN_WARP) {
        const int h = i / count, key = i % count;
        const float* q_row = q_rows + h * head_stride;
        const bf16_bits* k_row = ks + key * STRIDE;
        float sums[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int d = 0; d < D; d += 4) {
#pragma unroll
            for (int u = 0; u < 4; ++u) sums[u] += q_row[d + u] * kiln_bf16_to_f32(k_row[d + u]);
        }
        scores[h * C + key] = ((sums[0] + sums[1]) + (sums[2] + sums[3])) * scale;
    }
    __syncthreads();
    for (int h = 0; h < group; ++h) {
        float* s = scores + h * C;
        float m = -__int_as_float(0x7f800000);
        for (int key = lane; key < count; key += KILN_WARP) m = kiln_max(m, s[key]);
        m = kiln_warp_max(m);
        float l = 0.0f;
        for (int key = lane; key < count; key += KILN_WARP) {
            const float p = expf(s[key] - m);
            s[key] = p;
            l += p;
        }
        l = kiln_warp_sum(l);
        if (lane == 0) {
            out[h * out_stride] = m;
            out[h * out_stride + 1] = l;
        }
    }
    __syncthreads();
    for (int i = lane; i < group * D; i += KILN_WARP) {
        const int h = i / D, d = i % D;
        const float* p = scores + h * C;
        float sums[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int key = 0;
        for (; key + 4 <= count; key += 4) {
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                sums[u] += p[key + u] * kiln_bf16_to_f32(vs[(key + u) * STRIDE + d]);
            }
        }
        for (; key < count; ++key) sums[0] += p[key] * kiln_bf16_to_f32(vs[key * STRIDE + d]);
        out[h * out_stride + 2 + d] = (sums[0] + sums[1]) + (sums[2] + sums[3]);
    }
}

template <int D>
__device__ __forceinline__ void kiln_decode_mma_split(float* partials, const float* q,
                                                      const bf16_bits* k_cache,
                                                      const bf16_bits* v_cache,
                                                      const i64* positions, const i64* rows,
                                                      i64 slots, i64 q_heads, i64 kv_heads,
                                                      i64 q_len, i64 capacity, float scale,
                                                      int* fault) {
    constexpr int C = KilnDecodeMma<D>::C, STRIDE = KilnDecodeMma<D>::STRIDE;
    __shared__ __align__(16) bf16_bits ks[C * STRIDE];
    __shared__ __align__(16) bf16_bits vs[C * STRIDE];
    __shared__ float scores[16 * C]; // the CUDA-core path's
    const i64 split = blockIdx.x, kv = blockIdx.y, row = blockIdx.z;
    const i64 splits = gridDim.x;
    const i64 b = row / q_len, t_row = row % q_len;
    const int group = (int)(q_heads / kv_heads);
    // decode.cu's bounds: a bad position or slot raises the fault word, the clamp keeps every
    // read inside the cache, a padding row (or a bad slot) reads no key.
    const i64 slot = kiln_slot(rows, b, slots);
    const i64 kv_first = ((slot < 0 ? 0 : slot) * kv_heads + kv) * capacity * D;
    const i64 position = positions[b];
    const bool bad = position < 0 || position + q_len > capacity || slot == KILN_BAD_SLOT;
    i64 visible = slot < 0 ? 0 : position + t_row + 1;
    visible = visible < 0 ? 0 : (visible > capacity ? capacity : visible);
    const i64 first = split * C;
    const int count = (int)(visible > first ? (visible - first < C ? visible - first : C) : 0);
    const bf16_bits* k_chunk = k_cache + kv_first + first * D;
    const bf16_bits* v_chunk = v_cache + kv_first + first * D;
    const i64 below = position - first; // rows of the chunk below the position
    const int settled = (int)(below < 0 ? 0 : (below < count ? below : count));
    kiln_decode_mma_rows<D, C>(ks, k_chunk, 0, settled, count);
    kiln_decode_mma_rows<D, C>(vs, v_chunk, 0, settled, count);
    kiln_grid_dependency_wait();
    if (bad && threadIdx.x == 0) kiln_raise(fault);
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    // Head h of the group: its partial at out + h · out_stride.
    float* out = partials + (((b * q_heads + kv * group) * q_len + t_row) * splits + split) *
                                (D + 2);
    const i64 out_stride = q_len * splits * (D + 2);
    if (count == 0) { // no key: m = −inf, l = 0, acc = 0, as decode.cu's empty chunk
        for (int i = lane; i < group * (D + 2); i += KILN_WARP) {
            const int h = i / (D + 2), e = i % (D + 2);
            out[h * out_stride + e] = e == 0 ? -__int_as_float(0x7f800000) : 0.0f;
        }
        return;
    }
    kiln_decode_mma_rows<D, C>(ks, k_chunk, settled, C, count);
    kiln_decode_mma_rows<D, C>(vs, v_chunk, settled, C, count);
    kiln_cp_async_commit();
    kiln_cp_async_wait<0>();
    __syncthreads();

    const i64 head_stride = q_len * D;
    const float* q_rows = q + ((b * q_heads + kv * group) * q_len + t_row) * D;
    bool special = false;
    for (int i = lane; i < group * D; i += KILN_WARP) {
        special |= kiln_decode_mma_special(q_rows[(i / D) * head_stride + i % D]);
    }
    for (int i = lane; i < count * (D / 8); i += KILN_WARP) {
        const int r = i / (D / 8), c = i % (D / 8);
        const uint4 kw = *(const uint4*)(ks + r * STRIDE + 8 * c);
        const uint4 vw = *(const uint4*)(vs + r * STRIDE + 8 * c);
        special |= kiln_decode_mma_special(kw.x) || kiln_decode_mma_special(kw.y) ||
                   kiln_decode_mma_special(kw.z) || kiln_decode_mma_special(kw.w) ||
                   kiln_decode_mma_special(vw.x) || kiln_decode_mma_special(vw.y) ||
                   kiln_decode_mma_special(vw.z) || kiln_decode_mma_special(vw.w);
    }
    if (kiln_warp_max(special ? 1.0f : 0.0f) != 0.0f) {
        kiln_decode_mma_scalar<D>(out, out_stride, scores, q_rows, head_stride, ks, vs, group, count, scale);
        return;
    }

    // S = Q·Kᵀ: lane (g, t) holds heads g (c0, c1) and g + 8 (c2, c3), keys 8j + 2t (+1).
    float s[C / 8][4];
#pragma unroll
    for (int j = 0; j < C / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    const float* q_g = q_rows + g * head_stride;
    const float* q_g8 = q_rows + (g + 8) * head_stride;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const int d = 16 * kk + 2 * t;
        unsigned int a[3][4];
        kiln_decode_mma_terms(g < group ? q_g[d] : 0.0f, g < group ? q_g[d + 1] : 0.0f, a, 0);
        kiln_decode_mma_terms(g + 8 < group ? q_g8[d] : 0.0f,
                              g + 8 < group ? q_g8[d + 1] : 0.0f, a, 1);
        kiln_decode_mma_terms(g < group ? q_g[d + 8] : 0.0f,
                              g < group ? q_g[d + 9] : 0.0f, a, 2);
        kiln_decode_mma_terms(g + 8 < group ? q_g8[d + 8] : 0.0f,
                              g + 8 < group ? q_g8[d + 9] : 0.0f, a, 3);
#pragma unroll
        for (int j = 0; j < C / 8; ++j) {
            const bf16_bits* k_row = ks + (8 * j + g) * STRIDE + d;
            kiln_decode_mma_terms_product(s[j], a, *(const unsigned int*)k_row,
                                          *(const unsigned int*)(k_row + 8));
        }
    }
    const float neg_inf = -__int_as_float(0x7f800000);
    float m0 = neg_inf, m1 = neg_inf;
#pragma unroll
    for (int j = 0; j < C / 8; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int key = 8 * j + 2 * t + (c & 1);
            s[j][c] = key < count ? s[j][c] * scale : neg_inf;
        }
        m0 = kiln_max(m0, kiln_max(s[j][0], s[j][1]));
        m1 = kiln_max(m1, kiln_max(s[j][2], s[j][3]));
    }
    m0 = kiln_max(m0, kiln_shfl_xor(m0, 1));
    m0 = kiln_max(m0, kiln_shfl_xor(m0, 2));
    m1 = kiln_max(m1, kiln_shfl_xor(m1, 1));
    m1 = kiln_max(m1, kiln_shfl_xor(m1, 2));
    float l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int j = 0; j < C / 8; ++j) {
        s[j][0] = expf(s[j][0] - m0);
        s[j][1] = expf(s[j][1] - m0);
        s[j][2] = expf(s[j][2] - m1);
        s[j][3] = expf(s[j][3] - m1);
        l0 += s[j][0] + s[j][1];
        l1 += s[j][2] + s[j][3];
    }
    l0 += kiln_shfl_xor(l0, 1);
    l0 += kiln_shfl_xor(l0, 2);
    l1 += kiln_shfl_xor(l1, 1);
    l1 += kiln_shfl_xor(l1, 2);

    // O = P·V: the probabilities' accumulator tiles 2kk, 2kk + 1 are the A fragments of k16
    // step kk (keys 16kk..16kk + 15); V's fragments by ldmatrix.trans, as flash.cu's P·V.
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    const int row_in = (lane & 7) + ((lane >> 3) & 1) * 8, col_in = (lane >> 4) * 8;
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk) {
        unsigned int a[3][4];
        kiln_decode_mma_terms(s[2 * kk][0], s[2 * kk][1], a, 0);
        kiln_decode_mma_terms(s[2 * kk][2], s[2 * kk][3], a, 1);
        kiln_decode_mma_terms(s[2 * kk + 1][0], s[2 * kk + 1][1], a, 2);
        kiln_decode_mma_terms(s[2 * kk + 1][2], s[2 * kk + 1][3], a, 3);
#pragma unroll
        for (int n = 0; n < D / 16; ++n) {
            unsigned int bs[4];
            kiln_ldmatrix_x4_trans(bs, vs + (16 * kk + row_in) * STRIDE + 16 * n + col_in);
            kiln_decode_mma_terms_product(o[2 * n], a, bs[0], bs[1]);
            kiln_decode_mma_terms_product(o[2 * n + 1], a, bs[2], bs[3]);
        }
    }
    float* out_g = out + g * out_stride;
    float* out_g8 = out + (g + 8) * out_stride;
    if (t == 0) {
        if (g < group) {
            out_g[0] = m0;
            out_g[1] = l0;
        }
        if (g + 8 < group) {
            out_g8[0] = m1;
            out_g8[1] = l1;
        }
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        const int d = 8 * n + 2 * t;
        if (g < group) {
            out_g[2 + d] = o[n][0];
            out_g[3 + d] = o[n][1];
        }
        if (g + 8 < group) {
            out_g8[2 + d] = o[n][2];
            out_g8[3 + d] = o[n][3];
        }
    }
}

// The entry points, one per head dim (64 and 128); blocks of one warp.
extern "C" __global__ void cached_attention_split_mma_d64(
    float* partials, const float* q, const bf16_bits* k_cache, const bf16_bits* v_cache,
    const i64* positions, const i64* rows, i64 slots, i64 q_heads, i64 kv_heads, i64 q_len,
    i64 capacity, float scale, int* fault) {
    // The body waits once the rows nothing writes are staged.
    kiln_decode_mma_split<64>(partials, q, k_cache, v_cache, positions, rows, slots, q_heads,
                              kv_heads, q_len, capacity, scale, fault);
}

extern "C" __global__ void cached_attention_split_mma_d128(
    float* partials, const float* q, const bf16_bits* k_cache, const bf16_bits* v_cache,
    const i64* positions, const i64* rows, i64 slots, i64 q_heads, i64 kv_heads, i64 q_len,
    i64 capacity, float scale, int* fault) {
    // The body waits once the rows nothing writes are staged.
    kiln_decode_mma_split<128>(partials, q, k_cache, v_cache, positions, rows, slots, q_heads,
                               kv_heads, q_len, capacity, scale, fault);
}
