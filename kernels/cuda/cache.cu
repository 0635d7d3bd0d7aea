// KV cache append, alone and with RoPE: positions positions[b]..positions[b]+T of every head
// of batch row b's cache row of cache [S,H,Smax,D] are overwritten by new [B,H,T,D]. Batch row
// b's cache row is rows[b] of a pool of `slots` rows, or b itself when rows is null; a padding
// row writes nothing. The positions and rows are device inputs, so one captured graph serves
// every decode step. A block that would not fit the cache, a slot outside the pool and a slot
// two batch rows take are skipped and raise the fault word. The cache C is f32 or bf16 (new
// rows rounded into a bf16 cache); `fresh` is f32.

template <typename C>
__device__ void kiln_kv_cache_write(C* cache, const float* fresh, const i64* positions,
                                    const i64* rows, i64 slots, i64 batch, i64 heads,
                                    i64 capacity, i64 block, i64 head_dim, int* fault) {
    const i64 n = batch * heads * block * head_dim;
    KILN_FOR_EACH(index, n) {
        const i64 d = index % head_dim;
        const i64 t = (index / head_dim) % block;
        const i64 bh = index / (head_dim * block);
        const i64 at = kiln_cache_at(positions, rows, slots, bh / heads, bh % heads, t, d, heads,
                                     capacity, block, head_dim, fault);
        if (at >= 0) kiln_store(cache, at, fresh[index]);
    }
}

extern "C" __global__ void kv_cache_write_f32(float* cache, const float* fresh,
                                              const i64* positions, const i64* rows, i64 slots,
                                              i64 batch, i64 heads, i64 capacity, i64 block,
                                              i64 head_dim, int* fault) {
    kiln_grid_dependency_wait();
    kiln_kv_cache_write(cache, fresh, positions, rows, slots, batch, heads, capacity, block,
                        head_dim, fault);
}

extern "C" __global__ void kv_cache_write_f32_bf16(bf16_bits* cache, const float* fresh,
                                                   const i64* positions, const i64* rows,
                                                   i64 slots, i64 batch, i64 heads,
                                                   i64 capacity, i64 block, i64 head_dim,
                                                   int* fault) {
    kiln_grid_dependency_wait();
    kiln_kv_cache_write(cache, fresh, positions, rows, slots, batch, heads, capacity, block,
                        head_dim, fault);
}

// A decode attention's inputs in one launch (`RopeKvWrite`): q [B,T,Hq,D] rotated into
// q_rot [B,Hq,T,D] as rope_f32 does, k [B,T,Hkv,D] rotated and written into k_cache, and
// v [B,Hkv,T,D] written into v_cache, both as kv_cache_write does (the rotated keys are
// rounded into the cache once, never stored apart). One thread per query pair, key pair or
// value element. The caches C and biases B are each f32 or bf16.
template <typename C, typename B>
__device__ void kiln_rope_kv(float* q_rot, C* k_cache, C* v_cache, const float* q,
                             const float* k, const float* v, const i64* rope_positions,
                             const i64* positions, const i64* rows, i64 slots, const B* q_bias,
                             const B* k_bias, int has_bias, i64 batch, i64 seq, i64 q_heads,
                             i64 kv_heads, i64 capacity, i64 head_dim, float theta, int* fault) {
    const i64 half = head_dim / 2;
    const i64 q_pairs = batch * seq * q_heads * half;
    const i64 k_pairs = batch * seq * kv_heads * half;
    const i64 values = batch * kv_heads * seq * head_dim;
    KILN_FOR_EACH(index, q_pairs + k_pairs + values) {
        if (index < q_pairs) {
            const KilnRopePair p = kiln_rope_pair(q, rope_positions, q_bias, has_bias, index,
                                                  seq, q_heads, head_dim, theta, fault);
            const i64 dst = ((p.b * q_heads + p.h) * seq + p.t) * head_dim + p.i;
            q_rot[dst] = p.lo;
            q_rot[dst + half] = p.hi;
        } else if (index < q_pairs + k_pairs) {
            const KilnRopePair p = kiln_rope_pair(k, rope_positions, k_bias, has_bias,
                                                  index - q_pairs, seq, kv_heads, head_dim,
                                                  theta, fault);
            const i64 at = kiln_cache_at(positions, rows, slots, p.b, p.h, p.t, p.i, kv_heads,
                                         capacity, seq, head_dim, fault);
            if (at >= 0) {
                kiln_store(k_cache, at, p.lo);
                kiln_store(k_cache, at + half, p.hi);
            }
        } else {
            const i64 item = index - q_pairs - k_pairs;
            const i64 d = item % head_dim;
            const i64 t = (item / head_dim) % seq;
            const i64 bh = item / (head_dim * seq);
            const i64 b = bh / kv_heads, h = bh % kv_heads;
            const float value = v[item];
            const i64 at = kiln_cache_at(positions, rows, slots, b, h, t, d, kv_heads, capacity,
                                         seq, head_dim, fault);
            if (at >= 0) kiln_store(v_cache, at, value);
        }
    }
}

// The staged form (a prefill attention's: RopeKvWrite's `staged`): the same rotations and
// cache writes from v [B,T,Hkv,D] token-major like k, and the rotated queries written as f16
// q_rows [B,Hq,T,D] instead of q_rot, the rotated keys as k_rows and v head-major as v_rows,
// [B,Hkv,T,D] f16 (rounded to nearest even, as FlashAttention's staging rounds them): the rows
// its f16 kernels read. A block takes one token (b, t) at a time: its threads compute the
// token's angles (kiln_rope_token_angles, as every RoPE kernel does) into shared memory (D
// floats, dynamic: kiln_rope_angles) once for all of its heads, then take the token's query
// pairs, key pairs and value elements in turn, consecutive threads on consecutive elements.
template <typename C, typename B>
__device__ void kiln_rope_kv_stage(unsigned short* q_rows, unsigned short* k_rows,
                                   unsigned short* v_rows, C* k_cache, C* v_cache,
                                   const float* q, const float* k, const float* v,
                                   const i64* rope_positions, const i64* positions,
                                   const i64* rows, i64 slots, const B* q_bias, const B* k_bias,
                                   int has_bias, i64 batch, i64 seq, i64 q_heads, i64 kv_heads,
                                   i64 capacity, i64 head_dim, float theta, int* fault) {
    const int half = (int)(head_dim / 2), dim = (int)head_dim;
    float* cos_at = kiln_rope_angles;
    float* sin_at = kiln_rope_angles + half;
    const int q_pairs = (int)q_heads * half;
    const int pairs = q_pairs + (int)kv_heads * half;
    const int items = pairs + (int)kv_heads * dim;
    for (i64 token = blockIdx.x; token < batch * seq; token += gridDim.x) {
        const i64 b = token / seq, t = token % seq;
        kiln_rope_token_angles(theta, rope_positions[token], head_dim, cos_at, sin_at, fault);
        __syncthreads();
        for (int e = threadIdx.x; e < items; e += blockDim.x) {
            if (e < pairs) {
                const bool query = e < q_pairs;
                const int pair = query ? e : e - q_pairs;
                const int h = pair / half, i = pair % half;
                const i64 heads = query ? q_heads : kv_heads;
                const float* x = query ? q : k;
                const B* bias = query ? q_bias : k_bias;
                const i64 src = (token * heads + h) * head_dim;
                const KilnRotated r =
                    kiln_rope_rotate(x + src, bias, has_bias, h, i, dim, cos_at[i], sin_at[i]);
                const i64 dst = ((b * heads + h) * seq + t) * head_dim + i;
                unsigned short* out = query ? q_rows : k_rows;
                out[dst] = kiln_f32_to_f16(r.lo);
                out[dst + half] = kiln_f32_to_f16(r.hi);
                if (!query) {
                    const i64 at = kiln_cache_at(positions, rows, slots, b, h, t, i, kv_heads,
                                                 capacity, seq, head_dim, fault);
                    if (at >= 0) {
                        kiln_store(k_cache, at, r.lo);
                        kiln_store(k_cache, at + half, r.hi);
                    }
                }
            } else {
                const int h = (e - pairs) / dim, d = (e - pairs) % dim;
                const float value = v[(token * kv_heads + h) * head_dim + d];
                const i64 at = kiln_cache_at(positions, rows, slots, b, h, t, d, kv_heads,
                                             capacity, seq, head_dim, fault);
                if (at >= 0) kiln_store(v_cache, at, value);
                v_rows[((b * kv_heads + h) * seq + t) * head_dim + d] = kiln_f32_to_f16(value);
            }
        }
        // The next token's angles wait for every thread to be done with these.
        __syncthreads();
    }
}

// The entry points: kiln_rope_kv as `name` for caches of C and biases of B, named by the caches'
// dtype, then the biases' where they differ (the argument checks of kernels/src/gpu/tests.rs
// expand the macros and read these signatures).
#define KILN_ROPE_KV_WRITE_ENTRY(name, C, B)                                                      \
    extern "C" __global__ void name(                                                            \
        float* q_rot, C* k_cache, C* v_cache, const float* q, const float* k, const float* v,   \
        const i64* rope_positions, const i64* positions, const i64* rows, i64 slots,            \
        const B* q_bias, const B* k_bias, int has_bias, i64 batch, i64 seq, i64 q_heads,        \
        i64 kv_heads, i64 capacity, i64 head_dim, float theta, int* fault) {                    \
        kiln_grid_dependency_wait();                                                            \
        kiln_rope_kv(q_rot, k_cache, v_cache, q, k, v, rope_positions, positions, rows, slots,   \
                     q_bias, k_bias, has_bias, batch, seq, q_heads, kv_heads, capacity,         \
                     head_dim, theta, fault);                                                   \
    }
KILN_ROPE_KV_WRITE_ENTRY(rope_kv_write_f32, float, float)
KILN_ROPE_KV_WRITE_ENTRY(rope_kv_write_f32_bf16, float, bf16_bits)
KILN_ROPE_KV_WRITE_ENTRY(rope_kv_write_bf16, bf16_bits, bf16_bits)
KILN_ROPE_KV_WRITE_ENTRY(rope_kv_write_bf16_f32, bf16_bits, float)

// The staged form, named as rope_kv_write's.
#define KILN_ROPE_KV_STAGE_ENTRY(name, C, B)                                                      \
    extern "C" __global__ void name(                                                            \
        unsigned short* q_rows, unsigned short* k_rows, unsigned short* v_rows, C* k_cache,     \
        C* v_cache, const float* q, const float* k, const float* v, const i64* rope_positions,  \
        const i64* positions, const i64* rows, i64 slots, const B* q_bias, const B* k_bias,     \
        int has_bias, i64 batch, i64 seq, i64 q_heads, i64 kv_heads, i64 capacity,              \
        i64 head_dim, float theta, int* fault) {                                                \
        kiln_grid_dependency_wait();                                                            \
        kiln_rope_kv_stage(q_rows, k_rows, v_rows, k_cache, v_cache, q, k, v, rope_positions,    \
                           positions, rows, slots, q_bias, k_bias, has_bias, batch, seq,        \
                           q_heads, kv_heads, capacity, head_dim, theta, fault);                \
    }
KILN_ROPE_KV_STAGE_ENTRY(rope_kv_stage_f32, float, float)
KILN_ROPE_KV_STAGE_ENTRY(rope_kv_stage_f32_bf16, float, bf16_bits)
KILN_ROPE_KV_STAGE_ENTRY(rope_kv_stage_bf16, bf16_bits, bf16_bits)
KILN_ROPE_KV_STAGE_ENTRY(rope_kv_stage_bf16_f32, bf16_bits, float)
