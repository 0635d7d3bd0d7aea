//! A CPU emulation of `gemm.cu`, run from the builder's own [`Kernel`] launches over a
//! byte-addressed memory of slots: every block and thread with the kernel's index math (the
//! staging of each k chunk, the micro-tiles, the masked edges) and its fused multiply-adds, in
//! the kernel's order. Out-of-bounds, negative and misaligned accesses panic; the shared tiles
//! hold NaN before each stage, so an entry a stage misses turns the sums that read it NaN.

use half::bf16;

use super::{Addr, Arg, GemmDType, Kernel};

const TILE: i64 = 64; // KILN_GEMM_TILE
const CHUNK: usize = 16; // KILN_GEMM_CHUNK
const THREADS: usize = 256; // KILN_GEMM_THREADS
const SIDE: usize = 16; // KILN_GEMM_SIDE
const MICRO: usize = 4; // KILN_GEMM_MICRO
const PITCH: usize = TILE as usize + 1; // KILN_GEMM_PITCH

/// Device memory: one byte vector per slot.
pub(super) struct Memory(pub Vec<Vec<u8>>);

impl Memory {
    /// The bytes of element `index` of the `dtype` array at `at`.
    fn element(&self, at: Addr, index: i64, dtype: GemmDType) -> (usize, std::ops::Range<usize>) {
        let size = dtype.size_bytes();
        assert!(index >= 0, "negative index {index} from {at:?}");
        assert_eq!(
            at.offset % size,
            0,
            "misaligned {size}-byte array at {at:?}"
        );
        let start = (at.offset + size * index as u64) as usize;
        (at.slot as usize, start..start + size as usize)
    }

    pub(super) fn load(&self, at: Addr, index: i64, dtype: GemmDType) -> f32 {
        let bits = self.bits(at, index, dtype);
        match dtype {
            GemmDType::F32 => f32::from_bits(bits),
            GemmDType::BF16 => bf16::from_bits(bits as u16).to_f32(),
        }
    }

    /// The raw bits of the element.
    pub(super) fn bits(&self, at: Addr, index: i64, dtype: GemmDType) -> u32 {
        let (slot, bytes) = self.element(at, index, dtype);
        let bytes = &self.0[slot][bytes];
        match dtype {
            GemmDType::F32 => u32::from_le_bytes(bytes.try_into().unwrap()),
            GemmDType::BF16 => u32::from(u16::from_le_bytes(bytes.try_into().unwrap())),
        }
    }

    /// Stores `value`, rounded to nearest even for bf16 (`kiln_f32_to_bf16`, as `half` does).
    pub(super) fn store(&mut self, at: Addr, index: i64, dtype: GemmDType, value: f32) {
        let (slot, bytes) = self.element(at, index, dtype);
        let target = &mut self.0[slot][bytes];
        match dtype {
            GemmDType::F32 => target.copy_from_slice(&value.to_le_bytes()),
            GemmDType::BF16 => {
                target.copy_from_slice(&bf16::from_f32(value).to_bits().to_le_bytes())
            }
        }
    }
}

/// The arguments of an instance of `kiln_gemm`, as its signature names them.
struct Args {
    c: Addr,
    a: Addr,
    b: Addr,
    m: i64,
    n: i64,
    k: i64,
    lda: i64,
    ldb: i64,
    ldc: i64,
    stride_a: i64,
    stride_b: i64,
    stride_c: i64,
    transpose_a: bool,
    transpose_b: bool,
    accumulate: bool,
}

impl Args {
    fn of(args: &[Arg]) -> Args {
        assert_eq!(args.len(), 15);
        let ptr = |i: usize| match args[i] {
            Arg::Ptr(at) => at,
            ref other => panic!("argument {i}: expected a pointer, got {other:?}"),
        };
        let int = |i: usize| match args[i] {
            Arg::I64(value) => value,
            ref other => panic!("argument {i}: expected an i64, got {other:?}"),
        };
        let flag = |i: usize| match args[i] {
            Arg::I32(value) => value != 0,
            ref other => panic!("argument {i}: expected an int, got {other:?}"),
        };
        Args {
            c: ptr(0),
            a: ptr(1),
            b: ptr(2),
            m: int(3),
            n: int(4),
            k: int(5),
            lda: int(6),
            ldb: int(7),
            ldc: int(8),
            stride_a: int(9),
            stride_b: int(10),
            stride_c: int(11),
            transpose_a: flag(12),
            transpose_b: flag(13),
            accumulate: flag(14),
        }
    }
}

/// One operand as `kiln_gemm_stage` reads it: the batch's array (`at` plus `base` elements)
/// of `dtype`, op(X)[o, p] at `o * ld + p` when `k_contiguous`, else at `p * ld + o`; `outers`
/// rows of op(X) (m for A, n for B).
struct Staged {
    at: Addr,
    base: i64,
    dtype: GemmDType,
    ld: i64,
    k_contiguous: bool,
    outers: i64,
}

type Tile = [[f32; PITCH]; CHUNK];

/// `kiln_gemm_stage`: every thread's elements e = t, t + 256, ... of the 64 x 16 tile.
fn stage(tile: &mut Tile, memory: &Memory, x: &Staged, outer0: i64, k0: i64, k: i64) {
    *tile = [[f32::NAN; PITCH]; CHUNK];
    for thread in 0..THREADS {
        for e in (thread..TILE as usize * CHUNK).step_by(THREADS) {
            let (o, kk) = match x.k_contiguous {
                true => (e / CHUNK, e % CHUNK),
                false => (e % TILE as usize, e / TILE as usize),
            };
            let (outer, p) = (outer0 + o as i64, k0 + kk as i64);
            let mut value = 0.0;
            if outer < x.outers && p < k {
                let index = match x.k_contiguous {
                    true => outer * x.ld + p,
                    false => p * x.ld + outer,
                };
                value = memory.load(x.at, x.base + index, x.dtype);
            }
            tile[kk][o] = value;
        }
    }
}

/// Runs a launch of `gemm_f32`, `gemm_bf16` or `gemm_bf16_to_bf16`.
pub(super) fn run(kernel: &Kernel, memory: &mut Memory) {
    let (input, output) = match kernel.function {
        "gemm_f32" => (GemmDType::F32, GemmDType::F32),
        "gemm_bf16" => (GemmDType::BF16, GemmDType::F32),
        "gemm_bf16_to_bf16" => (GemmDType::BF16, GemmDType::BF16),
        other => panic!("not a kernel of gemm.cu: {other}"),
    };
    assert_eq!(kernel.module, "gemm");
    assert_eq!(kernel.block, (THREADS as u32, 1, 1));
    assert_eq!((kernel.shared_bytes, kernel.cluster), (0, (1, 1, 1)));
    let g = Args::of(&kernel.args);
    for z in 0..i64::from(kernel.grid.2) {
        for y in 0..i64::from(kernel.grid.1) {
            for x in 0..i64::from(kernel.grid.0) {
                block(&g, (x, y, z), (input, output), memory);
            }
        }
    }
}

/// One block of `kiln_gemm`: blockIdx = (x, y, z).
fn block(
    g: &Args,
    (x, y, z): (i64, i64, i64),
    (input, output): (GemmDType, GemmDType),
    memory: &mut Memory,
) {
    let a = Staged {
        at: g.a,
        base: z * g.stride_a,
        dtype: input,
        ld: g.lda,
        k_contiguous: !g.transpose_a,
        outers: g.m,
    };
    let b = Staged {
        at: g.b,
        base: z * g.stride_b,
        dtype: input,
        ld: g.ldb,
        k_contiguous: g.transpose_b,
        outers: g.n,
    };
    let (row0, col0) = (y * TILE, x * TILE);
    let mut sums = [[[0f32; MICRO]; MICRO]; THREADS];
    let (mut a_tile, mut b_tile) = ([[0f32; PITCH]; CHUNK], [[0f32; PITCH]; CHUNK]);
    for k0 in (0..g.k).step_by(CHUNK) {
        stage(&mut a_tile, memory, &a, row0, k0, g.k);
        stage(&mut b_tile, memory, &b, col0, k0, g.k);
        for (thread, sum) in sums.iter_mut().enumerate() {
            let (tx, ty) = (thread % SIDE, thread / SIDE);
            for kk in 0..CHUNK {
                let a_values: [f32; MICRO] = std::array::from_fn(|i| a_tile[kk][ty + SIDE * i]);
                let b_values: [f32; MICRO] = std::array::from_fn(|j| b_tile[kk][tx + SIDE * j]);
                for (i, row) in sum.iter_mut().enumerate() {
                    for (j, value) in row.iter_mut().enumerate() {
                        *value = a_values[i].mul_add(b_values[j], *value);
                    }
                }
            }
        }
    }
    let c_base = z * g.stride_c;
    for (thread, sum) in sums.iter().enumerate() {
        let (tx, ty) = ((thread % SIDE) as i64, (thread / SIDE) as i64);
        for (i, row_sums) in sum.iter().enumerate() {
            let row = row0 + ty + (SIDE * i) as i64;
            if row >= g.m {
                continue;
            }
            for (j, &value) in row_sums.iter().enumerate() {
                let col = col0 + tx + (SIDE * j) as i64;
                if col >= g.n {
                    continue;
                }
                let at = c_base + row * g.ldc + col;
                let mut value = value;
                if g.accumulate {
                    value += memory.load(g.c, at, output);
                }
                memory.store(g.c, at, output, value);
            }
        }
    }
}
