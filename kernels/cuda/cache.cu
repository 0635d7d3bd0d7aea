// KV cache append: rows positions[b]..positions[b]+T of every head of batch row b of
// cache [B,H,Smax,D] are overwritten by new [B,H,T,D]. The positions are a device input, so
// one captured graph serves every decode step. A block that would not fit the cache is
// skipped and raises the fault word.
extern "C" __global__ void kv_cache_write_f32(float* cache, const float* fresh,
                                              const i64* positions, i64 batch, i64 heads,
                                              i64 capacity, i64 block, i64 head_dim,
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
        cache[(bh * capacity + start + t) * head_dim + d] = fresh[index];
    }
}
