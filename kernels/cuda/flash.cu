// FlashAttention (the FlashAttention-2 algorithm) on tensor cores: causal GQA attention that
// never writes its probabilities. The contract is kernels/src/attention/flash.rs's: q, k, v
// and dO are f32 in the program (or bf16: already that rounding), rounded to bf16 where they
// enter an mma, with f32 accumulation; the forward keeps each query row's log-sum-exp, the
// backward rebuilds the probabilities block by block from it and rounds P and dS to bf16
// where they enter products. The forward also rounds to f16 instead (the F16 instances: bf16
// inference's prefill, kernels/src/attention/flash.rs): q, k, v staged as f16 rows, P rounded
// to f16, the f16 mma; its tiles and fragments are bf16's, 16-bit elements either way.
//
// Layouts: q [B,Hq,T,hd], k and v [B,Hkv,S,hd], out and dO [B,T,Hq,hd], lse and delta
// [B,Hq,T] (f32), grad_q [B,Hq,T,hd], grad_k and grad_v [B,Hkv,S,hd]. Query t sits at
// position S - T + t and sees keys 0..=that.
//
// Staging. flash_attention_stage first writes each operand as bf16 (f16) rows of D elements (D =
// the template's head dim, 16, 32, 64 or 128, >= hd; zeros past hd), dO re-laid as
// [B,Hq,T,D]; a bf16 (f16) q, k or v of hd = D is that already and is read where it is. So every
// tile kernel reads whole, aligned 16-byte rows: tiles go to shared memory by cp.async
// (double-buffered: the next tile's copy is issued before the current one is multiplied), and
// a warp's own 16 rows go to registers as A fragments once.
//
// Work split. Every tile kernel has 4 warps (the two-group forward 8: two groups of 4), each
// warp owning 16 rows of the block's tile as the A operand's rows, and the block (or group)
// walks the other axis in tiles:
//   forward  (B·Hq, T/64): S = Q·Kᵀ, online softmax, O += P·V over key tiles of N (or two
//            groups of 4 warps over every other key tile, merged at the end, for small grids);
//   delta    Δ = rowsum(r(dO) ∘ out), one warp per row;
//   dK, dV   (B·Hq, S/64): for each query tile of BR that sees the block's keys, Sᵀ = K·Qᵀ,
//            Pᵀ = exp(Sᵀ·scale − lse), dPᵀ = V·dOᵀ, dSᵀ = Pᵀ(dPᵀ − Δ)·scale, dV += Pᵀ·dO,
//            dK += dSᵀ·Q — one query head per block, so a GQA group's heads write partial
//            dK, dV that flash_attention_backward_reduce sums in head order;
//   dQ       (B·Hq, T/64): over key tiles of N, S, P, dP, dS again, dQ += dS·K.
// dQ is its own pass (recomputing S and dP) so that no two blocks add into one row: no
// atomics, a fixed order of every sum, the same bits on every run. A probability tile leaves
// its accumulators as the next mma's A operand (the accumulator layout of two n8 tiles is the
// A layout of one k16 step); the B operands that are row-major tiles read as K x N (V in P·V,
// dO, Q and K in the backward) come through ldmatrix.trans.
//
// Non-finite inputs: masked pairs get P and dS exactly 0 (selected, never multiplied), but a
// tile's next product still multiplies them, so a NaN or infinity in a masked key's v (the
// forward's P·V), or in q, k or dO (the backward's dSᵀ·Q, dS·K and Pᵀ·dO) can reach rows that
// must not see it, as in the GEMM attention (kernels/src/gpu/attention.rs).
//
// Shared memory rows are padded by 8 bf16 (16 bytes): a row of 64 + 8 elements is 36 words, so
// the fragment reads (row g, word t) and ldmatrix's 8-row phases fall in distinct banks.
//
// Primitives. mma.sync, ldmatrix, cp.async, the bf16x2 conversion and ex2.approx are mma.cuh's:
// inline PTX on NVIDIA, an emulation under hipRTC (or NVRTC with KILN_PORTABLE_MMA), where the
// copies are synchronous and the products within f32 rounding of the tensor cores'. Warps are
// groups of 32 lanes (threadIdx.x / 32) on either path: every exchange within one goes through
// common.cuh's width-32 shuffles, so a 64-lane wavefront holds two of them. The kernel bodies
// are __forceinline__ so that each static __shared__ tile belongs to the one kernel that calls
// it: hipRTC's compiler puts the shared arrays of functions it does not inline into one block
// that every kernel of the module allocates (hundreds of KB here, against gfx90a's 64 KB per
// block).

#define KILN_FLASH_THREADS 128 // 4 warps (a group of them in the two-group forward)
#define KILN_FLASH_ROWS 64     // the block's own rows: 16 per warp
#define KILN_FLASH_PAD 8
#define KILN_LOG2E 1.4426950408889634f
#define KILN_LN2 0.6931471805599453f

__device__ __forceinline__ float kiln_flash_neg_inf() { return -__int_as_float(0x7f800000); }

// A bf16 pair as one fragment word (index even: 4-byte aligned).
__device__ __forceinline__ unsigned int kiln_flash_word(const bf16_bits* p) {
    return *(const unsigned int*)p;
}

// Rows [first, first + R) of a [count][D] bf16 matrix (staged, or an operand already so) into a
// shared tile [R][D + pad]
// (rows past count zero-filled), issued as cp.async by 128 threads, this one `thread` of them:
// the whole block, or one warp group of the two-group forward.
template <int D, int R>
__device__ __forceinline__ void kiln_flash_tile(bf16_bits* dst, const bf16_bits* src, i64 first,
                                                i64 count, int thread = threadIdx.x) {
    constexpr int CHUNKS = D / 8; // 16-byte chunks per row
    for (int i = thread; i < R * CHUNKS; i += KILN_FLASH_THREADS) {
        const int r = i / CHUNKS, c = i % CHUNKS;
        const bool valid = first + r < count;
        kiln_cp_async16(dst + r * (D + KILN_FLASH_PAD) + 8 * c,
                        src + (valid ? (first + r) * D + 8 * c : 0), valid);
    }
}

// The A fragments of this warp's 16 rows (first..) of a staged [count][D] bf16 matrix, for
// every k16 step: frag[kk][0..4] as the mma's a0..a3; missing rows are zeros.
template <int D>
__device__ __forceinline__ void kiln_flash_rows(unsigned int (&frag)[D / 16][4],
                                                const bf16_bits* src, i64 first, i64 count) {
    const int lane = threadIdx.x % KILN_WARP, g = lane / 4, t = lane % 4;
    const i64 r0 = first + g, r1 = first + g + 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const int d = 16 * kk + 2 * t;
        frag[kk][0] = r0 < count ? kiln_flash_word(src + r0 * D + d) : 0u;
        frag[kk][1] = r1 < count ? kiln_flash_word(src + r1 * D + d) : 0u;
        frag[kk][2] = r0 < count ? kiln_flash_word(src + r0 * D + d + 8) : 0u;
        frag[kk][3] = r1 < count ? kiln_flash_word(src + r1 * D + d + 8) : 0u;
    }
}

// acc[j] = A (16 rows, frags over D) · Bᵀ for N / 8 tiles of 8 columns, column n of tile j
// being row 8j + n of the shared tile `b` ([N][D + pad]): a product with k = D. B's fragments
// by ldmatrix (not transposed), two k16 steps a load: matrices (rows 8j..8j+7) x (cols 16kk,
// 16kk + 8, 16kk + 16, 16kk + 24) are b0, b1 of step kk, then of step kk + 1; with D = 16, or
// !LDMATRIX (the backward kernels: the loaded fragments' registers would cost them a block per
// SM), by two 4-byte loads a step.
template <int D, int N, bool LDMATRIX = true, bool F16 = false>
__device__ __forceinline__ void kiln_flash_qk(float (&acc)[N / 8][4],
                                              const unsigned int (&a)[D / 16][4],
                                              const bf16_bits* b) {
    const int lane = threadIdx.x % KILN_WARP, g = lane / 4, t = lane % 4;
    constexpr int STRIDE = D + KILN_FLASH_PAD;
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        if constexpr (D == 16 || !LDMATRIX) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const bf16_bits* row = b + (8 * j + g) * STRIDE + 16 * kk + 2 * t;
                kiln_mma_16<F16>(acc[j], a[kk][0], a[kk][1], a[kk][2], a[kk][3],
                                 kiln_flash_word(row), kiln_flash_word(row + 8));
            }
        } else {
#pragma unroll
            for (int kk = 0; kk + 1 < D / 16; kk += 2) {
                unsigned int bs[4];
                kiln_ldmatrix_x4(bs, b + (8 * j + (lane & 7)) * STRIDE + 16 * kk + 8 * (lane >> 3));
                kiln_mma_16<F16>(acc[j], a[kk][0], a[kk][1], a[kk][2], a[kk][3], bs[0], bs[1]);
                kiln_mma_16<F16>(acc[j], a[kk + 1][0], a[kk + 1][1], a[kk + 1][2],
                                 a[kk + 1][3], bs[2], bs[3]);
            }
        }
    }
}

// out[n] += P (16 rows x K, as K / 8 accumulator tiles, rounded to bf16, or f16) · B for
// D / 8 tiles of 8 columns, B the shared tile `b` ([K][D + pad], row k = B's row k) read by
// ldmatrix.trans: for each k16 step and pair of n8 tiles, matrices (rows 0-7, cols 0-7),
// (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15) give b0, b1 of the
// first tile, then the second.
template <int K, int D, bool F16 = false>
__device__ __forceinline__ void kiln_flash_pv(float (&out)[D / 8][4], const float (&p)[K / 8][4],
                                              const bf16_bits* b) {
    const int lane = threadIdx.x % KILN_WARP;
    const int row_in = (lane & 7) + ((lane >> 3) & 1) * 8, col_in = (lane >> 4) * 8;
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
        const unsigned int a0 = kiln_cvt_16x2<F16>(p[2 * kk][0], p[2 * kk][1]);
        const unsigned int a1 = kiln_cvt_16x2<F16>(p[2 * kk][2], p[2 * kk][3]);
        const unsigned int a2 = kiln_cvt_16x2<F16>(p[2 * kk + 1][0], p[2 * kk + 1][1]);
        const unsigned int a3 = kiln_cvt_16x2<F16>(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
        for (int n = 0; n < D / 16; ++n) {
            unsigned int bs[4];
            kiln_ldmatrix_x4_trans(bs, b + (16 * kk + row_in) * (D + KILN_FLASH_PAD) + 16 * n +
                                           col_in);
            kiln_mma_16<F16>(out[2 * n], a0, a1, a2, a3, bs[0], bs[1]);
            kiln_mma_16<F16>(out[2 * n + 1], a0, a1, a2, a3, bs[2], bs[3]);
        }
    }
}

// The last key index (within the tile at n0) that row `row` sees: keys up to offset + row and
// below kv_len; -1 when none, clamped to the tile's N - 1 when all. Int arithmetic from here
// on: only the tiles that cross the diagonal or an edge need it at all.
__device__ __forceinline__ int kiln_flash_last_key(i64 row, i64 offset, i64 n0, i64 kv_len,
                                                   int n) {
    i64 last = offset + row < kv_len - 1 ? offset + row : kv_len - 1;
    last -= n0;
    return last < -1 ? -1 : (last > n - 1 ? n - 1 : (int)last);
}

// Sum and max over the 4 lanes of a quad (the lanes holding one accumulator row), fixed order.
__device__ __forceinline__ float kiln_flash_quad_sum(float x) {
    x += kiln_shfl_xor(x, 1);
    return x + kiln_shfl_xor(x, 2);
}
__device__ __forceinline__ float kiln_flash_quad_max(float x) {
    x = fmaxf(x, kiln_shfl_xor(x, 1));
    return fmaxf(x, kiln_shfl_xor(x, 2));
}

// ---- staging ----

// bf16 rounding of an operand element: f32 rounded, bf16 already the rounding.
__device__ __forceinline__ float kiln_flash_rounded(const float* p, i64 i) {
    return kiln_bf16_to_f32(kiln_f32_to_bf16(p[i]));
}
__device__ __forceinline__ float kiln_flash_rounded(const bf16_bits* p, i64 i) {
    return kiln_bf16_to_f32(p[i]);
}

// dst [rows][D] bf16 = src rows of hd elements (S: f32, rounded as packed, or bf16: already
// the rounding; the f16 forward's f16 rows go through the bf16 copy too), zeros past hd; with
// F16, f16 rows of the f32 src. Row r of dst reads src row
// r, or, with bthd (dO, out's layout [B,T,Hq,hd] to [B,Hq,T,D]), row (b·T + t)·Hq + h for
// r = (b·Hq + h)·T + t. Each thread writes 8 elements (16 bytes).
template <typename S, bool F16 = false>
__device__ void kiln_flash_stage(bf16_bits* dst, const S* src, i64 rows, i64 hd, i64 padded,
                                 i64 q_heads, i64 q_len, int bthd) {
    const auto pack = [](float low, float high) {
        return F16 ? kiln_mma_pack_f16(low, high) : kiln_mma_pack(low, high);
    };
    const i64 chunks = rows * (padded / 8);
    KILN_FOR_EACH(i, chunks) {
        const i64 r = i / (padded / 8), d0 = 8 * (i % (padded / 8));
        i64 from = r;
        if (bthd) {
            const i64 bh = r / q_len, t = r % q_len;
            from = ((bh / q_heads) * q_len + t) * q_heads + bh % q_heads;
        }
        const S* row = src + from * hd;
        unsigned int w[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const i64 d = d0 + 2 * u;
            w[u] = pack(d < hd ? kiln_load(row, d) : 0.0f,
                        d + 1 < hd ? kiln_load(row, d + 1) : 0.0f);
        }
        *(uint4*)(dst + r * padded + d0) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

extern "C" __global__ void flash_attention_stage(bf16_bits* dst, const float* src, i64 rows,
                                                 i64 hd, i64 padded, i64 q_heads, i64 q_len,
                                                 int bthd) {
    kiln_grid_dependency_wait();
    kiln_flash_stage(dst, src, rows, hd, padded, q_heads, q_len, bthd);
}

extern "C" __global__ void flash_attention_stage_f16(bf16_bits* dst, const float* src, i64 rows,
                                                     i64 hd, i64 padded, i64 q_heads, i64 q_len,
                                                     int bthd) {
    kiln_grid_dependency_wait();
    kiln_flash_stage<float, true>(dst, src, rows, hd, padded, q_heads, q_len, bthd);
}

extern "C" __global__ void flash_attention_stage_bf16(bf16_bits* dst, const bf16_bits* src,
                                                      i64 rows, i64 hd, i64 padded, i64 q_heads,
                                                      i64 q_len, int bthd) {
    kiln_grid_dependency_wait();
    kiln_flash_stage(dst, src, rows, hd, padded, q_heads, q_len, bthd);
}

// ---- forward ----

// Keys per tile of the forward and the dQ kernel, query rows per tile of the dK/dV kernel:
// two tiles of each operand fit the 48 KB of static shared memory, and for D = 128 the dK/dV
// accumulators fill the registers. The two-group forward keeps two tiles of each operand per
// group, so its key tiles are half as long from D = 64 on.
template <int D> struct KilnFlashTiles {
    static constexpr int N = D > 64 ? 32 : 64;
    static constexpr int BR = D > 64 ? 16 : 64;
    static constexpr int GROUP_N = D >= 64 ? N / 2 : N;
};

// One key tile of the forward for this warp's rows row0 and row1 (lane quad position t): S =
// Q·Kᵀ against the tile at n0 (`k_tile`, `v_tile` in shared memory), the online softmax's
// update of the running max m, the thread's part of the running sum l and the output o, then
// O += P·V. `full`: every row of the block sees every key of the tile (no masks).
template <int D, int N, bool F16>
__device__ __forceinline__ void kiln_flash_forward_tile(float (&o)[D / 8][4], float& m0,
                                                        float& m1, float& l0, float& l1,
                                                        const unsigned int (&qa)[D / 16][4],
                                                        const bf16_bits* k_tile,
                                                        const bf16_bits* v_tile, bool full,
                                                        i64 row0, i64 row1, i64 offset, i64 n0,
                                                        i64 kv_len, int t, float scale2) {
    float s[N / 8][4];
    kiln_flash_qk<D, N, true, F16>(s, qa, k_tile);
    const int last0 = full ? N - 1 : kiln_flash_last_key(row0, offset, n0, kv_len, N);
    const int last1 = full ? N - 1 : kiln_flash_last_key(row1, offset, n0, kv_len, N);
    float top0 = kiln_flash_neg_inf(), top1 = kiln_flash_neg_inf();
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int key = 8 * j + 2 * t + (c & 1);
            const bool seen = key <= (c < 2 ? last0 : last1);
            s[j][c] = seen ? s[j][c] * scale2 : kiln_flash_neg_inf();
        }
        top0 = fmaxf(top0, fmaxf(s[j][0], s[j][1]));
        top1 = fmaxf(top1, fmaxf(s[j][2], s[j][3]));
    }
    const float new0 = fmaxf(m0, kiln_flash_quad_max(top0));
    const float new1 = fmaxf(m1, kiln_flash_quad_max(top1));
    // A row with no key seen yet keeps 0 as its reference (its exps are all 0).
    const float ref0 = new0 == kiln_flash_neg_inf() ? 0.0f : new0;
    const float ref1 = new1 == kiln_flash_neg_inf() ? 0.0f : new1;
    const float alpha0 = kiln_exp2_approx(m0 - ref0), alpha1 = kiln_exp2_approx(m1 - ref1);
    m0 = new0;
    m1 = new1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
        s[j][0] = kiln_exp2_approx(s[j][0] - ref0);
        s[j][1] = kiln_exp2_approx(s[j][1] - ref0);
        s[j][2] = kiln_exp2_approx(s[j][2] - ref1);
        s[j][3] = kiln_exp2_approx(s[j][3] - ref1);
        sum0 += s[j][0] + s[j][1];
        sum1 += s[j][2] + s[j][3];
    }
    l0 = l0 * alpha0 + sum0;
    l1 = l1 * alpha1 + sum1;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        o[n][0] *= alpha0;
        o[n][1] *= alpha0;
        o[n][2] *= alpha1;
        o[n][3] *= alpha1;
    }
    kiln_flash_pv<N, D, F16>(o, s, v_tile);
}

// Block (b·Hq + h, query tile): 64 query rows of head h, key tiles up to the tile's causal
// limit. Each thread keeps, for its rows g and g + 8, the running max m (of the scaled
// scores) and its own part of the running sum l (summed over the quad at the end).
//
// GROUPS = 2 (8 warps): both warp groups hold the block's 64 rows, group g walks the key
// tiles g, g + 2, ... (its own double-buffered K and V), and at the end group 1 leaves its m,
// l and o in the tiles' shared memory for group 0 to merge as one more online-softmax step.
// It is for grids of fewer blocks than SMs (the builder's choice, kernels/src/gpu/flash.rs):
// twice the warps on each busy SM, each walking half the keys.
template <int D, int GROUPS, bool F16 = false>
__device__ __forceinline__ void kiln_flash_forward(float* out, bf16_bits* rounded, float* lse,
                                                   const bf16_bits* q, const bf16_bits* k,
                                                   const bf16_bits* v, i64 q_heads,
                                                   i64 kv_heads, i64 q_len, i64 kv_len, i64 hd,
                                                   float scale) {
    static_assert(GROUPS == 1 || GROUPS == 2, "one or two warp groups");
    constexpr int N = GROUPS == 1 ? KilnFlashTiles<D>::N : KilnFlashTiles<D>::GROUP_N;
    constexpr int TILE = N * (D + KILN_FLASH_PAD);
    __shared__ __align__(16) bf16_bits ks[2 * GROUPS * TILE];
    __shared__ __align__(16) bf16_bits vs[2 * GROUPS * TILE];
    const i64 bh = blockIdx.x;
    const i64 b = bh / q_heads, h = bh % q_heads;
    const i64 kvh = b * kv_heads + h / (q_heads / kv_heads);
    // Heaviest tiles (the last rows see the most keys) first.
    const i64 q0 = (i64)(gridDim.y - 1 - blockIdx.y) * KILN_FLASH_ROWS;
    const int warp = threadIdx.x / KILN_WARP, lane = threadIdx.x % KILN_WARP;
    // The warp's 16 rows among the block's 64, its group, and this thread within the group.
    const int rows_of = GROUPS == 1 ? warp : warp % 4;
    const int group = GROUPS == 1 ? 0 : warp / 4;
    const int member = GROUPS == 1 ? (int)threadIdx.x : (int)threadIdx.x % KILN_FLASH_THREADS;
    const int t = lane % 4;
    const i64 row0 = q0 + 16 * rows_of + lane / 4, row1 = row0 + 8;
    const i64 offset = kv_len - q_len; // query t sits at position offset + t

    i64 limit = offset + q0 + KILN_FLASH_ROWS; // keys the tile's last row sees, exclusive
    limit = limit < kv_len ? limit : kv_len;
    const bf16_bits* k_head = k + kvh * kv_len * D;
    const bf16_bits* v_head = v + kvh * kv_len * D;
    bf16_bits* k_tiles = ks + group * 2 * TILE;
    bf16_bits* v_tiles = vs + group * 2 * TILE;
    kiln_flash_tile<D, N>(k_tiles, k_head, group * N, kv_len, member);
    kiln_flash_tile<D, N>(v_tiles, v_head, group * N, kv_len, member);
    kiln_cp_async_commit();

    unsigned int qa[D / 16][4];
    kiln_flash_rows<D>(qa, q + bh * q_len * D, q0 + 16 * rows_of, q_len);
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    // Scores in base-2 units (scaled by scale·log2 e), so each probability is one exp2.
    const float scale2 = scale * KILN_LOG2E;
    float m0 = kiln_flash_neg_inf(), m1 = kiln_flash_neg_inf(), l0 = 0.0f, l1 = 0.0f;

    // Every group takes as many steps as group 0 (the block's barriers); a group whose tile
    // of the step is past the limit (group 1 on the last step) only waits.
    for (i64 first = 0, tile = 0; first < limit; first += GROUPS * N, ++tile) {
        const i64 n0 = first + group * N;
        const int buffer = (int)(tile & 1);
        if (n0 + GROUPS * N < limit) {
            // The group's next tile's copy goes out before this one is used.
            kiln_flash_tile<D, N>(k_tiles + (buffer ^ 1) * TILE, k_head, n0 + GROUPS * N,
                                  kv_len, member);
            kiln_flash_tile<D, N>(v_tiles + (buffer ^ 1) * TILE, v_head, n0 + GROUPS * N,
                                  kv_len, member);
        }
        kiln_cp_async_commit();
        kiln_cp_async_wait<1>();
        __syncthreads();
        if (GROUPS == 1 || n0 < limit) {
            const bool full = n0 + N <= kv_len && n0 + N - 1 <= offset + q0;
            kiln_flash_forward_tile<D, N, F16>(o, m0, m1, l0, l1, qa, k_tiles + buffer * TILE,
                                               v_tiles + buffer * TILE, full, row0, row1,
                                               offset, n0, kv_len, t, scale2);
        }
        __syncthreads(); // this buffer is refilled two steps on
    }
    if constexpr (GROUPS == 2) {
        // Slot s of the spill is 128 floats (one per member), in ks while it holds them, then
        // in vs: o's D/2 values a thread, then m0, m1, l0, l1. No copy is in flight over it.
        constexpr int SLOTS = D / 2 + 4, IN_KS = GROUPS * TILE / KILN_FLASH_THREADS;
        static_assert(2 * IN_KS >= SLOTS, "the spill fits the tiles");
        const auto slot = [&](int s) -> float& {
            float* base = s < IN_KS ? (float*)ks + s * KILN_FLASH_THREADS
                                    : (float*)vs + (s - IN_KS) * KILN_FLASH_THREADS;
            return base[member];
        };
        kiln_cp_async_wait<0>();
        __syncthreads();
        if (group == 1) {
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
#pragma unroll
                for (int c = 0; c < 4; ++c) slot(4 * n + c) = o[n][c];
            }
            slot(D / 2) = m0;
            slot(D / 2 + 1) = m1;
            slot(D / 2 + 2) = l0;
            slot(D / 2 + 3) = l1;
        }
        __syncthreads();
        if (group == 1) return;
        // Group 0's thread holds the same rows and columns as the member it reads.
        const float other0 = slot(D / 2), other1 = slot(D / 2 + 1);
        const float new0 = fmaxf(m0, other0), new1 = fmaxf(m1, other1);
        const float ref0 = new0 == kiln_flash_neg_inf() ? 0.0f : new0;
        const float ref1 = new1 == kiln_flash_neg_inf() ? 0.0f : new1;
        const float mine0 = kiln_exp2_approx(m0 - ref0), mine1 = kiln_exp2_approx(m1 - ref1);
        const float theirs0 = kiln_exp2_approx(other0 - ref0);
        const float theirs1 = kiln_exp2_approx(other1 - ref1);
        m0 = new0;
        m1 = new1;
        l0 = l0 * mine0 + slot(D / 2 + 2) * theirs0;
        l1 = l1 * mine1 + slot(D / 2 + 3) * theirs1;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[n][0] = o[n][0] * mine0 + slot(4 * n) * theirs0;
            o[n][1] = o[n][1] * mine0 + slot(4 * n + 1) * theirs0;
            o[n][2] = o[n][2] * mine1 + slot(4 * n + 2) * theirs1;
            o[n][3] = o[n][3] * mine1 + slot(4 * n + 3) * theirs1;
        }
    }
    l0 = kiln_flash_quad_sum(l0);
    l1 = kiln_flash_quad_sum(l1);
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const i64 row = c < 2 ? row0 : row1;
            const int d = 8 * n + 2 * t + (c & 1);
            if (row < q_len && d < hd) {
                const i64 at = ((b * q_len + row) * q_heads + h) * hd + d;
                const float value = o[n][c] * (c < 2 ? inv0 : inv1);
                kiln_store_forms(out, rounded, at, value);
            }
        }
    }
    // A row whose every score is -inf has l = 0: its lse is NaN, as its output is.
    if (t == 0) {
        const float nan = __int_as_float(0x7fc00000);
        if (row0 < q_len) lse[bh * q_len + row0] = l0 > 0.0f ? m0 * KILN_LN2 + logf(l0) : nan;
        if (row1 < q_len) lse[bh * q_len + row1] = l1 > 0.0f ? m1 * KILN_LN2 + logf(l1) : nan;
    }
}

// The entry points: kiln_flash_forward<D, GROUPS, F16> as `name`, one per head dim, plain
// and rounding to f16 (q, k, v staged as f16 rows), each in one and two warp groups (the
// argument checks of kernels/src/gpu/tests.rs expand the macro and read these signatures). q, k,
// v are the staged copies (or the operands, already rows of D). out is written in f32 where
// `out` is not null and rounded to bf16 where `rounded` is not null (the o GEMM's input: mixed
// precision, bf16 prefill), either or both.
#define KILN_FLASH_FORWARD_ENTRY(name, D, GROUPS, F16)                                            \
    extern "C" __global__ void name(float* out, bf16_bits* rounded, float* lse,                 \
                                    const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, \
                                    i64 q_heads, i64 kv_heads, i64 q_len, i64 kv_len, i64 hd,   \
                                    float scale) {                                              \
        kiln_grid_dependency_wait();                                                            \
        kiln_flash_forward<D, GROUPS, F16>(out, rounded, lse, q, k, v, q_heads, kv_heads,       \
                                           q_len, kv_len, hd, scale);                           \
    }
KILN_FLASH_FORWARD_ENTRY(flash_attention_forward_d16, 16, 1, false)
KILN_FLASH_FORWARD_ENTRY(flash_attention_forward_d32, 32, 1, false)
KILN_FLASH_FORWARD_ENTRY(flash_attention_forward_d64, 64, 1, false)
KILN_FLASH_FORWARD_ENTRY(flash_attention_forward_d128, 128, 1, false)
KILN_FLASH_FORWARD_ENTRY(flash_attention_forward_groups_d16, 16, 2, false)
KILN_FLASH_FORWARD_ENTRY(flash_attention_forward_groups_d32, 32, 2, false)
KILN_FLASH_FORWARD_ENTRY(flash_attention_forward_groups_d64, 64, 2, false)
KILN_FLASH_FORWARD_ENTRY(flash_attention_forward_groups_d128, 128, 2, false)
KILN_FLASH_FORWARD_ENTRY(flash_attention_forward_f16_d16, 16, 1, true)
KILN_FLASH_FORWARD_ENTRY(flash_attention_forward_f16_d32, 32, 1, true)
KILN_FLASH_FORWARD_ENTRY(flash_attention_forward_f16_d64, 64, 1, true)
KILN_FLASH_FORWARD_ENTRY(flash_attention_forward_f16_d128, 128, 1, true)
KILN_FLASH_FORWARD_ENTRY(flash_attention_forward_f16_groups_d16, 16, 2, true)
KILN_FLASH_FORWARD_ENTRY(flash_attention_forward_f16_groups_d32, 32, 2, true)
KILN_FLASH_FORWARD_ENTRY(flash_attention_forward_f16_groups_d64, 64, 2, true)
KILN_FLASH_FORWARD_ENTRY(flash_attention_forward_f16_groups_d128, 128, 2, true)
