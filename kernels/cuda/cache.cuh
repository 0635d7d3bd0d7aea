// Where a KV-cache append writes (cache.cu's kernels, and the q/k/v linear's RoPE and cache
// epilogue in linear.cu): rows positions[b]..positions[b]+T of batch row b's cache row, rows[b]
// of a pool of `slots` rows, or b itself when rows is null; a padding row writes nothing.

// The element of cache [S,H,Smax,D] that element d of head h of new row t of batch row b
// goes to, or -1 when it goes nowhere: a padding row, or a block that would not fit the cache,
// a slot outside the pool or a slot two batch rows take (which raise the fault word).
__device__ __forceinline__ i64 kiln_cache_at(const i64* positions, const i64* rows, i64 slots,
                                             i64 b, i64 h, i64 t, i64 d, i64 heads,
                                             i64 capacity, i64 block, i64 head_dim,
                                             int* fault) {
    const i64 start = positions[b];
    const i64 slot = kiln_slot(rows, b, slots);
    if (start < 0 || start + block > capacity || slot == KILN_BAD_SLOT ||
        kiln_slot_taken(rows, b)) {
        kiln_raise(fault);
        return -1;
    }
    if (slot == KILN_PADDING_SLOT) return -1;
    return ((slot * heads + h) * capacity + start + t) * head_dim + d;
}
