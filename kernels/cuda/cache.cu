// KV cache append: positions positions[b]..positions[b]+T of every head of batch row b's cache
// row of cache [S,H,Smax,D] are overwritten by new [B,H,T,D]. Batch row b's cache row is
// rows[b] of a pool of `slots` rows, or b itself when rows is null; a padding row writes
// nothing. The positions and rows are device inputs, so one captured graph serves every
// decode step. A block that would not fit
// the cache, a slot outside the pool and a slot two batch rows take are skipped and raise the
// fault word.
// The cache C is f32 or bf16 (new rows rounded into a bf16 cache); `fresh` is f32.
template <typename C>
__device__ void kiln_kv_cache_write(C* cache, const float* fresh, const i64* positions,
                                    const i64* rows, i64 slots, i64 batch, i64 heads,
                                    i64 capacity, i64 block, i64 head_dim, int* fault) {
    const i64 n = batch * heads * block * head_dim;
    KILN_FOR_EACH(index, n) {
        const i64 d = index % head_dim;
        const i64 t = (index / head_dim) % block;
        const i64 bh = index / (head_dim * block);
        const i64 b = bh / heads, h = bh % heads;
        const i64 start = positions[b];
        const i64 slot = kiln_slot(rows, b, slots);
        if (start < 0 || start + block > capacity || slot == KILN_BAD_SLOT ||
            kiln_slot_taken(rows, b)) {
            kiln_raise(fault);
            continue;
        }
        if (slot == KILN_PADDING_SLOT) continue;
        kiln_store(cache, ((slot * heads + h) * capacity + start + t) * head_dim + d,
                   fresh[index]);
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
