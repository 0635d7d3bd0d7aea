// Column sums of a [rows, cols] term, split over chunks of rows (kernels/src/gpu/columns.rs):
// block (x, y) of (32, KILN_COLUMN_ROW_LANES) threads sums the terms of 32 columns over rows
// [y·chunk_rows, (y + 1)·chunk_rows); lane ty takes the rows of its residue class, the lanes'
// sums are added in increasing ty, and the chunk's sum goes to out[y·cols + col]: the result
// itself when there is one chunk, else a partial that column_sums_finish_f32 (elementwise.cu)
// adds in increasing chunk order. Fixed orders: the same bits on every run. Chunks give a
// column sum of many rows enough blocks to keep loads in flight (one block per 32 columns
// walks every row one load after another), and each thread loads four rows' terms before it
// adds them, in row order.
#define KILN_COLUMN_ROW_LANES 16

template <typename Term>
__device__ __forceinline__ void kiln_column_sums(float* out, i64 rows, i64 cols, i64 chunk_rows,
                                                 Term term) {
    __shared__ float partial[KILN_COLUMN_ROW_LANES][KILN_WARP];
    const i64 col = (i64)blockIdx.x * KILN_WARP + threadIdx.x;
    const i64 first = (i64)blockIdx.y * chunk_rows;
    const i64 end = first + chunk_rows < rows ? first + chunk_rows : rows;
    float sum = 0.0f;
    if (col < cols) {
        constexpr i64 lanes = KILN_COLUMN_ROW_LANES;
        i64 row = first + threadIdx.y;
        for (; row + 3 * lanes < end; row += 4 * lanes) {
            const float t0 = term(row, col), t1 = term(row + lanes, col);
            const float t2 = term(row + 2 * lanes, col), t3 = term(row + 3 * lanes, col);
            sum += t0;
            sum += t1;
            sum += t2;
            sum += t3;
        }
        for (; row < end; row += lanes) sum += term(row, col);
    }
    partial[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        float total = partial[0][threadIdx.x];
        for (int lane = 1; lane < KILN_COLUMN_ROW_LANES; ++lane) {
            total += partial[lane][threadIdx.x];
        }
        out[(i64)blockIdx.y * cols + col] = total;
    }
}
