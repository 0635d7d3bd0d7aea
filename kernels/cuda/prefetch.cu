// L2 prefetch of parameters that later kernels read (sm_90 and later): up to eight ranges of
// bytes, each 16-byte aligned (a null pointer or 0 bytes for none; the program fills them,
// kernels/src/gpu/prefetch.rs). The ranges are cut into pieces of KILN_PREFETCH_PIECE bytes,
// dealt to the launch's blocks in turn, and each piece is one bulk prefetch into L2 (a
// multiprocessor's bulk copy unit takes its pieces one after another, so the launch has a
// block per multiprocessor). A prefetch is a hint: it writes nothing and nothing waits for
// it. Elsewhere (older architectures, hipRTC) it is empty.
//
// The program issues this launch (`side_kernel`) on a side stream beside the kernels before
// the parameters' readers, so no kernel on the step's critical path spends its time issuing
// the prefetches. Its wait is for the launch before it on the side stream (an earlier
// prefetch), long finished.
#define KILN_PREFETCH_PIECE 16384
extern "C" __global__ void prefetch_l2(const char* at0, i64 bytes0, const char* at1, i64 bytes1,
                                       const char* at2, i64 bytes2, const char* at3, i64 bytes3,
                                       const char* at4, i64 bytes4, const char* at5, i64 bytes5,
                                       const char* at6, i64 bytes6, const char* at7,
                                       i64 bytes7) {
    kiln_grid_dependency_wait();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const char* at[8] = {at0, at1, at2, at3, at4, at5, at6, at7};
    const i64 given[8] = {bytes0, bytes1, bytes2, bytes3, bytes4, bytes5, bytes6, bytes7};
    // Pieces go to the blocks in turn (thread 0 of every block, then thread 1, ...): each
    // block's share, and its multiprocessor's bulk copy unit's, is as even as it can be.
    const i64 blocks = (i64)gridDim.x * gridDim.y * gridDim.z;
    const i64 block = ((i64)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    const i64 threads = blocks * blockDim.x;
    i64 piece = (i64)threadIdx.x * blocks + block;
    for (int r = 0; r < 8; ++r) {
        // Whole 16-byte units only (the bulk prefetch's size and address unit; the program
        // gives only such ranges, this is a guard).
        const i64 bytes = at[r] && given[r] > 0 ? given[r] / 16 * 16 : 0;
        const i64 pieces = (bytes + KILN_PREFETCH_PIECE - 1) / KILN_PREFETCH_PIECE;
        for (; piece < pieces; piece += threads) {
            const i64 offset = piece * KILN_PREFETCH_PIECE;
            const i64 left = bytes - offset;
            const i64 size = left < KILN_PREFETCH_PIECE ? left : KILN_PREFETCH_PIECE;
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(at[r] + offset),
                         "r"((unsigned)size)
                         : "memory");
        }
        piece -= pieces;  // this thread's next piece, counted from the next range's start
    }
#endif
}
