// AdamW (torch.optim.AdamW, decoupled weight decay, bias correction), updating param, m and v
// in place with exactly the CPU's arithmetic: every float operation is written as an explicitly
// rounded intrinsic so that no multiply-add is contracted into an FMA.
//
// The step is read from a device i64 scalar (a captured graph serves every step); the bias
// corrections are computed from it in f64, as the CPU does, then rounded to f32.

// torch's lerp for a scalar weight: the formula depends on the weight's size.
__device__ __forceinline__ float kiln_torch_lerp(float start, float end, float weight) {
    if (fabsf(weight) < 0.5f) {
        return __fadd_rn(start, __fmul_rn(weight, __fsub_rn(end, start)));
    }
    return __fsub_rn(end, __fmul_rn(__fsub_rn(end, start), __fsub_rn(1.0f, weight)));
}

// decay = f32(1 - lr*wd), m_weight = f32(1 - beta1), beta2_f32 = f32(beta2),
// v_weight = f32(1 - beta2), eps = f32(eps): rounded on the host like the CPU's `T::of`.
extern "C" __global__ void adamw_f32(float* param, float* m, float* v, const float* grad,
                                     const i64* step, i64 n, double lr, double beta1,
                                     double beta2, float decay, float m_weight, float beta2_f32,
                                     float v_weight, float eps) {
    const double steps = (double)step[0];
    const double bias_correction1 = 1.0 - pow(beta1, steps);
    const double bias_correction2 = 1.0 - pow(beta2, steps);
    const float step_size = (float)(lr / bias_correction1);
    const float bias_correction2_sqrt = (float)sqrt(bias_correction2);
    KILN_FOR_EACH(i, n) {
        const float g = grad[i];
        float p = __fmul_rn(param[i], decay);
        const float m_new = kiln_torch_lerp(m[i], g, m_weight);
        const float v_new = __fadd_rn(__fmul_rn(v[i], beta2_f32), __fmul_rn(__fmul_rn(v_weight, g), g));
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v_new), bias_correction2_sqrt), eps);
        p = __fsub_rn(p, __fdiv_rn(__fmul_rn(step_size, m_new), denom));
        m[i] = m_new;
        v[i] = v_new;
        param[i] = p;
    }
}
