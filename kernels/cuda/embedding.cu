// Embedding gather, its deterministic scatter-add backward (no float atomics), and AdamW of a
// table from that scatter without the scatter's table.

// out[n, :] = weight[ids[n], :] (f32 rows; a bf16 table W widened exactly); one block per
// token. An id outside 0..V gives a row of NaN and raises the fault word.
template <typename W>
__device__ void kiln_embedding(float* out, const W* weight, const i64* ids, i64 tokens,
                               i64 hidden, i64 vocab, int* fault) {
    const i64 n = blockIdx.x;
    if (n >= tokens) return;
    const i64 id = ids[n];
    const bool valid = id >= 0 && id < vocab;
    if (!valid && threadIdx.x == 0) kiln_raise(fault);
    for (i64 j = threadIdx.x; j < hidden; j += blockDim.x) {
        out[n * hidden + j] = valid ? kiln_load(weight, id * hidden + j) : __int_as_float(0x7fc00000);
    }
}

extern "C" __global__ void embedding_f32(float* out, const float* weight, const i64* ids,
                                         i64 tokens, i64 hidden, i64 vocab, int* fault) {
    kiln_grid_dependency_wait();
    kiln_embedding(out, weight, ids, tokens, hidden, vocab, fault);
}

extern "C" __global__ void embedding_bf16(float* out, const bf16_bits* weight, const i64* ids,
                                          i64 tokens, i64 hidden, i64 vocab, int* fault) {
    kiln_grid_dependency_wait();
    kiln_embedding(out, weight, ids, tokens, hidden, vocab, fault);
}

// grad_weight [V,H] = 0 everywhere (the first of the backward's two launches).
extern "C" __global__ void zero_f32(float* out, i64 n) {
    kiln_grid_dependency_wait();
    KILN_FOR_EACH(i, n) { out[i] = 0.0f; }
}

// The same in bf16 (an empty sum rounded: the chunked loss's weight gradient of no rows).
extern "C" __global__ void zero_bf16(bf16_bits* out, i64 n) {
    kiln_grid_dependency_wait();
    KILN_FOR_EACH(i, n) { out[i] = 0; }
}

// Onto a base B (f32, or bf16 widened): grad_weight = 0 + base everywhere first, as an add
// after the scatter gives the rows no token names (0 + -0 is +0).
template <typename B>
__device__ void kiln_embedding_base(float* out, const B* base, i64 n) {
    KILN_FOR_EACH(i, n) { out[i] = 0.0f + kiln_load(base, i); }
}

extern "C" __global__ void embedding_base_f32(float* out, const float* base, i64 n) {
    kiln_grid_dependency_wait();
    kiln_embedding_base(out, base, n);
}

extern "C" __global__ void embedding_base_bf16(float* out, const bf16_bits* base, i64 n) {
    kiln_grid_dependency_wait();
    kiln_embedding_base(out, base, n);
}

// One block per token n: only the first token carrying an id (its owner) finishes that id's
// row, with the sum of grad_out over every token with that id in increasing token order (the
// CPU's order, starting from zero): `finish(id, j, sum)` for each column j. Non-owners and ids
// outside 0..V (which raise the fault word) do nothing.
//
// The owner finds the tokens with its id once per window of KILN_EMBED_WINDOW tokens (a bitmap
// in shared memory), then each thread adds those tokens' gradients for its columns in token
// order; a column's partial sum waits in `partial(n, id)[j]` between windows (the same
// additions in the same order as one running sum).
#define KILN_EMBED_WINDOW 4096
template <typename Partial, typename Finish>
__device__ void kiln_embedding_sums(const i64* ids, const float* grad_out, i64 tokens,
                                    i64 hidden, i64 vocab, int* fault, Partial partial,
                                    Finish finish) {
    __shared__ int earlier;
    __shared__ unsigned matches[KILN_EMBED_WINDOW / 32];
    const i64 n = blockIdx.x;
    if (n >= tokens) return;
    const i64 id = ids[n];
    if (id < 0 || id >= vocab) {
        if (threadIdx.x == 0) kiln_raise(fault);
        return;
    }
    if (threadIdx.x == 0) earlier = 0;
    __syncthreads();
    for (i64 m = threadIdx.x; m < n; m += blockDim.x) {
        if (ids[m] == id) earlier = 1;  // every writer stores the same value
    }
    __syncthreads();
    if (earlier) return;
    float* row = partial(n, id);
    for (i64 start = n; start < tokens; start += KILN_EMBED_WINDOW) {
        const i64 count = min((i64)KILN_EMBED_WINDOW, tokens - start);
        const bool last = start + count == tokens;
        const int words = (int)((count + 31) / 32);
        for (int w = threadIdx.x; w < words; w += blockDim.x) matches[w] = 0u;
        __syncthreads();
        for (i64 k = threadIdx.x; k < count; k += blockDim.x) {
            if (ids[start + k] == id) atomicOr(&matches[k / 32], 1u << (k % 32));
        }
        __syncthreads();
        for (i64 j = threadIdx.x; j < hidden; j += blockDim.x) {
            float acc = start == n ? 0.0f : row[j];
            for (int w = 0; w < words; ++w) {
                for (unsigned bits = matches[w]; bits != 0u; bits &= bits - 1u) {
                    const i64 m = start + 32 * w + (__ffs((int)bits) - 1);
                    acc += grad_out[m * hidden + j];
                }
            }
            if (last) {
                finish(id, j, acc);
            } else {
                row[j] = acc;
            }
        }
        __syncthreads();
    }
}

// The rows named by ids of grad_weight, after `zero_f32` or `embedding_base_*`: each the sum,
// plus the base's row where there is one (`has_base`; B f32 or bf16). The partial sums wait in
// the row itself.
template <typename B>
__device__ void kiln_embedding_backward(float* grad_weight, const i64* ids,
                                        const float* grad_out, const B* base, int has_base,
                                        i64 tokens, i64 hidden, i64 vocab, int* fault) {
    kiln_embedding_sums(
        ids, grad_out, tokens, hidden, vocab, fault,
        [&](i64, i64 id) { return grad_weight + id * hidden; },
        [&](i64 id, i64 j, float sum) {
            const i64 at = id * hidden + j;
            grad_weight[at] = has_base ? sum + kiln_load(base, at) : sum;
        });
}

extern "C" __global__ void embedding_backward_f32(float* grad_weight, const i64* ids,
                                                  const float* grad_out, const float* base,
                                                  int has_base, i64 tokens, i64 hidden,
                                                  i64 vocab, int* fault) {
    kiln_grid_dependency_wait();
    kiln_embedding_backward(grad_weight, ids, grad_out, base, has_base, tokens, hidden, vocab,
                            fault);
}

extern "C" __global__ void embedding_backward_f32_bf16_base(float* grad_weight, const i64* ids,
                                                            const float* grad_out,
                                                            const bf16_bits* base, int has_base,
                                                            i64 tokens, i64 hidden, i64 vocab,
                                                            int* fault) {
    kiln_grid_dependency_wait();
    kiln_embedding_backward(grad_weight, ids, grad_out, base, has_base, tokens, hidden, vocab,
                            fault);
}

// AdamW of an embedding table from the gradient `embedding_backward` would give it (onto a
// base or zero), which is never written (the two `EmbeddingAdamW` ops). The unnamed rows' op
// is three launches: `zero_f32` clears the bitmap `named` (a bit per row), `embedding_mark`
// sets the bit of each id, then `embedding_adamw_rest*` updates every row whose bit is clear
// from the gradient 0 + base (or 0). The named rows' op is `embedding_adamw_named*`, each
// named row from its sum plus its base row. The same gradient elements as the scatter's
// table, through adamw.cuh's arithmetic, so the bits of `embedding_backward` then `adamw`.
// The rows are disjoint, so the two ops need no order.

// One thread per token (grid-stride): sets bit `id` of `named`; an id outside 0..V sets none
// and raises the fault word.
extern "C" __global__ void embedding_mark(unsigned* named, const i64* ids, i64 tokens,
                                          i64 vocab, int* fault) {
    kiln_grid_dependency_wait();
    KILN_FOR_EACH(n, tokens) {
        const i64 id = ids[n];
        if (id < 0 || id >= vocab) {
            kiln_raise(fault);
        } else {
            atomicOr(&named[id / 32], 1u << (id % 32));
        }
    }
}

__device__ __forceinline__ bool kiln_named(const unsigned* named, i64 row) {
    return (named[row / 32] >> (row % 32)) & 1u;
}

// The gradient element of a row no id names: 0 + base (-0 becomes +0, as the scatter's table
// has it), or 0.
template <typename B>
__device__ __forceinline__ float kiln_unnamed_grad(const B* base, int has_base, i64 i) {
    return has_base ? __fadd_rn(0.0f, kiln_load(base, i)) : 0.0f;
}

// Elements 0..n of the [V, hidden] table, grid-stride; the rows whose bit is set are skipped.
template <typename B>
__device__ void kiln_embedding_adamw_rest(float* param, float* m, float* v, bf16_bits* copy,
                                          const unsigned* named, const B* base, int has_base,
                                          const i64* step, const double* rate, i64 hidden,
                                          i64 n, double weight_decay, double beta1,
                                          double beta2, float m_weight, float beta2_f32,
                                          float v_weight, float eps) {
    const KilnAdamW h = kiln_adamw_scalars(step, rate, weight_decay, beta1, beta2, m_weight,
                                           beta2_f32, v_weight, eps);
    KILN_FOR_EACH(i, n) {
        if (kiln_named(named, i / hidden)) continue;
        float p = param[i], mi = m[i], vi = v[i];
        kiln_adamw_one(p, mi, vi, kiln_unnamed_grad(base, has_base, i), h);
        param[i] = p;
        m[i] = mi;
        v[i] = vi;
        if (copy != nullptr) copy[i] = kiln_f32_to_bf16(p);
    }
}

// The same four elements at a time: n4 = n / 4 vectors, hidden a multiple of 4 (a vector
// never straddles two rows), every pointer aligned to its vector (B4: float4 for an f32 base,
// uint2 for bf16).
template <typename B4>
__device__ void kiln_embedding_adamw_rest_vec4(float4* param, float4* m, float4* v,
                                               uint2* copy, const unsigned* named,
                                               const B4* base, int has_base, const i64* step,
                                               const double* rate, i64 hidden, i64 n4,
                                               double weight_decay, double beta1,
                                               double beta2, float m_weight, float beta2_f32,
                                               float v_weight, float eps) {
    const KilnAdamW h = kiln_adamw_scalars(step, rate, weight_decay, beta1, beta2, m_weight,
                                           beta2_f32, v_weight, eps);
    const i64 hidden4 = hidden / 4;
    KILN_FOR_EACH(i, n4) {
        if (kiln_named(named, i / hidden4)) continue;
        float4 g = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (has_base) {
            const float4 b = kiln_load4(base, i);
            g = make_float4(__fadd_rn(0.0f, b.x), __fadd_rn(0.0f, b.y), __fadd_rn(0.0f, b.z),
                            __fadd_rn(0.0f, b.w));
        }
        float4 p = param[i], mi = m[i], vi = v[i];
        kiln_adamw_one(p.x, mi.x, vi.x, g.x, h);
        kiln_adamw_one(p.y, mi.y, vi.y, g.y, h);
        kiln_adamw_one(p.z, mi.z, vi.z, g.z, h);
        kiln_adamw_one(p.w, mi.w, vi.w, g.w, h);
        param[i] = p;
        m[i] = mi;
        v[i] = vi;
        if (copy != nullptr) kiln_store4(copy, i, p);
    }
}

// One block per token: the owner of each id updates that row from its sum (+ its base row),
// the partial sums between windows waiting in `partials` [tokens, hidden] (unused, and may be
// null, for at most KILN_EMBED_WINDOW tokens).
template <typename B>
__device__ void kiln_embedding_adamw_named(float* param, float* m, float* v, bf16_bits* copy,
                                           float* partials, const i64* ids,
                                           const float* grad_out, const B* base, int has_base,
                                           const i64* step, const double* rate, i64 tokens,
                                           i64 hidden, i64 vocab, int* fault,
                                           double weight_decay, double beta1, double beta2,
                                           float m_weight, float beta2_f32, float v_weight,
                                           float eps) {
    const KilnAdamW h = kiln_adamw_scalars(step, rate, weight_decay, beta1, beta2, m_weight,
                                           beta2_f32, v_weight, eps);
    kiln_embedding_sums(
        ids, grad_out, tokens, hidden, vocab, fault,
        [&](i64 n, i64) { return partials + n * hidden; },
        [&](i64 id, i64 j, float sum) {
            const i64 i = id * hidden + j;
            float p = param[i], mi = m[i], vi = v[i];
            kiln_adamw_one(p, mi, vi, has_base ? sum + kiln_load(base, i) : sum, h);
            param[i] = p;
            m[i] = mi;
            v[i] = vi;
            if (copy != nullptr) copy[i] = kiln_f32_to_bf16(p);
        });
}

// Entry points per base dtype (f32, or bf16 widened; without a base, any valid pointer and
// has_base = 0).
#define KILN_EMBEDDING_ADAMW_ENTRY(rest, rest_vec4, named_rows, B, B4)                                \
    extern "C" __global__ void rest(float* param, float* m, float* v, bf16_bits* copy,            \
                                    const unsigned* named, const B* base, int has_base,           \
                                    const i64* step, const double* rate, i64 hidden, i64 n,       \
                                    double weight_decay, double beta1, double beta2,              \
                                    float m_weight, float beta2_f32, float v_weight, float eps) { \
        kiln_grid_dependency_wait();                                                              \
        kiln_embedding_adamw_rest(param, m, v, copy, named, base, has_base, step, rate, hidden,   \
                                  n, weight_decay, beta1, beta2, m_weight, beta2_f32, v_weight,   \
                                  eps);                                                           \
    }                                                                                             \
    extern "C" __global__ void rest_vec4(                                                         \
        float4* param, float4* m, float4* v, uint2* copy, const unsigned* named, const B4* base, \
        int has_base, const i64* step, const double* rate, i64 hidden, i64 n,                    \
        double weight_decay, double beta1, double beta2, float m_weight, float beta2_f32,         \
        float v_weight, float eps) {                                                              \
        kiln_grid_dependency_wait();                                                              \
        kiln_embedding_adamw_rest_vec4(param, m, v, copy, named, base, has_base, step, rate,      \
                                       hidden, n, weight_decay, beta1, beta2, m_weight,           \
                                       beta2_f32, v_weight, eps);                                 \
    }                                                                                             \
    extern "C" __global__ void named_rows(                                                        \
        float* param, float* m, float* v, bf16_bits* copy, float* partials, const i64* ids,       \
        const float* grad_out, const B* base, int has_base, const i64* step, const double* rate,  \
        i64 tokens, i64 hidden, i64 vocab, int* fault, double weight_decay, double beta1,         \
        double beta2, float m_weight, float beta2_f32, float v_weight, float eps) {              \
        kiln_grid_dependency_wait();                                                              \
        kiln_embedding_adamw_named(param, m, v, copy, partials, ids, grad_out, base, has_base,    \
                                   step, rate, tokens, hidden, vocab, fault, weight_decay, beta1, \
                                   beta2, m_weight, beta2_f32, v_weight, eps);                    \
    }
// (one line a use: the signature checks of kernels/src/gpu/tests.rs expand it so)
KILN_EMBEDDING_ADAMW_ENTRY(embedding_adamw_rest_f32, embedding_adamw_rest_f32_vec4, embedding_adamw_named_f32, float, float4)
KILN_EMBEDDING_ADAMW_ENTRY(embedding_adamw_rest_bf16, embedding_adamw_rest_bf16_vec4, embedding_adamw_named_bf16, bf16_bits, uint2)
