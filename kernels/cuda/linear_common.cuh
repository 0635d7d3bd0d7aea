// The skinny linear kernels' shared pieces (linear.cu, linear_mma.cu): the groups' outputs
// and biases, where a virtual column lands, and the epilogue (bias, SwiGLU) of one output.
// Prepended to both modules' text after common.cuh (kernels/src/gpu.rs).

// The main kernels' register bounds (256 threads): the blocks per SM the split rule counts on,
// 2 for linear_r1 (CUDA_CORE_RESIDENT in linear.rs) and 3 for linear_mma_r8; r16 to r32 take
// 2 (bounded to 3 they spill). Without them the norm prologue's and residual's arguments took
// linear_r1 to 130 registers (1 block per SM) and linear_mma_r8 to 95 (2), and decode at 1 and
// 8 rows 17% and 10% slower (BENCHMARKS.md).
#define KILN_LINEAR_BOUNDS __launch_bounds__(256, 2)
#define KILN_MMA_BOUNDS __launch_bounds__(256, 3)

// The main kernels' wait for their producers (common.cuh), made once, after the first step's
// weight loads are issued: a fused linear's weights are parameters, which no kernel of a
// program writes (the op's contract, checked by the IR verifier), so they may be read while
// the kernel before still runs; x, the partials and the outputs are touched only after it.
__device__ __forceinline__ void kiln_linear_wait_once(bool* waited) {
    if (!*waited) kiln_grid_dependency_wait();
    *waited = true;
}

// The two bf16 values of a 32-bit word as f32 (low half first: little-endian element order).
__device__ __forceinline__ float kiln_linear_low(unsigned int word) {
    return __uint_as_float(word << 16);
}
__device__ __forceinline__ float kiln_linear_high(unsigned int word) {
    return __uint_as_float(word & 0xffff0000u);
}

__device__ __forceinline__ float kiln_linear_silu_mul(float gate, float up) {
    float s = gate / (1.0f + expf(-gate));
    return s * up;
}

// Where virtual column v of a launch without SwiGLU lands: group g, column j of that group.
__device__ __forceinline__ void kiln_linear_locate(i64 v, i64 n0, i64 n1, int* g, i64* j) {
    if (v < n0) {
        *g = 0;
        *j = v;
    } else if (v < n0 + n1) {
        *g = 1;
        *j = v - n0;
    } else {
        *g = 2;
        *j = v - n0 - n1;
    }
}

// The three groups' outputs, bias pointers, bias flags and leading dims, and the residual
// added to group 0 (the `residual` epilogue: one group, rows of n0). Fields are picked by
// selects, never by a runtime array index (which would put the struct in local memory).
struct KilnLinearOut {
    float *y0, *y1, *y2;
    const bf16_bits *b0, *b1, *b2;
    int has_b0, has_b1, has_b2;
    i64 ldo0, ldo1, ldo2;
    const float* residual;
    int has_residual;
};

// value + bias_g[j] (widened) when group g has a bias, else value.
__device__ __forceinline__ float kiln_linear_biased(const KilnLinearOut& out, int g, i64 j,
                                                    float value) {
    const bf16_bits* b = g == 0 ? out.b0 : (g == 1 ? out.b1 : out.b2);
    const int has = g == 0 ? out.has_b0 : (g == 1 ? out.has_b1 : out.has_b2);
    return has ? value + kiln_bf16_to_f32(b[j]) : value;
}

// y_g[r, j] = value + bias_g[j] (+ residual[r, j]: the unfused Add after the bias).
__device__ __forceinline__ void kiln_linear_write(const KilnLinearOut& out, int g, i64 r, i64 j,
                                                  float value) {
    float* y = g == 0 ? out.y0 : (g == 1 ? out.y1 : out.y2);
    const i64 ldo = g == 0 ? out.ldo0 : (g == 1 ? out.ldo1 : out.ldo2);
    float sum = kiln_linear_biased(out, g, j, value);
    if (out.has_residual) sum += out.residual[r * ldo + j];
    y[r * ldo + j] = sum;
}

// out[r, j] = silu(gate + bias_0[j]) * (up + bias_1[j]), written to y0.
__device__ __forceinline__ void kiln_linear_write_swiglu(const KilnLinearOut& out, i64 r, i64 j,
                                                         float gate, float up) {
    const float a = kiln_linear_biased(out, 0, j, gate);
    out.y0[r * out.ldo0 + j] = kiln_linear_silu_mul(a, kiln_linear_biased(out, 1, j, up));
}

// The launch's outputs from the kernels' common parameters (every main kernel and linear_reduce
// take y0..y2, b0..b2, has_b0..has_b2 and ldo0..ldo2 under these names).
#define KILN_LINEAR_OUT                                                                      \
    const KilnLinearOut out = {y0,     y1,     y2,   b0,   b1,   b2,       has_b0,              \
                               has_b1, has_b2, ldo0, ldo1, ldo2, residual, has_residual}

// The norm prologue (`rmsnorm`): x is f32 and each staged element x[r, j] becomes
// bf16((x[r, j] * rstd[r]) * weight[j]), RmsNorm's formula (norm.cuh) before the cast.
// weight_kind: 0 no prologue, 1 f32 weights, 2 bf16.
struct KilnLinearNorm {
    const void* weight;
    int weight_kind;
    float eps;
};

__device__ __forceinline__ KilnLinearNorm kiln_linear_norm_of(const void* weight, int kind,
                                                             float eps) {
    KilnLinearNorm norm;
    norm.weight = weight;
    norm.weight_kind = kind;
    norm.eps = eps;
    return norm;
}

__device__ __forceinline__ float kiln_linear_norm_weight(const KilnLinearNorm& norm, i64 j) {
    return norm.weight_kind == 2 ? kiln_bf16_to_f32(((const bf16_bits*)norm.weight)[j])
                                 : ((const float*)norm.weight)[j];
}

// rstd[r] of rows 0..min(m, ROWS) of x (f32 [m, k], rows ldx apart, 16-byte vectors), once
// the producers are done: warp w takes rows w, w + warps, ...; lane l sums the squares of
// the vectors l, l + 32, ... in order, then the warp's fixed butterfly. Every thread of the
// block calls it (it ends with a barrier). Each block reads its rows whole again, from L2 (a
// decode row of 896 to 1536 floats is a few KB, against the k range of weights it streams).
template <int ROWS>
__device__ __forceinline__ void kiln_linear_norm_rows(float* rstd, const float* x, i64 m, i64 k,
                                                      i64 ldx, float eps) {
    const int lane = threadIdx.x % KILN_WARP;
    const int warps = blockDim.x / KILN_WARP;
    for (int r = threadIdx.x / KILN_WARP; r < ROWS && r < m; r += warps) {
        const float4* row = (const float4*)(x + r * ldx);
        float squares = 0.0f;
#pragma unroll 8
        for (i64 v = lane; v < k / 4; v += KILN_WARP) {
            const float4 e = row[v];
            squares += e.x * e.x + e.y * e.y + e.z * e.z + e.w * e.w;
        }
        squares = kiln_warp_sum(squares);
        if (lane == 0) rstd[r] = kiln_inverse_rms(squares, k, eps);
    }
    __syncthreads();
}

// The main kernels' first step after their early weight loads, made once: the wait for the
// producers (kiln_linear_wait_once), then the rows' rstd when the prologue is on.
template <int ROWS>
__device__ __forceinline__ void kiln_linear_begin(bool* waited, float* rstd,
                                                  const KilnLinearNorm& norm, const void* x,
                                                  i64 m, i64 k, i64 ldx) {
    if (*waited) return;
    kiln_linear_wait_once(waited);
    if (norm.weight_kind) kiln_linear_norm_rows<ROWS>(rstd, (const float*)x, m, k, ldx, norm.eps);
}
