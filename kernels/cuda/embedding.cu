// Embedding gather and its deterministic scatter-add backward (no atomics).

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

// One block per token n: only the first token carrying an id (its owner) writes that id's row,
// as the sum of grad_out over every token with that id in increasing token order - the CPU's
// order, starting from zero - plus the base's row where there is one (`has_base`; B f32 or
// bf16). Rows no token names keep what `zero_f32` or `embedding_base_*` wrote; an id outside
// 0..V adds nothing and raises the fault word.
//
// The owner finds the tokens with its id once per window of KILN_EMBED_WINDOW tokens (a bitmap
// in shared memory), then each thread adds those tokens' gradients for its columns in token
// order; a row's partial sum waits in the row itself between windows (the same additions in
// the same order as one running sum).
#define KILN_EMBED_WINDOW 4096
template <typename B>
__device__ void kiln_embedding_backward(float* grad_weight, const i64* ids,
                                        const float* grad_out, const B* base, int has_base,
                                        i64 tokens, i64 hidden, i64 vocab, int* fault) {
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
    float* row = grad_weight + id * hidden;
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
            row[j] = last && has_base ? acc + kiln_load(base, id * hidden + j) : acc;
        }
        __syncthreads();
    }
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
