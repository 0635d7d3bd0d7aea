// Shared by every kiln kernel module (prepended to each module's text by kernels/src/gpu.rs).
//
// A subset of CUDA C that NVRTC and hipRTC both compile: no #include, bf16 as raw bits.
// Determinism: every reduction combines partial results in an order fixed by blockDim alone
// (never by timing), and no kernel uses atomics, so the same inputs give the same bits.

typedef long long i64;
typedef unsigned short bf16_bits;

#define KILN_WARP 32
#define KILN_FULL_MASK 0xffffffffu

// Warp shuffles over groups of KILN_WARP = 32 lanes, the one place kiln's kernels name them:
// by lane mask (butterflies), down by a distance, and from a lane of the group (`src_lane`,
// 0..31). NVRTC: CUDA's *_sync intrinsics over the whole warp. hipRTC (__HIPCC_RTC__): HIP's,
// with the group width, so that a 64-lane wavefront is two groups of 32 and every butterfly,
// reduction and exchange keeps its 32-lane pairing and order. Every lane of a group executes
// each shuffle (none sits under a condition that differs within a group).
#if defined(__HIPCC_RTC__)
template <typename T>
__device__ __forceinline__ T kiln_shfl_xor(T value, int lane_mask) {
    return __shfl_xor(value, lane_mask, KILN_WARP);
}
template <typename T>
__device__ __forceinline__ T kiln_shfl_down(T value, int delta) {
    return __shfl_down(value, delta, KILN_WARP);
}
template <typename T>
__device__ __forceinline__ T kiln_shfl(T value, int src_lane) {
    return __shfl(value, src_lane, KILN_WARP);
}
#else
template <typename T>
__device__ __forceinline__ T kiln_shfl_xor(T value, int lane_mask) {
    return __shfl_xor_sync(KILN_FULL_MASK, value, lane_mask);
}
template <typename T>
__device__ __forceinline__ T kiln_shfl_down(T value, int delta) {
    return __shfl_down_sync(KILN_FULL_MASK, value, delta);
}
template <typename T>
__device__ __forceinline__ T kiln_shfl(T value, int src_lane) {
    return __shfl_sync(KILN_FULL_MASK, value, src_lane);
}
#endif

// Programmatic dependent launch (sm_90 and later): kiln may launch each kernel with
// programmatic stream serialization, so that it is scheduled while the kernel before it on
// its stream still runs. Every kiln kernel therefore begins here (the skinny linears once their
// first weight loads, of parameters nothing writes, are in flight: linear_common.cuh): it
// waits until the grids it depends on have completed and their writes are visible
// (griddepcontrol.wait), then lets the
// next kernel launch (griddepcontrol.launch_dependents), whose own wait keeps it from reading
// anything early. As no kernel can finish before its wait returns, completion stays in stream
// order, so a kernel also sees the writes of every kernel before its predecessor. Launched
// without the attribute, the wait returns at once. Elsewhere (older architectures, hipRTC)
// both are empty, and kiln launches without the attribute.
__device__ __forceinline__ void kiln_grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Thread block clusters (sm_90 and later): every thread of every block of the launch's cluster
// arrives, then waits for the others. The arrive releases and the wait acquires at cluster
// scope, so each block sees the memory writes, global ones included, that the cluster's
// threads made before arriving. Only kernels launched as clusters call it (their builders set
// the cluster shape and the flag that takes this path together); elsewhere (older
// architectures, hipRTC) it is empty and never reached.
__device__ __forceinline__ void kiln_cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// bf16 bits -> f32: exact (bf16 is the upper half of an f32; NaN payloads are kept).
__device__ __forceinline__ float kiln_bf16_to_f32(bf16_bits bits) {
    return __uint_as_float(((unsigned int)bits) << 16);
}

// f32 -> bf16 bits, rounded to nearest even; NaN stays NaN (quieted), as `half::bf16::from_f32`.
__device__ __forceinline__ bf16_bits kiln_f32_to_bf16(float value) {
    unsigned int x = __float_as_uint(value);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (bf16_bits)((x >> 16) | 0x0040u);
    }
    const unsigned int round_bit = 0x00008000u;
    if ((x & round_bit) != 0u && (x & (3u * round_bit - 1u)) != 0u) {
        return (bf16_bits)((x >> 16) + 1u);
    }
    return (bf16_bits)(x >> 16);
}

// f16 bits -> f32: exact (subnormals as such, NaN payloads kept). hipRTC: the hardware
// conversion of its _Float16 (in software, the emulated f16 mma's loops grow past what its
// compiler unrolls).
__device__ __forceinline__ float kiln_f16_to_f32(unsigned short bits) {
#ifdef __HIPCC_RTC__
    return (float)__builtin_bit_cast(_Float16, bits);
#else
    const unsigned int sign = ((unsigned int)bits & 0x8000u) << 16;
    const unsigned int exp = ((unsigned int)bits >> 10) & 0x1fu, man = (unsigned int)bits & 0x3ffu;
    const unsigned int wide = exp == 0x1fu ? 0xffu : exp + 112u; // an infinity or NaN stays one
    const unsigned int normal = sign | (wide << 23) | (man << 13);
    const unsigned int tiny = sign | __float_as_uint((float)man * 5.9604644775390625e-8f);
    return __uint_as_float(exp == 0u ? tiny : normal); // man · 2^-24 below the normal range
#endif
}

// f32 -> f16 bits, rounded to nearest even (to subnormals, and past 65504 to an infinity); NaN
// stays NaN (quieted, its upper payload kept), as `half::f16::from_f32`. hipRTC: the hardware
// conversion, as kiln_f16_to_f32.
__device__ __forceinline__ unsigned short kiln_f32_to_f16(float value) {
#ifdef __HIPCC_RTC__
    return __builtin_bit_cast(unsigned short, (_Float16)value);
#else
    const unsigned int x = __float_as_uint(value);
    const unsigned int sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
    const unsigned int special = 0x7c00u | (man != 0u ? 0x0200u | (man >> 13) : 0u);
    const int e = (int)exp - 112; // the f16 exponent field
    // The kept bits and the dropped ones: a normal result keeps 10 of the 23, a subnormal one
    // (e <= 0) 24 - (14 - e) of the 24 with the implicit bit (none past 24 dropped: 0, as a
    // value below half the least subnormal rounds to); the carry of a rounding up runs into
    // the exponent field (to the next binade, or past 65504 to the infinity).
    const unsigned int full = e > 0 ? man : (man | 0x800000u);
    const int drop = e > 0 ? 13 : (14 - e < 25 ? 14 - e : 25);
    const unsigned int kept = full >> drop, rest = full & ((1u << drop) - 1u);
    const unsigned int half = 1u << (drop - 1);
    const unsigned int up = rest > half || (rest == half && (kept & 1u)) ? 1u : 0u;
    const unsigned int finite = (e > 0 ? ((unsigned int)e << 10) | kept : kept) + up;
    const unsigned int bits = exp == 0xffu ? special : (e >= 0x1f ? 0x7c00u : finite);
    return (unsigned short)(sign | bits);
#endif
}

// Stored operands (weights, biases, caches) of kernels that compute in f32: f32 as is, or
// bf16 widened exactly where read and rounded to nearest even where written. Kernels that take
// either are templates over the stored type, instantiated once per dtype.
__device__ __forceinline__ float kiln_load(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ float kiln_load(const bf16_bits* p, i64 i) {
    return kiln_bf16_to_f32(p[i]);
}
// Four stored elements at once: 16 bytes of f32, or 8 of bf16 (element 0 in the low bits).
__device__ __forceinline__ float4 kiln_load4(const float4* p, i64 i) { return p[i]; }
__device__ __forceinline__ float4 kiln_load4(const uint2* p, i64 i) {
    const uint2 b = p[i];
    return make_float4(kiln_bf16_to_f32((bf16_bits)(b.x & 0xffffu)),
                       kiln_bf16_to_f32((bf16_bits)(b.x >> 16)),
                       kiln_bf16_to_f32((bf16_bits)(b.y & 0xffffu)),
                       kiln_bf16_to_f32((bf16_bits)(b.y >> 16)));
}
__device__ __forceinline__ void kiln_store(float* p, i64 i, float v) { p[i] = v; }
__device__ __forceinline__ void kiln_store(bf16_bits* p, i64 i, float v) {
    p[i] = kiln_f32_to_bf16(v);
}
// A result in its forms (kernels/src/gpu/launch.rs `Forms`): f32 where `f32` is not null,
// rounded to bf16 where `rounded` is not null, either or both.
__device__ __forceinline__ void kiln_store_forms(float* f32, bf16_bits* rounded, i64 i,
                                                 float v) {
    if (f32 != nullptr) f32[i] = v;
    if (rounded != nullptr) rounded[i] = kiln_f32_to_bf16(v);
}
// Four elements at once, as `kiln_load4` reads them.
__device__ __forceinline__ void kiln_store4(float4* p, i64 i, float4 v) { p[i] = v; }
__device__ __forceinline__ void kiln_store4(uint2* p, i64 i, float4 v) {
    uint2 packed;
    packed.x = (unsigned)kiln_f32_to_bf16(v.x) | ((unsigned)kiln_f32_to_bf16(v.y) << 16);
    packed.y = (unsigned)kiln_f32_to_bf16(v.z) | ((unsigned)kiln_f32_to_bf16(v.w) << 16);
    p[i] = packed;
}

// Sum over a warp by butterfly (every lane gets the same bits: the pairing is fixed).
__device__ __forceinline__ float kiln_warp_sum(float value) {
    for (int lane_mask = KILN_WARP / 2; lane_mask > 0; lane_mask >>= 1) {
        value += kiln_shfl_xor(value, lane_mask);
    }
    return value;
}

// max(a, b) that is NaN when either is NaN. `fmaxf` returns the other operand, which would
// let a NaN vanish from a row max: the CPU reference's row then turns NaN (its sum of
// exp(x - max) meets the NaN), the GPU's must too. Every max of a reduction uses this one.
__device__ __forceinline__ float kiln_max(float a, float b) {
    return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

__device__ __forceinline__ float kiln_warp_max(float value) {
    for (int lane_mask = KILN_WARP / 2; lane_mask > 0; lane_mask >>= 1) {
        value = kiln_max(value, kiln_shfl_xor(value, lane_mask));
    }
    return value;
}

// Block-wide sum (blockDim.x a multiple of 32, at most 1024), returned to every thread.
// `scratch` holds 32 floats of shared memory; the call begins and ends with a barrier, so
// scratch can be reused by the next call.
__device__ float kiln_block_sum(float value, float* scratch) {
    const int lane = threadIdx.x % KILN_WARP;
    const int warp = threadIdx.x / KILN_WARP;
    const int warps = blockDim.x / KILN_WARP;
    value = kiln_warp_sum(value);
    __syncthreads();
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    float total = lane < warps ? scratch[lane] : 0.0f;
    total = kiln_warp_sum(total);
    __syncthreads();
    return total;
}

__device__ float kiln_block_max(float value, float* scratch) {
    const int lane = threadIdx.x % KILN_WARP;
    const int warp = threadIdx.x / KILN_WARP;
    const int warps = blockDim.x / KILN_WARP;
    value = kiln_warp_max(value);
    __syncthreads();
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    float best = lane < warps ? scratch[lane] : -__int_as_float(0x7f800000);
    best = kiln_warp_max(best);
    __syncthreads();
    return best;
}

// Invalid indices (a token id outside the vocabulary, a cache position past its end): the
// host checks every index input where it enters, so a kernel meets one only if that check was
// bypassed. A kernel that does raises its launch's fault word (each step has its own, zeroed
// at allocation; every writer stores the same 1, so no atomic is needed) and goes on without
// touching memory outside its operands; the executable turns a raised word into an error
// naming the op.
__device__ __forceinline__ void kiln_raise(int* fault) { *fault = 1; }

// The cache row of batch row b: rows[b] of a pool of `slots` rows, or b itself when rows is
// null. KILN_PADDING_SLOT marks a padding row, which reads and writes no cache row;
// KILN_BAD_SLOT is returned when rows[b] lies outside the pool (the caller raises the fault
// word).
#define KILN_PADDING_SLOT (-1)
#define KILN_BAD_SLOT (-2)
__device__ __forceinline__ i64 kiln_slot(const i64* rows, i64 b, i64 slots) {
    if (rows == nullptr) return b;
    const i64 slot = rows[b];
    if (slot == KILN_PADDING_SLOT) return slot;
    return slot < 0 || slot >= slots ? KILN_BAD_SLOT : slot;
}

// Whether an earlier batch row than b takes b's slot (a pool is written by distinct rows;
// padding rows take none).
__device__ __forceinline__ bool kiln_slot_taken(const i64* rows, i64 b) {
    if (rows == nullptr || rows[b] == KILN_PADDING_SLOT) return false;
    for (i64 a = 0; a < b; ++a)
        if (rows[a] == rows[b]) return true;
    return false;
}

// Grid-stride loop over `n` items: the same items go to the same threads on every run.
#define KILN_FOR_EACH(index, n)                                                              \
    for (i64 index = (i64)blockIdx.x * blockDim.x + threadIdx.x; index < (n);              \
         index += (i64)blockDim.x * gridDim.x)
