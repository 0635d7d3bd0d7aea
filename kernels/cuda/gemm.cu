// A portable tiled GEMM: exactly what a `kiln_kernels::gpu::Gemm` descriptor describes, for
// backends without a vendor GEMM. For each batch b (blockIdx.z), C_b [m,n] = op(A_b) op(B_b),
// overwritten, or added to C_b when `accumulate`; A_b is stored [m,k] (or [k,m] when
// transpose_a) with leading dimension lda, B_b [k,n] (or [n,k] when transpose_b) with ldb, C_b
// [m,n] with ldc, all in elements; batch strides in elements.
//
// Tiling: a block of 256 threads computes a 64 x 64 tile of C (blockIdx.y: rows, blockIdx.x:
// columns), staging op(A) and op(B) through shared memory 16 values of k at a time, widened to
// f32. Thread t computes the 4 x 4 micro-tile of rows ty + 16 i and columns tx + 16 j (i, j < 4;
// tx = t % 16, ty = t / 16): its B reads of a k step are 16 consecutive floats across a
// half-warp (no bank conflicts), and its writes of C are 16 consecutive columns.
//
// Determinism: every element of C is one f32 fused multiply-add chain over p = 0, 1, ..., k-1
// in order, starting from +0, whatever the tiling: staged values past the edges of op(A) and
// op(B) are 0, so the padding of the last k chunk adds fmaf(0, 0, sum), which is sum (up to
// the sign of a zero sum, made +0 as a plain sum would), and the rows and columns past m and n
// are computed but never written. No value is skipped, so NaN and Inf reach the sums as in a
// plain loop. C is read only when accumulating, after the chain: C = sum + C.

#define KILN_GEMM_TILE 64     // rows and columns of C per block
#define KILN_GEMM_CHUNK 16    // values of k per shared-memory stage
#define KILN_GEMM_THREADS 256 // threads per block: 16 x 16
#define KILN_GEMM_SIDE 16     // threads per row and per column of the block's grid
#define KILN_GEMM_MICRO 4     // rows and columns of C per thread (KILN_GEMM_TILE / KILN_GEMM_SIDE)
// Shared rows are padded by one float: a k-contiguous operand writes its staged values down a
// column of the tile, which an odd pitch spreads over the banks.
#define KILN_GEMM_PITCH (KILN_GEMM_TILE + 1)

// Stages tile[kk][o] = op(X)[outer0 + o, k0 + kk] (o < 64, kk < 16) of one operand, widened to
// f32, and 0 past `outers` or past k. op(X)[o, p] is src[o * ld + p] when the operand is
// stored k-contiguous (A untransposed, B transposed), else src[p * ld + o]. Consecutive threads
// take consecutive addresses of the stored operand, so global reads coalesce either way.
template <typename T>
__device__ __forceinline__ void kiln_gemm_stage(float (*tile)[KILN_GEMM_PITCH], const T* src,
                                                i64 ld, bool k_contiguous, i64 outer0,
                                                i64 outers, i64 k0, i64 k) {
    for (int e = threadIdx.x; e < KILN_GEMM_TILE * KILN_GEMM_CHUNK; e += KILN_GEMM_THREADS) {
        const int o = k_contiguous ? e / KILN_GEMM_CHUNK : e % KILN_GEMM_TILE;
        const int kk = k_contiguous ? e % KILN_GEMM_CHUNK : e / KILN_GEMM_TILE;
        const i64 outer = outer0 + o;
        const i64 p = k0 + kk;
        float value = 0.0f;
        if (outer < outers && p < k) {
            value = kiln_load(src, k_contiguous ? outer * ld + p : p * ld + outer);
        }
        tile[kk][o] = value;
    }
}

// The body of every instance: A and B of type T (float or bf16_bits), C of type O. Inlined
// into each kernel, so its shared tiles are that kernel's alone (hipRTC gives a called
// function's static shared arrays to every kernel of the module).
template <typename T, typename O>
__device__ __forceinline__ void kiln_gemm(O* c, const T* a, const T* b, i64 m, i64 n, i64 k,
                                          i64 lda, i64 ldb, i64 ldc, i64 stride_a, i64 stride_b,
                                          i64 stride_c, int transpose_a, int transpose_b,
                                          int accumulate) {
    __shared__ float a_tile[KILN_GEMM_CHUNK][KILN_GEMM_PITCH];
    __shared__ float b_tile[KILN_GEMM_CHUNK][KILN_GEMM_PITCH];
    const i64 batch = blockIdx.z;
    a += batch * stride_a;
    b += batch * stride_b;
    c += batch * stride_c;
    const i64 row0 = (i64)blockIdx.y * KILN_GEMM_TILE;
    const i64 col0 = (i64)blockIdx.x * KILN_GEMM_TILE;
    const int tx = threadIdx.x % KILN_GEMM_SIDE;
    const int ty = threadIdx.x / KILN_GEMM_SIDE;

    float sum[KILN_GEMM_MICRO][KILN_GEMM_MICRO];
    for (int i = 0; i < KILN_GEMM_MICRO; ++i)
        for (int j = 0; j < KILN_GEMM_MICRO; ++j) sum[i][j] = 0.0f;

    for (i64 k0 = 0; k0 < k; k0 += KILN_GEMM_CHUNK) {
        kiln_gemm_stage(a_tile, a, lda, transpose_a == 0, row0, m, k0, k);
        kiln_gemm_stage(b_tile, b, ldb, transpose_b != 0, col0, n, k0, k);
        __syncthreads();
        for (int kk = 0; kk < KILN_GEMM_CHUNK; ++kk) {
            float a_values[KILN_GEMM_MICRO], b_values[KILN_GEMM_MICRO];
            for (int i = 0; i < KILN_GEMM_MICRO; ++i)
                a_values[i] = a_tile[kk][ty + KILN_GEMM_SIDE * i];
            for (int j = 0; j < KILN_GEMM_MICRO; ++j)
                b_values[j] = b_tile[kk][tx + KILN_GEMM_SIDE * j];
            for (int i = 0; i < KILN_GEMM_MICRO; ++i)
                for (int j = 0; j < KILN_GEMM_MICRO; ++j)
                    sum[i][j] = fmaf(a_values[i], b_values[j], sum[i][j]);
        }
        // The next stage overwrites the tiles every thread has just read.
        __syncthreads();
    }

    for (int i = 0; i < KILN_GEMM_MICRO; ++i) {
        const i64 row = row0 + ty + KILN_GEMM_SIDE * i;
        if (row >= m) continue;
        for (int j = 0; j < KILN_GEMM_MICRO; ++j) {
            const i64 col = col0 + tx + KILN_GEMM_SIDE * j;
            if (col >= n) continue;
            const i64 at = row * ldc + col;
            float value = sum[i][j];
            if (accumulate) value += kiln_load(c, at);
            kiln_store(c, at, value);
        }
    }
}

#define KILN_GEMM_CALL                                                                       \
    kiln_gemm(c, a, b, m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, transpose_a,    \
              transpose_b, accumulate)

// f32 A and B, f32 C.
extern "C" __global__ void gemm_f32(float* c, const float* a, const float* b, i64 m, i64 n,
                                    i64 k, i64 lda, i64 ldb, i64 ldc, i64 stride_a,
                                    i64 stride_b, i64 stride_c, int transpose_a,
                                    int transpose_b, int accumulate) {
    kiln_grid_dependency_wait();
    KILN_GEMM_CALL;
}

// bf16 A and B, f32 C.
extern "C" __global__ void gemm_bf16(float* c, const bf16_bits* a, const bf16_bits* b, i64 m,
                                     i64 n, i64 k, i64 lda, i64 ldb, i64 ldc, i64 stride_a,
                                     i64 stride_b, i64 stride_c, int transpose_a,
                                     int transpose_b, int accumulate) {
    kiln_grid_dependency_wait();
    KILN_GEMM_CALL;
}

// bf16 A and B, bf16 C: each f32 sum (plus C widened when accumulating) rounded to nearest
// even as it is written.
extern "C" __global__ void gemm_bf16_to_bf16(bf16_bits* c, const bf16_bits* a,
                                             const bf16_bits* b, i64 m, i64 n, i64 k, i64 lda,
                                             i64 ldb, i64 ldc, i64 stride_a, i64 stride_b,
                                             i64 stride_c, int transpose_a, int transpose_b,
                                             int accumulate) {
    kiln_grid_dependency_wait();
    KILN_GEMM_CALL;
}
