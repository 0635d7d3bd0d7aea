// FlashAttention's backward (the FlashAttention-2 algorithm; the contract and the work split
// are flash.cu's, whose tiles, fragments and products it uses): Δ, dK and dV per key tile with
// their GQA reduce, then dQ per query tile.

// delta[b,h,t] = Σ_d r(dO[b,t,h,d]) · out[b,t,h,d]: one warp per row (B·Hq·T rows), lanes
// over d, the warp's butterfly sum. dO (G) is f32, or bf16 (already its rounding).
template <typename G>
__device__ void kiln_flash_delta(float* delta, const G* grad_out, const float* out, i64 q_heads,
                                 i64 q_len, i64 hd, i64 rows) {
    const i64 row = (i64)blockIdx.x * (blockDim.x / KILN_WARP) + threadIdx.x / KILN_WARP;
    if (row >= rows) return;
    const i64 bh = row / q_len, t = row % q_len;
    const i64 b = bh / q_heads, h = bh % q_heads;
    const i64 at = ((b * q_len + t) * q_heads + h) * hd;
    float sum = 0.0f;
    for (i64 d = threadIdx.x % KILN_WARP; d < hd; d += KILN_WARP) {
        sum += kiln_flash_rounded(grad_out, at + d) * out[at + d];
    }
    sum = kiln_warp_sum(sum);
    if (threadIdx.x % KILN_WARP == 0) delta[row] = sum;
}

extern "C" __global__ void flash_attention_backward_delta(float* delta, const float* grad_out,
                                                          const float* out, i64 q_heads,
                                                          i64 q_len, i64 hd, i64 rows) {
    kiln_grid_dependency_wait();
    kiln_flash_delta(delta, grad_out, out, q_heads, q_len, hd, rows);
}

extern "C" __global__ void flash_attention_backward_delta_bf16(float* delta,
                                                               const bf16_bits* grad_out,
                                                               const float* out, i64 q_heads,
                                                               i64 q_len, i64 hd, i64 rows) {
    kiln_grid_dependency_wait();
    kiln_flash_delta(delta, grad_out, out, q_heads, q_len, hd, rows);
}

// Block (b·Hq + h, key tile): 64 keys of h's KV head, each warp 16 of them, against every
// query tile of BR rows of head h that sees any of them, in order: the tile's q and dO
// staged (double-buffered), then Sᵀ, Pᵀ, dPᵀ, dSᵀ in registers, dV += Pᵀ·dO and dK +=
// dSᵀ·Q. Writes dK, dV of head h's view of the keys to grad_k, grad_v at (b·Hq + h)·S·hd.
template <int D>
__device__ __forceinline__ void kiln_flash_backward_kv(float* grad_k, float* grad_v,
                                                       const bf16_bits* q, const bf16_bits* k,
                                                       const bf16_bits* v,
                                                       const bf16_bits* grad_out, const float* lse,
                                                       const float* delta, i64 q_heads,
                                                       i64 kv_heads, i64 q_len, i64 kv_len,
                                                       i64 hd, float scale) {
    constexpr int BR = KilnFlashTiles<D>::BR;
    constexpr int TILE = BR * (D + KILN_FLASH_PAD);
    __shared__ __align__(16) bf16_bits qs[2 * TILE];
    __shared__ __align__(16) bf16_bits dos[2 * TILE];
    __shared__ float lse_s[2 * BR];
    __shared__ float delta_s[2 * BR];
    const i64 bh = blockIdx.x;
    const i64 b = bh / q_heads, h = bh % q_heads;
    const i64 kvh = b * kv_heads + h / (q_heads / kv_heads);
    const i64 k0 = (i64)blockIdx.y * KILN_FLASH_ROWS;
    const int warp = threadIdx.x / KILN_WARP, lane = threadIdx.x % KILN_WARP;
    const int t = lane % 4;
    const i64 key0 = k0 + 16 * warp + lane / 4, key1 = key0 + 8;
    const i64 offset = kv_len - q_len;
    const float scale2 = scale * KILN_LOG2E; // exp as exp2 (see the dQ kernel)

    // The first query row that sees key k0 (t >= k0 - offset), rounded down to a tile.
    const i64 first_row = k0 > offset ? k0 - offset : 0;
    const i64 first = first_row / BR * BR;
    const bf16_bits* q_head = q + bh * q_len * D;
    const bf16_bits* do_head = grad_out + bh * q_len * D;
    const float* lse_head = lse + bh * q_len;
    const float* delta_head = delta + bh * q_len;
    // A query tile's q, dO, lse and Δ (rows past q_len zeros), into buffer `buffer`.
    auto stage = [&](i64 r0, int buffer) {
        kiln_flash_tile<D, BR>(qs + buffer * TILE, q_head, r0, q_len);
        kiln_flash_tile<D, BR>(dos + buffer * TILE, do_head, r0, q_len);
        for (int r = threadIdx.x; r < BR; r += KILN_FLASH_THREADS) {
            const bool valid = r0 + r < q_len;
            kiln_cp_async4(lse_s + buffer * BR + r, lse_head + (valid ? r0 + r : 0), valid);
            kiln_cp_async4(delta_s + buffer * BR + r, delta_head + (valid ? r0 + r : 0), valid);
        }
    };
    if (first < q_len) stage(first, 0);
    kiln_cp_async_commit();

    unsigned int ka[D / 16][4], va[D / 16][4];
    kiln_flash_rows<D>(ka, k + kvh * kv_len * D, k0 + 16 * warp, kv_len);
    kiln_flash_rows<D>(va, v + kvh * kv_len * D, k0 + 16 * warp, kv_len);
    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
        dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
    }
    for (i64 r0 = first, tile = 0; r0 < q_len; r0 += BR, ++tile) {
        const int buffer = (int)(tile & 1);
        if (r0 + BR < q_len) stage(r0 + BR, buffer ^ 1);
        kiln_cp_async_commit();
        kiln_cp_async_wait<1>();
        __syncthreads();
        float p[BR / 8][4], ds[BR / 8][4];
        kiln_flash_qk<D, BR, false>(p, ka, qs + buffer * TILE);
        kiln_flash_qk<D, BR, false>(ds, va, dos + buffer * TILE);
        // Row r0 + r sees key iff r >= key - offset - r0 (and both exist). Every pair of the
        // tile is seen (block-uniform) when the block's last key is before the tile's first
        // row's limit: no masks.
        const bool full = k0 + KILN_FLASH_ROWS <= kv_len && r0 + BR <= q_len &&
                          k0 + KILN_FLASH_ROWS - 1 <= offset + r0;
        auto first_seeing = [&](i64 key) -> int {
            if (key >= kv_len) return BR; // no row
            const i64 r = key - offset - r0;
            return r < 0 ? 0 : (r > BR ? BR : (int)r);
        };
        const int from0 = full ? 0 : first_seeing(key0), from1 = full ? 0 : first_seeing(key1);
        const int rows = full ? BR : (q_len - r0 < BR ? (int)(q_len - r0) : BR);
        const float* tile_lse = lse_s + buffer * BR;
        const float* tile_delta = delta_s + buffer * BR;
#pragma unroll
        for (int i = 0; i < BR / 8; ++i) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int r = 8 * i + 2 * t + (c & 1);
                const bool seen = r < rows && r >= (c < 2 ? from0 : from1);
                const float prob =
                    seen ? kiln_exp2_approx(fmaf(p[i][c], scale2, -tile_lse[r] * KILN_LOG2E))
                         : 0.0f;
                p[i][c] = prob;
                ds[i][c] = seen ? prob * (ds[i][c] - tile_delta[r]) * scale : 0.0f;
            }
        }
        kiln_flash_pv<BR, D>(dv, p, dos + buffer * TILE);
        kiln_flash_pv<BR, D>(dk, ds, qs + buffer * TILE);
        __syncthreads();
    }
    float* gk = grad_k + bh * kv_len * hd;
    float* gv = grad_v + bh * kv_len * hd;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const i64 key = c < 2 ? key0 : key1;
            const int d = 8 * n + 2 * t + (c & 1);
            if (key < kv_len && d < hd) {
                gk[key * hd + d] = dk[n][c];
                gv[key * hd + d] = dv[n][c];
            }
        }
    }
}

// grad_k, grad_v [B,Hkv,S,hd] = the sums, in head order, of the `group` query heads' partial
// dK, dV [B,Hq,S,hd] (head j·group + e of KV head j).
extern "C" __global__ void flash_attention_backward_reduce(float* grad_k, float* grad_v,
                                                           const float* partial_k,
                                                           const float* partial_v, i64 group,
                                                           i64 per_head, i64 n) {
    kiln_grid_dependency_wait();
    KILN_FOR_EACH(i, n) {
        const i64 head = i / per_head, r = i % per_head;
        const float* pk = partial_k + head * group * per_head + r;
        const float* pv = partial_v + head * group * per_head + r;
        float sk = 0.0f, sv = 0.0f;
        for (i64 e = 0; e < group; ++e) {
            sk += pk[e * per_head];
            sv += pv[e * per_head];
        }
        grad_k[i] = sk;
        grad_v[i] = sv;
    }
}

// Block (b·Hq + h, query tile): 64 query rows, each warp 16; key tiles of N up to the causal
// limit (double-buffered): S, P, dP, dS in registers, then dQ += dS·K.
template <int D>
__device__ __forceinline__ void kiln_flash_backward_q(float* grad_q, const bf16_bits* q,
                                                      const bf16_bits* k, const bf16_bits* v,
                                                      const bf16_bits* grad_out, const float* lse,
                                                      const float* delta, i64 q_heads,
                                                      i64 kv_heads, i64 q_len, i64 kv_len, i64 hd,
                                                      float scale) {
    constexpr int N = KilnFlashTiles<D>::N;
    constexpr int TILE = N * (D + KILN_FLASH_PAD);
    __shared__ __align__(16) bf16_bits ks[2 * TILE];
    __shared__ __align__(16) bf16_bits vs[2 * TILE];
    const i64 bh = blockIdx.x;
    const i64 b = bh / q_heads, h = bh % q_heads;
    const i64 kvh = b * kv_heads + h / (q_heads / kv_heads);
    const i64 q0 = (i64)(gridDim.y - 1 - blockIdx.y) * KILN_FLASH_ROWS;
    const int warp = threadIdx.x / KILN_WARP, lane = threadIdx.x % KILN_WARP;
    const int t = lane % 4;
    const i64 row0 = q0 + 16 * warp + lane / 4, row1 = row0 + 8;
    const i64 offset = kv_len - q_len;

    i64 limit = offset + q0 + KILN_FLASH_ROWS;
    limit = limit < kv_len ? limit : kv_len;
    const bf16_bits* k_head = k + kvh * kv_len * D;
    const bf16_bits* v_head = v + kvh * kv_len * D;
    kiln_flash_tile<D, N>(ks, k_head, 0, kv_len);
    kiln_flash_tile<D, N>(vs, v_head, 0, kv_len);
    kiln_cp_async_commit();

    unsigned int qa[D / 16][4], doa[D / 16][4];
    kiln_flash_rows<D>(qa, q + bh * q_len * D, q0 + 16 * warp, q_len);
    kiln_flash_rows<D>(doa, grad_out + bh * q_len * D, q0 + 16 * warp, q_len);
    // exp(score·scale − lse) as exp2(score·scale·log2 e − lse·log2 e).
    const float scale2 = scale * KILN_LOG2E;
    const float lse0 = row0 < q_len ? lse[bh * q_len + row0] * KILN_LOG2E : 0.0f;
    const float lse1 = row1 < q_len ? lse[bh * q_len + row1] * KILN_LOG2E : 0.0f;
    const float delta0 = row0 < q_len ? delta[bh * q_len + row0] : 0.0f;
    const float delta1 = row1 < q_len ? delta[bh * q_len + row1] : 0.0f;
    float dq[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

    for (i64 n0 = 0, tile = 0; n0 < limit; n0 += N, ++tile) {
        const int buffer = (int)(tile & 1);
        if (n0 + N < limit) {
            kiln_flash_tile<D, N>(ks + (buffer ^ 1) * TILE, k_head, n0 + N, kv_len);
            kiln_flash_tile<D, N>(vs + (buffer ^ 1) * TILE, v_head, n0 + N, kv_len);
        }
        kiln_cp_async_commit();
        kiln_cp_async_wait<1>();
        __syncthreads();
        float p[N / 8][4], ds[N / 8][4];
        kiln_flash_qk<D, N, false>(p, qa, ks + buffer * TILE);
        kiln_flash_qk<D, N, false>(ds, doa, vs + buffer * TILE);
        const bool full = n0 + N <= kv_len && n0 + N - 1 <= offset + q0;
        const int last0 = full ? N - 1 : kiln_flash_last_key(row0, offset, n0, kv_len, N);
        const int last1 = full ? N - 1 : kiln_flash_last_key(row1, offset, n0, kv_len, N);
#pragma unroll
        for (int i = 0; i < N / 8; ++i) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                // Rows past q_len have zero q and dO, and lse = Δ = 0: their dS is 0 and they
                // are never written.
                const int key = 8 * i + 2 * t + (c & 1);
                const bool seen = key <= (c < 2 ? last0 : last1);
                const float l = c < 2 ? lse0 : lse1, dl = c < 2 ? delta0 : delta1;
                const float prob = seen ? kiln_exp2_approx(fmaf(p[i][c], scale2, -l)) : 0.0f;
                ds[i][c] = seen ? prob * (ds[i][c] - dl) * scale : 0.0f;
            }
        }
        kiln_flash_pv<N, D>(dq, ds, ks + buffer * TILE);
        __syncthreads();
    }
    float* gq = grad_q + bh * q_len * hd;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const i64 row = c < 2 ? row0 : row1;
            const int d = 8 * n + 2 * t + (c & 1);
            if (row < q_len && d < hd) gq[row * hd + d] = dq[n][c];
        }
    }
}

// The backward's entry points, the dK/dV and the dQ kernel per head dim (the argument checks
// of kernels/src/gpu/tests.rs expand the macro and read these signatures); q, k, v, grad_out
// are the staged copies.
#define KILN_FLASH_BACKWARD_ENTRY(kv_name, q_name, D)                                             \
    extern "C" __global__ void kv_name(                                                         \
        float* grad_k, float* grad_v, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, \
        const bf16_bits* grad_out, const float* lse, const float* delta, i64 q_heads,           \
        i64 kv_heads, i64 q_len, i64 kv_len, i64 hd, float scale) {                             \
        kiln_grid_dependency_wait();                                                            \
        kiln_flash_backward_kv<D>(grad_k, grad_v, q, k, v, grad_out, lse, delta, q_heads,       \
                                  kv_heads, q_len, kv_len, hd, scale);                          \
    }                                                                                           \
    extern "C" __global__ void q_name(                                                          \
        float* grad_q, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,              \
        const bf16_bits* grad_out, const float* lse, const float* delta, i64 q_heads,           \
        i64 kv_heads, i64 q_len, i64 kv_len, i64 hd, float scale) {                             \
        kiln_grid_dependency_wait();                                                            \
        kiln_flash_backward_q<D>(grad_q, q, k, v, grad_out, lse, delta, q_heads, kv_heads,      \
                                 q_len, kv_len, hd, scale);                                     \
    }
KILN_FLASH_BACKWARD_ENTRY(flash_attention_backward_kv_d16, flash_attention_backward_q_d16, 16)
KILN_FLASH_BACKWARD_ENTRY(flash_attention_backward_kv_d32, flash_attention_backward_q_d32, 32)
KILN_FLASH_BACKWARD_ENTRY(flash_attention_backward_kv_d64, flash_attention_backward_q_d64, 64)
KILN_FLASH_BACKWARD_ENTRY(flash_attention_backward_kv_d128, flash_attention_backward_q_d128, 128)
