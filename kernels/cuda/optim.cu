// AdamW updating param, m and v in place with exactly the CPU's arithmetic (adamw.cuh, once
// per thread: the grid is capped, a grid-stride loop, so each thread updates many elements). An
// optional f32 gradient scale (gradient clipping) multiplies each gradient element first,
// rounded. The `_vec4` variants move four elements per access; the builder uses them only when
// the count is a multiple of 4 and every pointer is aligned to its vector (16 bytes, 8 for a
// bf16 gradient). `_bf16_grad`: the gradient is bf16. An optional bf16 `copy` (null for none)
// receives each new param rounded to nearest even, as `cast_f32_to_bf16` rounds it (mixed
// precision's persistent bf16 weights, written in the same pass); vectors of 8 bytes.

// The gradient element, times the clipping scale when there is one.
__device__ __forceinline__ float kiln_scaled(float g, const float* scale) {
    return scale == nullptr ? g : __fmul_rn(g, scale[0]);
}

// The gradient is a stored operand (common.cuh): f32, or bf16 widened where it is read (mixed
// precision's weight gradients, rounded to bf16 by their GEMM).
template <typename G>
__device__ void kiln_adamw(float* param, float* m, float* v, const G* grad, bf16_bits* copy,
                           const i64* step, const double* rate, const float* scale, i64 n,
                           double weight_decay, double beta1, double beta2, float m_weight,
                           float beta2_f32, float v_weight, float eps) {
    const KilnAdamW h = kiln_adamw_scalars(step, rate, weight_decay, beta1, beta2, m_weight,
                                           beta2_f32, v_weight, eps);
    KILN_FOR_EACH(i, n) {
        float p = param[i], mi = m[i], vi = v[i];
        kiln_adamw_one(p, mi, vi, kiln_scaled(kiln_load(grad, i), scale), h);
        param[i] = p;
        m[i] = mi;
        v[i] = vi;
        if (copy != nullptr) {
            copy[i] = kiln_f32_to_bf16(p);
        }
    }
}

// n4 = n / 4 vectors of four floats (G4: float4 for f32 gradients, uint2 for bf16).
template <typename G4>
__device__ void kiln_adamw_vec4(float4* param, float4* m, float4* v, const G4* grad,
                                uint2* copy, const i64* step, const double* rate,
                                const float* scale, i64 n4, double weight_decay, double beta1,
                                double beta2, float m_weight, float beta2_f32, float v_weight,
                                float eps) {
    const KilnAdamW h = kiln_adamw_scalars(step, rate, weight_decay, beta1, beta2, m_weight,
                                           beta2_f32, v_weight, eps);
    KILN_FOR_EACH(i, n4) {
        float4 p = param[i], mi = m[i], vi = v[i];
        const float4 g = kiln_load4(grad, i);
        kiln_adamw_one(p.x, mi.x, vi.x, kiln_scaled(g.x, scale), h);
        kiln_adamw_one(p.y, mi.y, vi.y, kiln_scaled(g.y, scale), h);
        kiln_adamw_one(p.z, mi.z, vi.z, kiln_scaled(g.z, scale), h);
        kiln_adamw_one(p.w, mi.w, vi.w, kiln_scaled(g.w, scale), h);
        param[i] = p;
        m[i] = mi;
        v[i] = vi;
        if (copy != nullptr) {
            kiln_store4(copy, i, p);
        }
    }
}

extern "C" __global__ void adamw_f32(float* param, float* m, float* v, const float* grad,
        bf16_bits* copy, const i64* step, const double* rate, const float* scale, i64 n,
        double weight_decay, double beta1, double beta2, float m_weight, float beta2_f32,
        float v_weight, float eps) {
    kiln_grid_dependency_wait();
    kiln_adamw(param, m, v, grad, copy, step, rate, scale, n, weight_decay, beta1, beta2,
        m_weight, beta2_f32, v_weight, eps);
}

extern "C" __global__ void adamw_f32_bf16_grad(float* param, float* m, float* v,
        const bf16_bits* grad, bf16_bits* copy, const i64* step, const double* rate,
        const float* scale, i64 n, double weight_decay, double beta1, double beta2,
        float m_weight, float beta2_f32, float v_weight, float eps) {
    kiln_grid_dependency_wait();
    kiln_adamw(param, m, v, grad, copy, step, rate, scale, n, weight_decay, beta1, beta2,
        m_weight, beta2_f32, v_weight, eps);
}

// n = n / 4 vectors here.
extern "C" __global__ void adamw_f32_vec4(float4* param, float4* m, float4* v, const float4* grad,
        uint2* copy, const i64* step, const double* rate, const float* scale, i64 n,
        double weight_decay, double beta1, double beta2, float m_weight, float beta2_f32,
        float v_weight, float eps) {
    kiln_grid_dependency_wait();
    kiln_adamw_vec4(param, m, v, grad, copy, step, rate, scale, n, weight_decay, beta1, beta2,
        m_weight, beta2_f32, v_weight, eps);
}

extern "C" __global__ void adamw_f32_bf16_grad_vec4(float4* param, float4* m, float4* v,
        const uint2* grad, uint2* copy, const i64* step, const double* rate, const float* scale,
        i64 n, double weight_decay, double beta1, double beta2, float m_weight, float beta2_f32,
        float v_weight, float eps) {
    kiln_grid_dependency_wait();
    kiln_adamw_vec4(param, m, v, grad, copy, step, rate, scale, n, weight_decay, beta1, beta2,
        m_weight, beta2_f32, v_weight, eps);
}

// Gradient clipping (torch.nn.utils.clip_grad_norm_), deterministic: each gradient's squares
// are summed in f64 by a grid fixed by its size (block b takes elements b*256+t, stepping by
// the grid), each block's sum written to its own partial; one block then sums every partial
// in a fixed order. No atomics, so a replay gives the same bits.
#define KILN_CLIP_THREADS 256

__device__ double kiln_block_sum_f64(double value, double* scratch) {
    scratch[threadIdx.x] = value;
    __syncthreads();
    for (int half = KILN_CLIP_THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) {
            scratch[threadIdx.x] = scratch[threadIdx.x] + scratch[threadIdx.x + half];
        }
        __syncthreads();
    }
    return scratch[0];
}

extern "C" __global__ void clip_grad_norm_partial(const float* grad, i64 n, double* partials) {
    kiln_grid_dependency_wait();
    __shared__ double scratch[KILN_CLIP_THREADS];
    double sum = 0.0;
    for (i64 i = (i64)blockIdx.x * KILN_CLIP_THREADS + threadIdx.x; i < n;
         i += (i64)gridDim.x * KILN_CLIP_THREADS) {
        const double g = (double)grad[i];
        sum = __dadd_rn(sum, __dmul_rn(g, g));
    }
    const double total = kiln_block_sum_f64(sum, scratch);
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = total;
    }
}

// norm = f32(sqrt(sum)), scale = f32(min(1, max_norm / (norm + 1e-6))) computed in f64; a NaN
// norm gives a NaN scale (fmin would drop it).
extern "C" __global__ void clip_grad_norm_finish(const double* partials, i64 count,
                                                 double max_norm, float* norm, float* scale) {
    kiln_grid_dependency_wait();
    __shared__ double scratch[KILN_CLIP_THREADS];
    double sum = 0.0;
    for (i64 i = threadIdx.x; i < count; i += KILN_CLIP_THREADS) {
        sum = __dadd_rn(sum, partials[i]);
    }
    const double total = kiln_block_sum_f64(sum, scratch);
    if (threadIdx.x == 0) {
        const double root = sqrt(total);
        const double coefficient = max_norm / (root + 1e-6);
        norm[0] = (float)root;
        scale[0] = (float)(coefficient >= 1.0 ? 1.0 : coefficient);
    }
}
