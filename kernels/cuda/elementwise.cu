// Elementwise f32 kernels: add (of f32 or bf16 terms), mul (b broadcast over a's leading dims),
// scale, sum_to_shape (over chunks of rows, columns.cuh), broadcast_to. Each is correct in
// place (out == a, of one dtype): each element is read before it is written by the same
// thread.
//
// The `_vec4` variants move four elements per access; the builder uses them only when every
// count is a multiple of 4 and every pointer is aligned to its vector (16 bytes; 8 for bf16).

struct KilnAdd {
    __device__ float operator()(float x, float y) const { return x + y; }
};
struct KilnMul {
    __device__ float operator()(float x, float y) const { return x * y; }
};

// out[i] = combine(a[i], b[i % b_len]), n elements.
template <typename Combine>
__device__ void kiln_binary(float* out, const float* a, const float* b, i64 n, i64 b_len,
                            Combine combine) {
    KILN_FOR_EACH(i, n) { out[i] = combine(a[i], b[i % b_len]); }
}

// A4, B4: float4, or uint2 for a bf16 operand (four elements in 8 bytes).
template <typename A4, typename B4, typename Combine>
__device__ void kiln_binary_vec4(float4* out, const A4* a, const B4* b, i64 n4, i64 b_len4,
                                 Combine combine) {
    KILN_FOR_EACH(i, n4) {
        const float4 x = kiln_load4(a, i);
        const float4 y = kiln_load4(b, i % b_len4);
        out[i] = make_float4(combine(x.x, y.x), combine(x.y, y.y), combine(x.z, y.z),
                             combine(x.w, y.w));
    }
}

// out = a[i] + b[i % b_len], each term f32 or bf16 (widened): a bias stored in bf16, mixed
// precision's rounded gradients. A bf16 `a` is never `out` (the sum is f32).
template <typename A, typename B>
__device__ void kiln_add(float* out, const A* a, const B* b, i64 n, i64 b_len) {
    KILN_FOR_EACH(i, n) { out[i] = kiln_load(a, i) + kiln_load(b, i % b_len); }
}

extern "C" __global__ void add_f32(float* out, const float* a, const float* b, i64 n,
                                   i64 b_len) {
    kiln_grid_dependency_wait();
    kiln_add(out, a, b, n, b_len);
}

extern "C" __global__ void add_f32_bf16(float* out, const float* a, const bf16_bits* b, i64 n,
                                        i64 b_len) {
    kiln_grid_dependency_wait();
    kiln_add(out, a, b, n, b_len);
}

extern "C" __global__ void add_bf16_bf16(float* out, const bf16_bits* a, const bf16_bits* b,
                                         i64 n, i64 b_len) {
    kiln_grid_dependency_wait();
    kiln_add(out, a, b, n, b_len);
}

extern "C" __global__ void add_bf16_f32(float* out, const bf16_bits* a, const float* b, i64 n,
                                        i64 b_len) {
    kiln_grid_dependency_wait();
    kiln_add(out, a, b, n, b_len);
}

extern "C" __global__ void add_f32_vec4(float4* out, const float4* a, const float4* b, i64 n4,
                                        i64 b_len4) {
    kiln_grid_dependency_wait();
    kiln_binary_vec4(out, a, b, n4, b_len4, KilnAdd());
}

extern "C" __global__ void add_f32_bf16_vec4(float4* out, const float4* a, const uint2* b,
                                             i64 n4, i64 b_len4) {
    kiln_grid_dependency_wait();
    kiln_binary_vec4(out, a, b, n4, b_len4, KilnAdd());
}

extern "C" __global__ void add_bf16_bf16_vec4(float4* out, const uint2* a, const uint2* b,
                                              i64 n4, i64 b_len4) {
    kiln_grid_dependency_wait();
    kiln_binary_vec4(out, a, b, n4, b_len4, KilnAdd());
}

extern "C" __global__ void add_bf16_f32_vec4(float4* out, const uint2* a, const float4* b,
                                             i64 n4, i64 b_len4) {
    kiln_grid_dependency_wait();
    kiln_binary_vec4(out, a, b, n4, b_len4, KilnAdd());
}

extern "C" __global__ void mul_f32(float* out, const float* a, const float* b, i64 n,
                                   i64 b_len) {
    kiln_grid_dependency_wait();
    kiln_binary(out, a, b, n, b_len, KilnMul());
}

extern "C" __global__ void mul_f32_vec4(float4* out, const float4* a, const float4* b, i64 n4,
                                        i64 b_len4) {
    kiln_grid_dependency_wait();
    kiln_binary_vec4(out, a, b, n4, b_len4, KilnMul());
}

// out = alpha * a; alpha is the f64 attribute rounded once to f32 (as the CPU's `T::of`).
extern "C" __global__ void scale_f32(float* out, const float* a, float alpha, i64 n) {
    kiln_grid_dependency_wait();
    KILN_FOR_EACH(i, n) { out[i] = alpha * a[i]; }
}

extern "C" __global__ void scale_f32_vec4(float4* out, const float4* a, float alpha, i64 n4) {
    kiln_grid_dependency_wait();
    KILN_FOR_EACH(i, n4) {
        float4 x = a[i];
        out[i] = make_float4(alpha * x.x, alpha * x.y, alpha * x.z, alpha * x.w);
    }
}

// out[j] = sum over i of src[i, j]; src is [rows, cols], out is [cols] (or the chunks'
// partials [chunks, cols]): columns.cuh's split and order.
struct KilnSumTerm {
    const float* src;
    i64 cols;
    __device__ float operator()(i64 row, i64 col) const { return src[row * cols + col]; }
};

extern "C" __global__ void sum_to_shape_f32(float* out, const float* src, i64 rows, i64 cols,
                                            i64 chunk_rows) {
    kiln_grid_dependency_wait();
    kiln_column_sums(out, rows, cols, chunk_rows, KilnSumTerm{src, cols});
}

// out[col] = Σ_c partials[c·cols + col] over the chunks c in increasing order (columns.cuh).
extern "C" __global__ void column_sums_finish_f32(float* out, const float* partials, i64 chunks,
                                                  i64 cols) {
    kiln_grid_dependency_wait();
    KILN_FOR_EACH(col, cols) {
        float total = partials[col];
        for (i64 c = 1; c < chunks; ++c) total += partials[c * cols + col];
        out[col] = total;
    }
}

// out[i] = src[i % src_len], n elements of 4 bytes.
extern "C" __global__ void broadcast_to_f32(float* out, const float* src, i64 n, i64 src_len) {
    kiln_grid_dependency_wait();
    KILN_FOR_EACH(i, n) { out[i] = src[i % src_len]; }
}

// out = silu(gate) * up, as the CPU: gate / (1 + exp(-gate)) * up. In place over gate is fine
// where out and gate share a dtype. I (I4 for four elements): gate's and up's storage, f32 or
// bf16 widened as read (`_bf16_in`: rounded GEMM products); O (O4): the result's storage, f32
// or bf16 rounded as written (`_bf16_out`: mixed precision's input of the down GEMM).
__device__ __forceinline__ float kiln_swiglu_one(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

template <typename O, typename I>
__device__ void kiln_swiglu(O* out, const I* gate, const I* up, i64 n) {
    KILN_FOR_EACH(i, n) {
        kiln_store(out, i, kiln_swiglu_one(kiln_load(gate, i), kiln_load(up, i)));
    }
}

template <typename O4, typename I4>
__device__ void kiln_swiglu_vec4(O4* out, const I4* gate, const I4* up, i64 n4) {
    KILN_FOR_EACH(i, n4) {
        const float4 g = kiln_load4(gate, i);
        const float4 u = kiln_load4(up, i);
        kiln_store4(out, i,
                    make_float4(kiln_swiglu_one(g.x, u.x), kiln_swiglu_one(g.y, u.y),
                                kiln_swiglu_one(g.z, u.z), kiln_swiglu_one(g.w, u.w)));
    }
}

extern "C" __global__ void swiglu_f32(float* out, const float* gate, const float* up, i64 n) {
    kiln_grid_dependency_wait();
    kiln_swiglu(out, gate, up, n);
}

extern "C" __global__ void swiglu_f32_vec4(float4* out, const float4* gate,
        const float4* up, i64 n4) {
    kiln_grid_dependency_wait();
    kiln_swiglu_vec4(out, gate, up, n4);
}

extern "C" __global__ void swiglu_f32_bf16_out(bf16_bits* out, const float* gate,
        const float* up, i64 n) {
    kiln_grid_dependency_wait();
    kiln_swiglu(out, gate, up, n);
}

extern "C" __global__ void swiglu_f32_bf16_out_vec4(uint2* out, const float4* gate,
        const float4* up, i64 n4) {
    kiln_grid_dependency_wait();
    kiln_swiglu_vec4(out, gate, up, n4);
}

extern "C" __global__ void swiglu_f32_bf16_in(float* out, const bf16_bits* gate,
        const bf16_bits* up, i64 n) {
    kiln_grid_dependency_wait();
    kiln_swiglu(out, gate, up, n);
}

extern "C" __global__ void swiglu_f32_bf16_in_vec4(float4* out, const uint2* gate,
        const uint2* up, i64 n4) {
    kiln_grid_dependency_wait();
    kiln_swiglu_vec4(out, gate, up, n4);
}

extern "C" __global__ void swiglu_f32_bf16_in_bf16_out(bf16_bits* out, const bf16_bits* gate,
        const bf16_bits* up, i64 n) {
    kiln_grid_dependency_wait();
    kiln_swiglu(out, gate, up, n);
}

extern "C" __global__ void swiglu_f32_bf16_in_bf16_out_vec4(uint2* out, const uint2* gate,
        const uint2* up, i64 n4) {
    kiln_grid_dependency_wait();
    kiln_swiglu_vec4(out, gate, up, n4);
}

// Gradients of swiglu: silu'(g) = s + g*s*(1 - s) with s = sigmoid(g), written as the CPU does.
// Gate and up are of I (I4), as the forward reads them; the incoming gradient is a stored
// operand (G, G4: f32, or bf16 widened as read); both results are of O (O4): f32, or bf16
// rounded as written (`_bf16_out`: mixed precision's inputs of the gate and up GEMMs' backward).
__device__ __forceinline__ void kiln_swiglu_backward_one(float g, float u, float d,
                                                         float& grad_gate, float& grad_up) {
    const float sig = 1.0f / (1.0f + expf(-g));
    const float silu_grad = sig * (1.0f + g * (1.0f - sig));
    grad_gate = d * u * silu_grad;
    grad_up = d * (g / (1.0f + expf(-g)));
}

template <typename O, typename I, typename G>
__device__ void kiln_swiglu_backward(O* grad_gate, O* grad_up, const I* gate, const I* up,
                                     const G* grad_out, i64 n) {
    KILN_FOR_EACH(i, n) {
        float gg, gu;
        kiln_swiglu_backward_one(kiln_load(gate, i), kiln_load(up, i), kiln_load(grad_out, i),
                                 gg, gu);
        kiln_store(grad_gate, i, gg);
        kiln_store(grad_up, i, gu);
    }
}

template <typename O4, typename I4, typename G4>
__device__ void kiln_swiglu_backward_vec4(O4* grad_gate, O4* grad_up, const I4* gate,
                                          const I4* up, const G4* grad_out, i64 n4) {
    KILN_FOR_EACH(i, n4) {
        const float4 g = kiln_load4(gate, i);
        const float4 u = kiln_load4(up, i);
        const float4 d = kiln_load4(grad_out, i);
        float4 gg, gu;
        kiln_swiglu_backward_one(g.x, u.x, d.x, gg.x, gu.x);
        kiln_swiglu_backward_one(g.y, u.y, d.y, gg.y, gu.y);
        kiln_swiglu_backward_one(g.z, u.z, d.z, gg.z, gu.z);
        kiln_swiglu_backward_one(g.w, u.w, d.w, gg.w, gu.w);
        kiln_store4(grad_gate, i, gg);
        kiln_store4(grad_up, i, gu);
    }
}

extern "C" __global__ void swiglu_backward_f32(float* grad_gate, float* grad_up,
        const float* gate, const float* up, const float* grad_out, i64 n) {
    kiln_grid_dependency_wait();
    kiln_swiglu_backward(grad_gate, grad_up, gate, up, grad_out, n);
}

extern "C" __global__ void swiglu_backward_f32_vec4(float4* grad_gate, float4* grad_up,
        const float4* gate, const float4* up, const float4* grad_out, i64 n4) {
    kiln_grid_dependency_wait();
    kiln_swiglu_backward_vec4(grad_gate, grad_up, gate, up, grad_out, n4);
}

extern "C" __global__ void swiglu_backward_f32_bf16_out(bf16_bits* grad_gate, bf16_bits* grad_up,
        const float* gate, const float* up, const float* grad_out, i64 n) {
    kiln_grid_dependency_wait();
    kiln_swiglu_backward(grad_gate, grad_up, gate, up, grad_out, n);
}

extern "C" __global__ void swiglu_backward_f32_bf16_out_vec4(uint2* grad_gate, uint2* grad_up,
        const float4* gate, const float4* up, const float4* grad_out, i64 n4) {
    kiln_grid_dependency_wait();
    kiln_swiglu_backward_vec4(grad_gate, grad_up, gate, up, grad_out, n4);
}

extern "C" __global__ void swiglu_backward_f32_bf16_grad(float* grad_gate, float* grad_up,
        const float* gate, const float* up, const bf16_bits* grad_out, i64 n) {
    kiln_grid_dependency_wait();
    kiln_swiglu_backward(grad_gate, grad_up, gate, up, grad_out, n);
}

extern "C" __global__ void swiglu_backward_f32_bf16_grad_vec4(float4* grad_gate, float4* grad_up,
        const float4* gate, const float4* up, const uint2* grad_out, i64 n4) {
    kiln_grid_dependency_wait();
    kiln_swiglu_backward_vec4(grad_gate, grad_up, gate, up, grad_out, n4);
}

extern "C" __global__ void swiglu_backward_f32_bf16_grad_bf16_out(
        bf16_bits* grad_gate, bf16_bits* grad_up,
        const float* gate, const float* up, const bf16_bits* grad_out, i64 n) {
    kiln_grid_dependency_wait();
    kiln_swiglu_backward(grad_gate, grad_up, gate, up, grad_out, n);
}

extern "C" __global__ void swiglu_backward_f32_bf16_grad_bf16_out_vec4(
        uint2* grad_gate, uint2* grad_up,
        const float4* gate, const float4* up, const uint2* grad_out, i64 n4) {
    kiln_grid_dependency_wait();
    kiln_swiglu_backward_vec4(grad_gate, grad_up, gate, up, grad_out, n4);
}

extern "C" __global__ void swiglu_backward_f32_bf16_in(float* grad_gate, float* grad_up,
        const bf16_bits* gate, const bf16_bits* up, const float* grad_out, i64 n) {
    kiln_grid_dependency_wait();
    kiln_swiglu_backward(grad_gate, grad_up, gate, up, grad_out, n);
}

extern "C" __global__ void swiglu_backward_f32_bf16_in_vec4(float4* grad_gate, float4* grad_up,
        const uint2* gate, const uint2* up, const float4* grad_out, i64 n4) {
    kiln_grid_dependency_wait();
    kiln_swiglu_backward_vec4(grad_gate, grad_up, gate, up, grad_out, n4);
}

extern "C" __global__ void swiglu_backward_f32_bf16_in_bf16_out(
        bf16_bits* grad_gate, bf16_bits* grad_up,
        const bf16_bits* gate, const bf16_bits* up, const float* grad_out, i64 n) {
    kiln_grid_dependency_wait();
    kiln_swiglu_backward(grad_gate, grad_up, gate, up, grad_out, n);
}

extern "C" __global__ void swiglu_backward_f32_bf16_in_bf16_out_vec4(
        uint2* grad_gate, uint2* grad_up,
        const uint2* gate, const uint2* up, const float4* grad_out, i64 n4) {
    kiln_grid_dependency_wait();
    kiln_swiglu_backward_vec4(grad_gate, grad_up, gate, up, grad_out, n4);
}

extern "C" __global__ void swiglu_backward_f32_bf16_in_bf16_grad(float* grad_gate, float* grad_up,
        const bf16_bits* gate, const bf16_bits* up, const bf16_bits* grad_out, i64 n) {
    kiln_grid_dependency_wait();
    kiln_swiglu_backward(grad_gate, grad_up, gate, up, grad_out, n);
}

extern "C" __global__ void swiglu_backward_f32_bf16_in_bf16_grad_vec4(
        float4* grad_gate, float4* grad_up,
        const uint2* gate, const uint2* up, const uint2* grad_out, i64 n4) {
    kiln_grid_dependency_wait();
    kiln_swiglu_backward_vec4(grad_gate, grad_up, gate, up, grad_out, n4);
}

extern "C" __global__ void swiglu_backward_f32_bf16_in_bf16_grad_bf16_out(
        bf16_bits* grad_gate, bf16_bits* grad_up,
        const bf16_bits* gate, const bf16_bits* up, const bf16_bits* grad_out, i64 n) {
    kiln_grid_dependency_wait();
    kiln_swiglu_backward(grad_gate, grad_up, gate, up, grad_out, n);
}

extern "C" __global__ void swiglu_backward_f32_bf16_in_bf16_grad_bf16_out_vec4(
        uint2* grad_gate, uint2* grad_up,
        const uint2* gate, const uint2* up, const uint2* grad_out, i64 n4) {
    kiln_grid_dependency_wait();
    kiln_swiglu_backward_vec4(grad_gate, grad_up, gate, up, grad_out, n4);
}
