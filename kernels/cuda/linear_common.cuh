// The skinny linear kernels' shared pieces (linear.cu, linear_mma.cu): the groups' outputs
// and biases, where a virtual column lands, and the epilogue (bias, SwiGLU) of one output.
// Prepended to both modules' text after common.cuh (kernels/src/gpu.rs).

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

// The three groups' outputs, bias pointers, bias flags and leading dims. Fields are picked by
// selects, never by a runtime array index (which would put the struct in local memory).
struct KilnLinearOut {
    float *y0, *y1, *y2;
    const bf16_bits *b0, *b1, *b2;
    int has_b0, has_b1, has_b2;
    i64 ldo0, ldo1, ldo2;
};

// value + bias_g[j] (widened) when group g has a bias, else value.
__device__ __forceinline__ float kiln_linear_biased(const KilnLinearOut& out, int g, i64 j,
                                                    float value) {
    const bf16_bits* b = g == 0 ? out.b0 : (g == 1 ? out.b1 : out.b2);
    const int has = g == 0 ? out.has_b0 : (g == 1 ? out.has_b1 : out.has_b2);
    return has ? value + kiln_bf16_to_f32(b[j]) : value;
}

// y_g[r, j] = value + bias_g[j].
__device__ __forceinline__ void kiln_linear_write(const KilnLinearOut& out, int g, i64 r, i64 j,
                                                  float value) {
    float* y = g == 0 ? out.y0 : (g == 1 ? out.y1 : out.y2);
    const i64 ldo = g == 0 ? out.ldo0 : (g == 1 ? out.ldo1 : out.ldo2);
    y[r * ldo + j] = kiln_linear_biased(out, g, j, value);
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
    const KilnLinearOut out = {y0,     y1,     y2,     b0,   b1,   b2,                       \
                               has_b0, has_b1, has_b2, ldo0, ldo1, ldo2}
