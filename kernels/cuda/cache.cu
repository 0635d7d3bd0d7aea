// KV cache append: rows positions[b]..positions[b]+T of every head of batch row b of
// cache [B,H,Smax,D] are overwritten by new [B,H,T,D]. The positions are a device input, so
// one captured graph serves every decode step. A block that would not fit the cache is
// skipped and raises the fault word.
// The cache C is f32 or bf16 (new rows rounded into a bf16 cache); `fresh` is f32.
template <typename C>
__device__ void kiln_kv_cache_write(C* cache, const float* fresh, const i64* positions,
                                    i64 batch, i64 heads, i64 capacity, i64 block, i64 head_dim,
                                    int* fault) {
    const i64 n = batch * heads * block * head_dim;
    KILN_FOR_EACH(index, n) {
        const i64 d = index % head_dim;
        const i64 t = (index / head_dim) % block;
        const i64 bh = index / (head_dim * block);
        const i64 start = positions[bh / heads];
        if (start < 0 || start + block > capacity) {
            kiln_raise(fault);
            continue;
        }
        kiln_store(cache, (bh * capacity + start + t) * head_dim + d, fresh[index]);
    }
}

extern "C" __global__ void kv_cache_write_f32(float* cache, const float* fresh,
                                              const i64* positions, i64 batch, i64 heads,
                                              i64 capacity, i64 block, i64 head_dim,
                                              int* fault) {
    kiln_kv_cache_write(cache, fresh, positions, batch, heads, capacity, block, head_dim, fault);
}

extern "C" __global__ void kv_cache_write_f32_bf16(bf16_bits* cache, const float* fresh,
                                                   const i64* positions, i64 batch, i64 heads,
                                                   i64 capacity, i64 block, i64 head_dim,
                                                   int* fault) {
    kiln_kv_cache_write(cache, fresh, positions, batch, heads, capacity, block, head_dim, fault);
}
