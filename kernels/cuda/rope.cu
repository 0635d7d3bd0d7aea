// Split-half RoPE (rope.cuh) with the layout change [B,T,H,D] -> [B,H,T,D], and its backward,
// token-major (kiln_rope_by_token): a token's angles computed once for all its heads.

// x [B,T,H,D] (+ bias [H*D] when `has_bias`), positions [B,T] i64 -> out [B,H,T,D].
// The bias B is f32 or bf16 (a stored operand); out O is f32, or bf16 rounded as written
// (`_bf16_out`: q and k read only rounded, by FlashAttention).
template <typename O, typename B>
__device__ void kiln_rope(O* out, const float* x, const i64* positions, const B* bias,
                          int has_bias, i64 batch, i64 seq, i64 heads, i64 head_dim, float theta,
                          int* fault) {
    const int half = (int)(head_dim / 2);
    kiln_rope_by_token(
        batch, seq, heads, head_dim, positions, theta, fault,
        [&](i64 token, i64 b, i64 t, int h, int i, float cos_a, float sin_a) {
            const i64 src = (token * heads + h) * head_dim;
            const KilnRotated r =
                kiln_rope_rotate(x + src, bias, has_bias, h, i, (int)head_dim, cos_a, sin_a);
            const i64 dst = ((b * heads + h) * seq + t) * head_dim + i;
            kiln_store(out, dst, r.lo);
            kiln_store(out, dst + half, r.hi);
        });
}

extern "C" __global__ void rope_f32(float* out, const float* x, const i64* positions,
                                    const float* bias, int has_bias, i64 batch, i64 seq,
                                    i64 heads, i64 head_dim, float theta, int* fault) {
    kiln_grid_dependency_wait();
    kiln_rope(out, x, positions, bias, has_bias, batch, seq, heads, head_dim, theta, fault);
}

extern "C" __global__ void rope_f32_bf16(float* out, const float* x, const i64* positions,
                                         const bf16_bits* bias, int has_bias, i64 batch, i64 seq,
                                         i64 heads, i64 head_dim, float theta, int* fault) {
    kiln_grid_dependency_wait();
    kiln_rope(out, x, positions, bias, has_bias, batch, seq, heads, head_dim, theta, fault);
}

extern "C" __global__ void rope_f32_bf16_out(bf16_bits* out, const float* x,
                                             const i64* positions, const float* bias,
                                             int has_bias, i64 batch, i64 seq, i64 heads,
                                             i64 head_dim, float theta, int* fault) {
    kiln_grid_dependency_wait();
    kiln_rope(out, x, positions, bias, has_bias, batch, seq, heads, head_dim, theta, fault);
}

extern "C" __global__ void rope_f32_bf16_bf16_out(bf16_bits* out, const float* x,
                                                  const i64* positions, const bf16_bits* bias,
                                                  int has_bias, i64 batch, i64 seq, i64 heads,
                                                  i64 head_dim, float theta, int* fault) {
    kiln_grid_dependency_wait();
    kiln_rope(out, x, positions, bias, has_bias, batch, seq, heads, head_dim, theta, fault);
}

// grad_out [B,H,T,D], positions [B,T] -> grad_x [B,T,H,D] (the inverse rotation), in f32
// where `grad_x` is not null and rounded to bf16 where `rounded` is not null (mixed
// precision's input of the GEMMs it feeds), either or both.
extern "C" __global__ void rope_backward_f32(float* grad_x, bf16_bits* rounded,
                                             const float* grad_out, const i64* positions,
                                             i64 batch, i64 seq, i64 heads, i64 head_dim,
                                             float theta, int* fault) {
    kiln_grid_dependency_wait();
    const int half = (int)(head_dim / 2);
    kiln_rope_by_token(
        batch, seq, heads, head_dim, positions, theta, fault,
        [&](i64 token, i64 b, i64 t, int h, int i, float cos_a, float sin_a) {
            const i64 src = ((b * heads + h) * seq + t) * head_dim;
            const i64 dst = (token * heads + h) * head_dim;
            float lo = grad_out[src + i];
            float hi = grad_out[src + i + half];
            kiln_store_forms(grad_x, rounded, dst + i, lo * cos_a + hi * sin_a);
            kiln_store_forms(grad_x, rounded, dst + i + half, hi * cos_a - lo * sin_a);
        });
}
