// AdamW's arithmetic for one element (torch.optim.AdamW, decoupled weight decay, bias
// correction), shared by optim.cu's updates and embedding.cu's update of a table from its
// scatter: every float operation is an explicitly rounded intrinsic (no contracted FMA), so
// the CPU's bits come out. The step (i64) and learning rate (f64) are device scalars; the bias
// corrections and the lr-dependent scalars are computed from them in f64, as the CPU does, then
// rounded to f32, once per thread.

// torch's lerp for a scalar weight: the formula depends on the weight's size.
__device__ __forceinline__ float kiln_torch_lerp(float start, float end, float weight) {
    if (fabsf(weight) < 0.5f) {
        return __fadd_rn(start, __fmul_rn(weight, __fsub_rn(end, start)));
    }
    return __fsub_rn(end, __fmul_rn(__fsub_rn(end, start), __fsub_rn(1.0f, weight)));
}

// The f32 scalars of one step: those rounded on the host (m_weight = f32(1 - beta1),
// beta2 = f32(beta2), v_weight = f32(1 - beta2), eps = f32(eps)) and those of the step and
// rate (decay = f32(1 - lr*wd), step_size = f32(lr / bc1), bc2_sqrt = f32(sqrt(bc2))).
struct KilnAdamW {
    float decay, m_weight, beta2, v_weight, eps, step_size, bc2_sqrt;
};

__device__ __forceinline__ KilnAdamW kiln_adamw_scalars(const i64* step, const double* rate,
                                                        double weight_decay, double beta1,
                                                        double beta2, float m_weight,
                                                        float beta2_f32, float v_weight,
                                                        float eps) {
    const double steps = (double)step[0];
    const double lr = rate[0];
    const double bias_correction1 = 1.0 - pow(beta1, steps);
    const double bias_correction2 = 1.0 - pow(beta2, steps);
    KilnAdamW h;
    // Rounded apart, as the CPU computes it (no fused multiply-add).
    h.decay = (float)__dsub_rn(1.0, __dmul_rn(lr, weight_decay));
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

