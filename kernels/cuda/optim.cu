// AdamW (torch.optim.AdamW, decoupled weight decay, bias correction), updating param, m and v
// in place with exactly the CPU's arithmetic: every float operation is written as an explicitly
// rounded intrinsic so that no multiply-add is contracted into an FMA.
//
// The step is read from a device i64 scalar (a captured graph serves every step); the bias
// corrections are computed from it in f64, as the CPU does, then rounded to f32 - once per
// thread: the grid is capped (a grid-stride loop), so each thread updates many elements.
// The `_vec4` variant moves four floats per access; the builder uses it only when the count is
// a multiple of 4 and every pointer is 16-byte aligned.

// torch's lerp for a scalar weight: the formula depends on the weight's size.
__device__ __forceinline__ float kiln_torch_lerp(float start, float end, float weight) {
    if (fabsf(weight) < 0.5f) {
        return __fadd_rn(start, __fmul_rn(weight, __fsub_rn(end, start)));
    }
    return __fsub_rn(end, __fmul_rn(__fsub_rn(end, start), __fsub_rn(1.0f, weight)));
}

// The f32 scalars of one step: those rounded on the host (decay = f32(1 - lr*wd),
// m_weight = f32(1 - beta1), beta2 = f32(beta2), v_weight = f32(1 - beta2), eps = f32(eps))
// and those of the step (step_size = f32(lr / bc1), bc2_sqrt = f32(sqrt(bc2))).
struct KilnAdamW {
    float decay, m_weight, beta2, v_weight, eps, step_size, bc2_sqrt;
};

__device__ __forceinline__ KilnAdamW kiln_adamw_scalars(const i64* step, double lr, double beta1,
                                                        double beta2, float decay,
                                                        float m_weight, float beta2_f32,
                                                        float v_weight, float eps) {
    const double steps = (double)step[0];
    const double bias_correction1 = 1.0 - pow(beta1, steps);
    const double bias_correction2 = 1.0 - pow(beta2, steps);
    KilnAdamW h;
    h.decay = decay;
    h.m_weight = m_weight;
    h.beta2 = beta2_f32;
    h.v_weight = v_weight;
    h.eps = eps;
    h.step_size = (float)(lr / bias_correction1);
    h.bc2_sqrt = (float)sqrt(bias_correction2);
    return h;
}

// One element, in the CPU's order; param, m, v are updated through the references.
__device__ __forceinline__ void kiln_adamw_one(float& param, float& m, float& v, float g,
                                               const KilnAdamW& h) {
    float p = __fmul_rn(param, h.decay);
    const float m_new = kiln_torch_lerp(m, g, h.m_weight);
    const float v_new = __fadd_rn(__fmul_rn(v, h.beta2), __fmul_rn(__fmul_rn(h.v_weight, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v_new), h.bc2_sqrt), h.eps);
    p = __fsub_rn(p, __fdiv_rn(__fmul_rn(h.step_size, m_new), denom));
    m = m_new;
    v = v_new;
    param = p;
}

extern "C" __global__ void adamw_f32(float* param, float* m, float* v, const float* grad,
                                     const i64* step, i64 n, double lr, double beta1,
                                     double beta2, float decay, float m_weight, float beta2_f32,
                                     float v_weight, float eps) {
    const KilnAdamW h =
        kiln_adamw_scalars(step, lr, beta1, beta2, decay, m_weight, beta2_f32, v_weight, eps);
    KILN_FOR_EACH(i, n) {
        float p = param[i], mi = m[i], vi = v[i];
        kiln_adamw_one(p, mi, vi, grad[i], h);
        param[i] = p;
        m[i] = mi;
        v[i] = vi;
    }
}

// n4 = n / 4 vectors of four floats.
extern "C" __global__ void adamw_f32_vec4(float4* param, float4* m, float4* v,
                                          const float4* grad, const i64* step, i64 n4,
                                          double lr, double beta1, double beta2, float decay,
                                          float m_weight, float beta2_f32, float v_weight,
                                          float eps) {
    const KilnAdamW h =
        kiln_adamw_scalars(step, lr, beta1, beta2, decay, m_weight, beta2_f32, v_weight, eps);
    KILN_FOR_EACH(i, n4) {
        float4 p = param[i], mi = m[i], vi = v[i];
        const float4 g = grad[i];
        kiln_adamw_one(p.x, mi.x, vi.x, g.x, h);
        kiln_adamw_one(p.y, mi.y, vi.y, g.y, h);
        kiln_adamw_one(p.z, mi.z, vi.z, g.z, h);
        kiln_adamw_one(p.w, mi.w, vi.w, g.w, h);
        param[i] = p;
        m[i] = mi;
        v[i] = vi;
    }
}
