// Skinny fused linear layer on tensor cores, for 2 <= m <= 32 rows: the same operation, launch
// shape, split-K and epilogues as linear.cu's CUDA-core kernel (see there; its linear_reduce
// finishes split launches of both), with the multiply-adds done by
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (mma.cuh: inline PTX, sm_80+, on NVIDIA;
// an emulation within f32 rounding of it under hipRTC, or NVRTC with KILN_PORTABLE_MMA).
//
// Why. Each weight byte pair meets all m rows: 2 * m FLOPs per 2 bytes. On CUDA cores (~67
// TFLOP/s on an H200, ~15.6 FLOPs per byte of its ~4.3 TB/s) that is compute-bound from ~8 rows
// (measured: 3.02 ms vs cuBLASLt's 2.41 ms per 0.5B decode step at 8 rows). Counted at m = 32:
// weights 2 * N * K bytes, 2 * 32 * N * K FLOPs, 32 FLOPs per weight byte (as executed, with
// the padded rows: 8 * TILES, so never more than 32 either), against ~230 per byte for ~990
// TFLOP/s of dense bf16 tensor throughput over ~4.3 TB/s (mma.sync reaches only part of that
// peak on Hopper, which still leaves it several times clear): memory-bound at every m here.
//
// Mapping. y^T = W * x^T: the A operand is 16 weight rows (virtual columns) x 16 k, B is 16 k x 8
// rows of x, D (f32) is 16 columns x 8 rows. TILES = ceil(m / 8) n8 tiles (8, 16, 24, 32 rows);
// rows m..8 * TILES of x are zeros and their results are never written. A block of 8 warps
// covers 128 virtual columns (as linear.cu: the same column tiles and plan), a warp 16: without
// SwiGLU virtual columns v0..v0+15, with it gate j0..j0+7 as A rows 0..7 and up j0..j0+7 as
// rows 8..15, so that thread (g, t) holds gate and up of column j0 + g in c0/c2 and c1/c3.
//
// Loads. A dot product may take its k in any order, so long as A and B agree. Lane l (group
// g = l / 4, t = l % 4) loads, for each 32-k chunk at kb, the 16-byte vector of 8 bf16 at
// k = kb + 8t of A rows g and g + 8 (wa, wb), and from shared memory the vector at the same k of
// x row 8 * tile + g (xv); then two mma: the first takes A = {wa.x, wb.x, wa.y, wb.y},
// B = {xv.x, xv.y}, the second the .z/.w words. Per the PTX fragment layouts (A: a0a1 = row g,
// cols 2t, 2t+1; a2a3 = row g+8, same cols; a4a5 / a6a7 = rows g / g+8, cols 2t+8, 2t+9. B: b0b1
// = k rows 2t, 2t+1, col g; b2b3 = k rows 2t+8, 2t+9) the mma's k slot c of thread t stands for
// k = kb + 8t + (c >= 8 ? 2 : 0) + c % 2 in the first mma and 4 more in the second, in A and B
// alike: the 32 k of the chunk, each once. So A fragments come straight from global memory in
// 16-byte loads, with no shared memory and no ldmatrix: each weight byte is used by one thread
// once, so staging it in shared memory (cp.async) would add a copy and a barrier and buy no
// reuse; the bytes in flight come from registers and from the warps of the SM instead. The 4
// lanes of a group read 64 contiguous bytes of a row per load (whole sectors), 2 chunks a whole
// 128-byte line. Per step a thread issues 2 * UNROLL = 8 independent 16-byte loads (128 bytes;
// 32 KB per block) before its first mma; a stage's first step is issued before x is staged.
// Registers (ptxas via NVRTC 13.0, sm_90; tools/kernel_resources.py), no spills, and the blocks
// per SM they allow (shared memory allows 6): r8, r16, r24: 79-80, 3 blocks, 96 KB of weights in
// flight per SM; r32: 96, 2 blocks, 64 KB (Little's law wants ~30 KB, see linear.cu). The A
// fragment mixes two loads' words ({wa.x, wb.x, wa.y, wb.y}), so ptxas adds register moves
// before each mma (~4 per mma in the SASS): issue slots, not bytes.
//
// x. The block stages rows 0..8 * TILES of its k range, stage_k elements at a time, as bf16
// (f32 x rounded by kiln_f32_to_bf16, bf16 as is; zeros in rows m..): row r at r * (stage_k +
// 32) elements. stage_k is a multiple of 64, so a row is 64 bytes past a multiple of 128: the
// 8 lanes of a quarter-warp (rows g, g+1, 16-byte reads at 16t) touch 32 distinct banks. The
// builder keeps 8 * TILES * (stage_k + 32) * 2 <= 34 KB (under the 48 KB of a plain launch).
//
// K tail. k is a multiple of 8 and stages and splits start at multiples of 64, so a thread's
// vector is wholly inside the stage's length or wholly past it; past it, its A and B words are
// zeros (never read from memory), so the mma adds exact zeros. Chunks wholly past the end are
// skipped (warp-uniform).
//
// Split-K and epilogue as linear.cu: with one split the kernel adds bias, applies SwiGLU and
// writes y; with more it writes partial[split][r][virtual column] and linear_reduce finishes.
//
// Determinism. Each thread issues its mma in a fixed order (k increasing, then tiles), the
// tensor core's own order within an mma is fixed, splits combine in increasing order: no
// atomics, the same bits every run (not the CUDA-core kernel's bits: the summation order and
// the mma's internal accumulation differ). NaN and Inf propagate as the arithmetic makes them.
//
// Checked without a GPU: kernels/src/gpu/linear_emulation.rs runs the builder's launches of
// these kernels lane by lane with this index math and the mma by the PTX ISA's fragment layouts,
// against an f64 reference (linear_mma_tests.rs). Any change here must be mirrored there.

#define KILN_MMA_WARPS 8    // warps per block (256 threads): 8 x 16 = 128 virtual columns
#define KILN_MMA_COLUMNS 16 // virtual columns per warp: the A operand's rows
#define KILN_MMA_CHUNK 32   // k per chunk: two m16n8k16 per n8 tile
#define KILN_MMA_UNROLL 4   // chunks per step: 8 weight loads of 16 bytes in flight per thread
#define KILN_MMA_PAD 32     // bf16 elements after each staged row of x (64 bytes)

// Stages x[0..m, k0..k0 + len) (len a multiple of 8) as bf16 into `xs`, rows `stride` elements
// apart; rows m..ROWS are zeros.
template <int ROWS>
__device__ __forceinline__ void kiln_mma_stage(bf16_bits* xs, int stride, const void* x, int x_f32,
                                               i64 m, i64 ldx, i64 k0, int len) {
    const int vecs = len / 8;
    for (int i = threadIdx.x; i < ROWS * vecs; i += blockDim.x) {
        const int r = i / vecs;
        const int v = i % vecs;
        uint4 q = make_uint4(0u, 0u, 0u, 0u);
        if (r < m && x_f32) {
            const float4* row = (const float4*)((const float*)x + r * ldx + k0);
            const float4 lo = row[2 * v];
            const float4 hi = row[2 * v + 1];
            q = make_uint4(kiln_mma_pack(lo.x, lo.y), kiln_mma_pack(lo.z, lo.w),
                           kiln_mma_pack(hi.x, hi.y), kiln_mma_pack(hi.z, hi.w));
        } else if (r < m) {
            q = ((const uint4*)((const bf16_bits*)x + r * ldx + k0))[v];
        }
        *(uint4*)(xs + r * stride + v * 8) = q;
    }
}

// wa[u], wb[u] = vector first + 4u + t of A rows g and g + 8, for the vectors below `left` of
// valid rows (zeros elsewhere): 2 x UNROLL independent 16-byte loads.
template <int UNROLL>
__device__ __forceinline__ void kiln_mma_load(uint4 (&wa)[UNROLL], uint4 (&wb)[UNROLL],
                                              const uint4* ra, const uint4* rb, bool valid_a,
                                              bool valid_b, i64 first, int t, int left) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int v = 4 * u + t;
        wa[u] = make_uint4(0u, 0u, 0u, 0u);
        wb[u] = make_uint4(0u, 0u, 0u, 0u);
        if (valid_a && v < left) wa[u] = ra[first + v];
        if (valid_b && v < left) wb[u] = rb[first + v];
    }
}

__device__ __forceinline__ const bf16_bits* kiln_mma_group(int g, const bf16_bits* w0,
                                                           const bf16_bits* w1,
                                                           const bf16_bits* w2) {
    return g == 0 ? w0 : (g == 1 ? w1 : w2);
}

// The main kernel's body for TILES n8 tiles of rows (8 * TILES >= m).
template <int TILES, int UNROLL>
__device__ __forceinline__ void kiln_mma_body(const KilnLinearOut& out, float* partial,
                                              const bf16_bits* w0, const bf16_bits* w1,
                                              const bf16_bits* w2, i64 n0, i64 n1, i64 n2,
                                              const void* x, int x_f32, i64 m, i64 k, i64 ldx,
                                              i64 split_k, i64 stage_k, int swiglu) {
    extern __shared__ uint4 kiln_mma_smem[];
    bf16_bits* xs = (bf16_bits*)kiln_mma_smem;
    const int stride = (int)stage_k + KILN_MMA_PAD;
    const int lane = threadIdx.x % KILN_WARP;
    const int g = lane / 4;
    const int t = lane % 4;
    const i64 warp = (i64)blockIdx.x * KILN_MMA_WARPS + threadIdx.x / KILN_WARP;
    const i64 n_virtual = swiglu ? 2 * n0 : n0 + n1 + n2;

    // A rows g (a) and g + 8 (b): group, column, validity. A row past the end keeps a valid
    // pointer and never loads.
    int group_a = 0, group_b = 1;
    i64 j_a = 0, j_b = 0;
    bool valid_a, valid_b;
    const i64 v_a = warp * KILN_MMA_COLUMNS + g;  // virtual column of row g (no SwiGLU)
    if (swiglu) {
        j_a = warp * (KILN_MMA_COLUMNS / 2) + g;
        j_b = j_a;
        valid_a = j_a < n0;
        valid_b = valid_a;
    } else {
        kiln_linear_locate(v_a, n0, n1, &group_a, &j_a);
        kiln_linear_locate(v_a + 8, n0, n1, &group_b, &j_b);
        valid_a = v_a < n_virtual;
        valid_b = v_a + 8 < n_virtual;
    }
    const uint4* ra = (const uint4*)(kiln_mma_group(group_a, w0, w1, w2) + (valid_a ? j_a : 0) * k);
    const uint4* rb = (const uint4*)(kiln_mma_group(group_b, w0, w1, w2) + (valid_b ? j_b : 0) * k);

    float acc[TILES][4];
#pragma unroll
    for (int n = 0; n < TILES; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
    }

    bool waited = false;
    const i64 k_begin = (i64)blockIdx.y * split_k;
    const i64 k_end = k_begin + split_k < k ? k_begin + split_k : k;
#pragma unroll 1
    for (i64 k0 = k_begin; k0 < k_end; k0 += stage_k) {
        const int len = (int)(k_end - k0 < stage_k ? k_end - k0 : stage_k);
        const int vecs = len / 8;
        const i64 first = k0 / 8;  // the stage's first vector within a weight row
        __syncthreads();  // the previous stage's reads of xs are done
        uint4 wa[UNROLL], wb[UNROLL];
        kiln_mma_load<UNROLL>(wa, wb, ra, rb, valid_a, valid_b, first, t, vecs);
        kiln_linear_wait_once(&waited);
        kiln_mma_stage<8 * TILES>(xs, stride, x, x_f32, m, ldx, k0, len);
        __syncthreads();
#pragma unroll 1
        for (int base = 0; base < len; base += KILN_MMA_CHUNK * UNROLL) {
            if (base > 0) {
                kiln_mma_load<UNROLL>(wa, wb, ra, rb, valid_a, valid_b, first + base / 8, t,
                                      vecs - base / 8);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int kb = base + KILN_MMA_CHUNK * u;
                if (kb >= len) break;  // the same for the whole warp
                const bool valid = kb + 8 * t < len;
#pragma unroll
                for (int n = 0; n < TILES; ++n) {
                    uint4 xv = make_uint4(0u, 0u, 0u, 0u);
                    if (valid) xv = *(const uint4*)(xs + (8 * n + g) * stride + kb + 8 * t);
                    kiln_mma_bf16(acc[n], wa[u].x, wb[u].x, wa[u].y, wb[u].y, xv.x, xv.y);
                    kiln_mma_bf16(acc[n], wa[u].z, wb[u].z, wa[u].w, wb[u].w, xv.z, xv.w);
                }
            }
        }
    }

    kiln_linear_wait_once(&waited);
    // c0, c1: A row g, x rows 8n + 2t, 8n + 2t + 1; c2, c3: A row g + 8, the same x rows.
    const bool split = gridDim.y > 1;
#pragma unroll
    for (int n = 0; n < TILES; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const i64 r = 8 * n + 2 * t + (i & 1);
            const bool upper = i >= 2;
            if (r >= m || !(upper ? valid_b : valid_a)) continue;
            const i64 at = ((i64)blockIdx.y * m + r) * n_virtual;  // partial's row r
            if (swiglu) {
                if (upper) continue;  // written with its gate
                if (split) {
                    partial[at + j_a] = acc[n][i];
                    partial[at + n0 + j_a] = acc[n][i + 2];
                } else {
                    kiln_linear_write_swiglu(out, r, j_a, acc[n][i], acc[n][i + 2]);
                }
            } else if (split) {
                partial[at + v_a + (upper ? 8 : 0)] = acc[n][i];
            } else {
                kiln_linear_write(out, upper ? group_b : group_a, r, upper ? j_b : j_a,
                                  acc[n][i]);
            }
        }
    }
}

// The main kernels, one per n8 tile count (8 * TILES >= m; the builder picks the smallest), with
// linear.cu's parameters: unused groups have n = 0 and any valid pointers; b_g is read only
// when has_b_g is nonzero; `partial` is written only with more than one split (gridDim.y > 1).
extern "C" __global__ void linear_mma_r8(
    float* y0, float* y1, float* y2, float* partial, const bf16_bits* w0, const bf16_bits* w1,
    const bf16_bits* w2, const bf16_bits* b0, const bf16_bits* b1, const bf16_bits* b2, int has_b0,
    int has_b1, int has_b2, i64 n0, i64 n1, i64 n2, i64 ldo0, i64 ldo1, i64 ldo2, const void* x,
    int x_f32, i64 m, i64 k, i64 ldx, i64 split_k, i64 stage_k, int swiglu) {
    KILN_LINEAR_OUT;  // the body waits for the producers (kiln_linear_wait_once)
    kiln_mma_body<1, KILN_MMA_UNROLL>(out, partial, w0, w1, w2, n0, n1, n2, x, x_f32, m, k, ldx,
                                      split_k, stage_k, swiglu);
}

extern "C" __global__ void linear_mma_r16(
    float* y0, float* y1, float* y2, float* partial, const bf16_bits* w0, const bf16_bits* w1,
    const bf16_bits* w2, const bf16_bits* b0, const bf16_bits* b1, const bf16_bits* b2, int has_b0,
    int has_b1, int has_b2, i64 n0, i64 n1, i64 n2, i64 ldo0, i64 ldo1, i64 ldo2, const void* x,
    int x_f32, i64 m, i64 k, i64 ldx, i64 split_k, i64 stage_k, int swiglu) {
    KILN_LINEAR_OUT;  // the body waits for the producers (kiln_linear_wait_once)
    kiln_mma_body<2, KILN_MMA_UNROLL>(out, partial, w0, w1, w2, n0, n1, n2, x, x_f32, m, k, ldx,
                                      split_k, stage_k, swiglu);
}

extern "C" __global__ void linear_mma_r24(
    float* y0, float* y1, float* y2, float* partial, const bf16_bits* w0, const bf16_bits* w1,
    const bf16_bits* w2, const bf16_bits* b0, const bf16_bits* b1, const bf16_bits* b2, int has_b0,
    int has_b1, int has_b2, i64 n0, i64 n1, i64 n2, i64 ldo0, i64 ldo1, i64 ldo2, const void* x,
    int x_f32, i64 m, i64 k, i64 ldx, i64 split_k, i64 stage_k, int swiglu) {
    KILN_LINEAR_OUT;  // the body waits for the producers (kiln_linear_wait_once)
    kiln_mma_body<3, KILN_MMA_UNROLL>(out, partial, w0, w1, w2, n0, n1, n2, x, x_f32, m, k, ldx,
                                      split_k, stage_k, swiglu);
}

extern "C" __global__ void linear_mma_r32(
    float* y0, float* y1, float* y2, float* partial, const bf16_bits* w0, const bf16_bits* w1,
    const bf16_bits* w2, const bf16_bits* b0, const bf16_bits* b1, const bf16_bits* b2, int has_b0,
    int has_b1, int has_b2, i64 n0, i64 n1, i64 n2, i64 ldo0, i64 ldo1, i64 ldo2, const void* x,
    int x_f32, i64 m, i64 k, i64 ldx, i64 split_k, i64 stage_k, int swiglu) {
    KILN_LINEAR_OUT;  // the body waits for the producers (kiln_linear_wait_once)
    kiln_mma_body<4, KILN_MMA_UNROLL>(out, partial, w0, w1, w2, n0, n1, n2, x, x_f32, m, k, ldx,
                                      split_k, stage_k, swiglu);
}
