// Split-half RoPE (HF rotate_half) of one pair of elements, shared by the RoPE kernels and the
// fused RoPE + KV-cache write. The angle is computed in f32 exactly as the CPU (and HF):
// inv_freq = 1 / theta^(2i/D), angle = position * inv_freq. A negative position raises the
// fault word.

__device__ __forceinline__ void kiln_rope_angle(float theta, i64 position, i64 i, i64 head_dim,
                                                float* cos_out, float* sin_out) {
    float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
    float angle = __fmul_rn((float)position, inv_freq);
    *cos_out = cosf(angle);
    *sin_out = sinf(angle);
}

// The angles of one token's D/2 pairs (kiln_rope_angle) into cos_at[D/2] and sin_at[D/2],
// shared by the block's threads; a negative position raises the fault word. The caller
// syncs the block before reading them.
__device__ __forceinline__ void kiln_rope_token_angles(float theta, i64 position, i64 head_dim,
                                                       float* cos_at, float* sin_at,
                                                       int* fault) {
    for (int i = threadIdx.x; i < (int)(head_dim / 2); i += blockDim.x) {
        if (position < 0) kiln_raise(fault);
        kiln_rope_angle(theta, position, i, head_dim, &cos_at[i], &sin_at[i]);
    }
}

// Elements i and i + D/2 of a head, (lo, hi), rotated by the angle of (cos_a, sin_a): each
// product and the sum rounded apart, as the CPU does (no FMA contraction), so every kernel
// that rotates, fused or not, gives the same bits.
__device__ __forceinline__ float kiln_rope_lo(float lo, float hi, float cos_a, float sin_a) {
    return __fsub_rn(__fmul_rn(lo, cos_a), __fmul_rn(hi, sin_a));
}
__device__ __forceinline__ float kiln_rope_hi(float lo, float hi, float cos_a, float sin_a) {
    return __fadd_rn(__fmul_rn(hi, cos_a), __fmul_rn(lo, sin_a));
}

// Elements i and i + D/2 of head h of a token's row `x_row` (+ bias [H*D] when `has_bias`),
// rotated by the angle of (cos_a, sin_a): the rotation every RoPE kernel applies. A row's
// offsets are 32-bit.
struct KilnRotated {
    float lo, hi;
};

template <typename B>
__device__ __forceinline__ KilnRotated kiln_rope_rotate(const float* x_row, const B* bias,
                                                        int has_bias, int h, int i, int head_dim,
                                                        float cos_a, float sin_a) {
    const int half = head_dim / 2;
    float lo = x_row[i];
    float hi = x_row[i + half];
    if (has_bias) {
        lo += kiln_load(bias, h * head_dim + i);
        hi += kiln_load(bias, h * head_dim + i + half);
    }
    return {kiln_rope_lo(lo, hi, cos_a, sin_a), kiln_rope_hi(lo, hi, cos_a, sin_a)};
}

// Pair `index` of x [B,T,H,D] (+ bias [H*D] when `has_bias`) at positions [B,T]: element i <
// D/2 of head h of token (b, t), rotated with element i + D/2 into `lo` and `hi`.
struct KilnRopePair {
    i64 b, t, h, i;
    float lo, hi;
};

template <typename B>
__device__ __forceinline__ KilnRopePair kiln_rope_pair(const float* x, const i64* positions,
                                                       const B* bias, int has_bias, i64 index,
                                                       i64 seq, i64 heads, i64 head_dim,
                                                       float theta, int* fault) {
    const i64 half = head_dim / 2;
    const i64 i = index % half;
    const i64 h = (index / half) % heads;
    const i64 token = index / (half * heads);
    if (positions[token] < 0) kiln_raise(fault);
    float cos_a, sin_a;
    kiln_rope_angle(theta, positions[token], i, head_dim, &cos_a, &sin_a);
    const i64 src = (token * heads + h) * head_dim;
    const KilnRotated r =
        kiln_rope_rotate(x + src, bias, has_bias, (int)h, (int)i, (int)head_dim, cos_a, sin_a);
    return {token / seq, token % seq, h, i, r.lo, r.hi};
}

// The token-major RoPE loop: a block takes one token of [tokens] at a time, its threads
// compute the token's angles once into shared memory (D floats, dynamic: kiln_rope_angles),
// then take the token's heads · D/2 pairs, consecutive threads on consecutive elements,
// calling pair(token, b, t, h, i, cos_a, sin_a) for each (token = b · seq + t).
extern __shared__ float kiln_rope_angles[];
template <typename Pair>
__device__ __forceinline__ void kiln_rope_by_token(i64 batch, i64 seq, i64 heads, i64 head_dim,
                                                   const i64* positions, float theta,
                                                   int* fault, Pair pair) {
    const int half = (int)(head_dim / 2);
    const int pairs = (int)heads * half;
    float* cos_at = kiln_rope_angles;
    float* sin_at = kiln_rope_angles + half;
    for (i64 token = blockIdx.x; token < batch * seq; token += gridDim.x) {
        const i64 b = token / seq, t = token - b * seq;
        kiln_rope_token_angles(theta, positions[token], head_dim, cos_at, sin_at, fault);
        __syncthreads();
        for (int e = threadIdx.x; e < pairs; e += blockDim.x) {
            const int h = e / half, i = e - h * half;
            pair(token, b, t, h, i, cos_at[i], sin_at[i]);
        }
        // The next token's angles wait for every thread to be done with these.
        __syncthreads();
    }
}
