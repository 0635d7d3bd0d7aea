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

// One block per token n: only the first token carrying an id (its owner) writes that id's row,
// as the sum of grad_out over every token with that id in increasing token order - the CPU's
// order, starting from zero. Rows no token names keep the zeros of `zero_f32`; an id outside
// 0..V adds nothing and raises the fault word.
extern "C" __global__ void embedding_backward_f32(float* grad_weight, const i64* ids,
                                                  const float* grad_out, i64 tokens, i64 hidden,
                                                  i64 vocab, int* fault) {
    kiln_grid_dependency_wait();
    __shared__ int earlier;
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
    for (i64 j = threadIdx.x; j < hidden; j += blockDim.x) {
        float acc = 0.0f;
        for (i64 m = n; m < tokens; ++m) {
            if (ids[m] == id) acc += grad_out[m * hidden + j];
        }
        grad_weight[id * hidden + j] = acc;
    }
}
