//! A CPU emulation of the tensor-core kernels of `linear_mma.cu` and of `linear_reduce`, run
//! from the builder's own [`Kernel`] launches over a byte-addressed memory of slots: every
//! block, warp and lane with the kernel's index math, and `mma.sync.m16n8k16` by the PTX ISA's
//! fragment layouts. Out-of-bounds and misaligned accesses panic; shared memory starts as
//! 0xff bytes (a bf16 NaN), so a read of x the block never staged turns its outputs NaN.

use half::bf16;

use super::{Addr, Arg, Kernel};

const WARP: usize = 32;
const WARPS: usize = 8; // KILN_MMA_WARPS
const COLUMNS: i64 = 16; // KILN_MMA_COLUMNS
const CHUNK: i64 = 32; // KILN_MMA_CHUNK
const UNROLL: usize = 4; // KILN_MMA_UNROLL
const PAD: i64 = 32; // KILN_MMA_PAD

/// Device memory: one byte vector per slot.
pub(super) struct Memory(pub Vec<Vec<u8>>);

type Vec4 = [u32; 4];

impl Memory {
    fn bytes(&self, at: Addr, len: usize, align: u64) -> &[u8] {
        assert_eq!(
            at.offset % align,
            0,
            "misaligned {len}-byte access at {at:?}"
        );
        let start = at.offset as usize;
        &self.0[at.slot as usize][start..start + len]
    }
    fn u16(&self, at: Addr) -> u16 {
        u16::from_le_bytes(self.bytes(at, 2, 2).try_into().unwrap())
    }
    fn f32(&self, at: Addr) -> f32 {
        f32::from_le_bytes(self.bytes(at, 4, 4).try_into().unwrap())
    }
    fn vec4(&self, at: Addr) -> Vec4 {
        let b = self.bytes(at, 16, 16);
        std::array::from_fn(|i| u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap()))
    }
    fn store_f32(&mut self, at: Addr, value: f32) {
        assert_eq!(at.offset % 4, 0, "misaligned f32 store at {at:?}");
        let start = at.offset as usize;
        self.0[at.slot as usize][start..start + 4].copy_from_slice(&value.to_le_bytes());
    }
}

/// `at` plus `bytes` (which may be computed from signed index math; never negative here).
fn plus(at: Addr, bytes: i64) -> Addr {
    Addr {
        slot: at.slot,
        offset: u64::try_from(at.offset as i64 + bytes).expect("a negative address"),
    }
}

fn ptr(arg: &Arg) -> Addr {
    match arg {
        Arg::Ptr(at) => *at,
        other => panic!("expected a pointer, got {other:?}"),
    }
}

fn int(arg: &Arg) -> i64 {
    match arg {
        Arg::I64(v) => *v,
        Arg::I32(v) => i64::from(*v),
        other => panic!("expected an integer, got {other:?}"),
    }
}

fn bf16_of(bits: u32) -> f32 {
    bf16::from_bits(bits as u16).to_f32()
}

/// `kiln_f32_to_bf16` (round to nearest even, NaN quieted), as `half` does it.
fn round(value: f32) -> u32 {
    u32::from(bf16::from_f32(value).to_bits())
}

/// One `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` of a warp, with the PTX ISA's
/// layouts (groupID = lane / 4, threadID_in_group = lane % 4; element 2i in the low half of
/// word i): a_i at row groupID (i < 2 or 4 <= i < 6) else groupID + 8, col 2·tig + (i & 1)
/// (+ 8 for i >= 4); b_i at row 2·tig + (i & 1) (+ 8 for i >= 2), col groupID; c_i at row
/// groupID (+ 8 for i >= 2), col 2·tig + (i & 1). D = A·B + C in f32.
fn mma(a: &[Vec4; WARP], b: &[[u32; 2]; WARP], c: &mut [[f32; 4]; WARP]) {
    let (mut am, mut bm) = ([[f32::NAN; 16]; 16], [[f32::NAN; 8]; 16]);
    let (mut a_seen, mut b_seen) = ([[0; 16]; 16], [[0; 8]; 16]);
    let element = |word: u32, i: usize| bf16_of(word >> (16 * (i & 1)));
    for lane in 0..WARP {
        let (group, tig) = (lane / 4, lane % 4);
        for i in 0..8 {
            let row = if i < 2 || (4..6).contains(&i) {
                group
            } else {
                group + 8
            };
            let col = 2 * tig + (i & 1) + if i >= 4 { 8 } else { 0 };
            am[row][col] = element(a[lane][i / 2], i);
            a_seen[row][col] += 1;
        }
        for i in 0..4 {
            let row = 2 * tig + (i & 1) + if i >= 2 { 8 } else { 0 };
            bm[row][group] = element(b[lane][i / 2], i);
            b_seen[row][group] += 1;
        }
    }
    assert!(
        a_seen.iter().flatten().all(|&n| n == 1),
        "A: each element once"
    );
    assert!(
        b_seen.iter().flatten().all(|&n| n == 1),
        "B: each element once"
    );
    for (lane, c) in c.iter_mut().enumerate() {
        let (group, tig) = (lane / 4, lane % 4);
        for (i, value) in c.iter_mut().enumerate() {
            let row = group + if i >= 2 { 8 } else { 0 };
            let col = 2 * tig + (i & 1);
            *value = (0..16).fold(*value, |sum, kk| sum + am[row][kk] * bm[kk][col]);
        }
    }
}

/// Asserts that 16-byte shared-memory reads at these byte addresses (one per lane) take one
/// wavefront per quarter-warp: the 8 lanes of each touch 32 distinct banks.
fn assert_conflict_free(addresses: &[i64; WARP]) {
    for quarter in addresses.chunks(8) {
        let mut banks: Vec<i64> = (quarter.iter())
            .flat_map(|&at| (0..4).map(move |w| (at / 4 + w) % 32))
            .collect();
        banks.sort_unstable();
        banks.dedup();
        assert_eq!(banks.len(), 32, "bank conflict among {quarter:?}");
    }
}

/// What one lane keeps in registers across the k loop.
#[derive(Clone, Copy, Default)]
struct Lane {
    group: [usize; 2],
    j: [i64; 2],
    valid: [bool; 2],
    row: [Option<Addr>; 2],
    w: [[Vec4; UNROLL]; 2],
}

/// The kernel's outputs and biases, as `KilnLinearOut`.
struct Out {
    y: [Addr; 3],
    b: [Addr; 3],
    has_b: [bool; 3],
    ldo: [i64; 3],
}

impl Out {
    fn of(args: &[Arg], b: usize) -> Out {
        Out {
            y: std::array::from_fn(|g| ptr(&args[g])),
            b: std::array::from_fn(|g| ptr(&args[b + g])),
            has_b: std::array::from_fn(|g| int(&args[b + 3 + g]) != 0),
            ldo: std::array::from_fn(|g| int(&args[b + 9 + g])),
        }
    }
    fn biased(&self, mem: &Memory, g: usize, j: i64, value: f32) -> f32 {
        match self.has_b[g] {
            true => value + bf16_of(u32::from(mem.u16(plus(self.b[g], 2 * j)))),
            false => value,
        }
    }
    fn write(&self, mem: &mut Memory, g: usize, r: i64, j: i64, value: f32) {
        let value = self.biased(mem, g, j, value);
        mem.store_f32(plus(self.y[g], 4 * (r * self.ldo[g] + j)), value);
    }
    fn write_swiglu(&self, mem: &mut Memory, r: i64, j: i64, gate: f32, up: f32) {
        let a = self.biased(mem, 0, j, gate);
        let up = self.biased(mem, 1, j, up);
        let value = a / (1.0 + (-a).exp()) * up;
        mem.store_f32(plus(self.y[0], 4 * (r * self.ldo[0] + j)), value);
    }
}

/// Where virtual column v lands without SwiGLU (`kiln_linear_locate`).
fn locate(v: i64, n: [i64; 3]) -> (usize, i64) {
    match v {
        v if v < n[0] => (0, v),
        v if v < n[0] + n[1] => (1, v - n[0]),
        v => (2, v - n[0] - n[1]),
    }
}

/// Runs a launch of `linear_mma_r{8,16,24,32}` (`grid` and `shared_bytes` as the launch says).
pub(super) fn run_mma(kernel: &Kernel, mem: &mut Memory) {
    let tiles = match kernel.function {
        "linear_mma_r8" => 1,
        "linear_mma_r16" => 2,
        "linear_mma_r24" => 3,
        "linear_mma_r32" => 4,
        other => panic!("not a tensor-core kernel: {other}"),
    };
    assert_eq!(kernel.block, (256, 1, 1));
    let a = &kernel.args;
    assert_eq!(a.len(), 27);
    let out = Out::of(a, 7);
    let partial = ptr(&a[3]);
    let w: [Addr; 3] = std::array::from_fn(|g| ptr(&a[4 + g]));
    let n: [i64; 3] = std::array::from_fn(|g| int(&a[13 + g]));
    let (x, x_f32, m, k, ldx) = (
        ptr(&a[19]),
        int(&a[20]) != 0,
        int(&a[21]),
        int(&a[22]),
        int(&a[23]),
    );
    let (split_k, stage_k, swiglu) = (int(&a[24]), int(&a[25]), int(&a[26]) != 0);
    let stride = stage_k + PAD;
    let n_virtual = if swiglu { 2 * n[0] } else { n.iter().sum() };
    let rows = 8 * tiles as i64;
    for by in 0..i64::from(kernel.grid.1) {
        for bx in 0..i64::from(kernel.grid.0) {
            let mut smem = Memory(vec![vec![0xff; kernel.shared_bytes as usize]]);
            let xs = Addr { slot: 0, offset: 0 };
            let mut lanes = [[Lane::default(); WARP]; WARPS];
            let mut acc = vec![[[0f32; 4]; WARP]; WARPS * tiles];
            for (wi, warp_lanes) in lanes.iter_mut().enumerate() {
                let warp = bx * WARPS as i64 + wi as i64;
                for (lane, l) in warp_lanes.iter_mut().enumerate() {
                    let g = (lane / 4) as i64;
                    let v_a = warp * COLUMNS + g;
                    for h in 0..2 {
                        if swiglu {
                            (l.group[h], l.j[h]) = (h, warp * (COLUMNS / 2) + g);
                            l.valid[h] = l.j[h] < n[0];
                        } else {
                            (l.group[h], l.j[h]) = locate(v_a + 8 * h as i64, n);
                            l.valid[h] = v_a + 8 * (h as i64) < n_virtual;
                        }
                        let j = if l.valid[h] { l.j[h] } else { 0 };
                        l.row[h] = Some(plus(w[l.group[h]], 2 * j * k));
                    }
                }
            }
            let load = |lanes: &mut [[Lane; WARP]; WARPS], mem: &Memory, first: i64, left: i64| {
                for (lane, l) in lanes.iter_mut().flat_map(|w| w.iter_mut().enumerate()) {
                    let t = (lane % 4) as i64;
                    for u in 0..UNROLL {
                        let v = 4 * u as i64 + t;
                        for h in 0..2 {
                            l.w[h][u] = [0; 4];
                            if l.valid[h] && v < left {
                                l.w[h][u] = mem.vec4(plus(l.row[h].unwrap(), 16 * (first + v)));
                            }
                        }
                    }
                }
            };
            let k_begin = by * split_k;
            let k_end = (k_begin + split_k).min(k);
            let mut k0 = k_begin;
            while k0 < k_end {
                let len = (k_end - k0).min(stage_k);
                let (vecs, first) = (len / 8, k0 / 8);
                load(&mut lanes, mem, first, vecs);
                for i in 0..rows * vecs {
                    let (r, v) = (i / vecs, i % vecs);
                    let mut q = [0u32; 4];
                    if r < m && x_f32 {
                        let at = plus(x, 4 * (r * ldx + k0) + 32 * v);
                        let e: Vec<f32> = (0..8).map(|e| mem.f32(plus(at, 4 * e))).collect();
                        q = std::array::from_fn(|p| round(e[2 * p]) | (round(e[2 * p + 1]) << 16));
                    } else if r < m {
                        q = mem.vec4(plus(x, 2 * (r * ldx + k0) + 16 * v));
                    }
                    let at = plus(xs, 2 * (r * stride + v * 8));
                    let bytes: Vec<u8> = q.iter().flat_map(|w| w.to_le_bytes()).collect();
                    let start = at.offset as usize;
                    assert_eq!(start % 16, 0);
                    smem.0[0][start..start + 16].copy_from_slice(&bytes);
                }
                let mut base = 0;
                while base < len {
                    if base > 0 {
                        load(&mut lanes, mem, first + base / 8, vecs - base / 8);
                    }
                    for (wi, warp_lanes) in lanes.iter().enumerate() {
                        for u in 0..UNROLL {
                            let kb = base + CHUNK * u as i64;
                            if kb >= len {
                                break;
                            }
                            for tile in 0..tiles {
                                let mut xv = [[0u32; 4]; WARP];
                                let mut addresses = [0i64; WARP];
                                for (lane, xv) in xv.iter_mut().enumerate() {
                                    let (g, t) = ((lane / 4) as i64, (lane % 4) as i64);
                                    let at = 2 * ((8 * tile as i64 + g) * stride + kb + 8 * t);
                                    addresses[lane] = at;
                                    if kb + 8 * t < len {
                                        *xv = smem.vec4(plus(xs, at));
                                    }
                                }
                                if kb + CHUNK <= len {
                                    assert_conflict_free(&addresses);
                                }
                                let c = &mut acc[wi * tiles + tile];
                                for half in 0..2 {
                                    let (p, q) = (2 * half, 2 * half + 1);
                                    let frag = |h: usize, lane: usize| warp_lanes[lane].w[h][u];
                                    let a_regs: [Vec4; WARP] = std::array::from_fn(|lane| {
                                        let (wa, wb) = (frag(0, lane), frag(1, lane));
                                        [wa[p], wb[p], wa[q], wb[q]]
                                    });
                                    let b_regs =
                                        std::array::from_fn(|lane| [xv[lane][p], xv[lane][q]]);
                                    mma(&a_regs, &b_regs, c);
                                }
                            }
                        }
                    }
                    base += CHUNK * UNROLL as i64;
                }
                k0 += stage_k;
            }
            let split = kernel.grid.1 > 1;
            for (wi, warp_lanes) in lanes.iter().enumerate() {
                let warp = bx * WARPS as i64 + wi as i64;
                for (lane, l) in warp_lanes.iter().enumerate() {
                    let (g, t) = ((lane / 4) as i64, (lane % 4) as i64);
                    let v_a = warp * COLUMNS + g;
                    for tile in 0..tiles {
                        let c = acc[wi * tiles + tile][lane];
                        for i in 0..4 {
                            let r = 8 * tile as i64 + 2 * t + (i as i64 & 1);
                            let upper = usize::from(i >= 2);
                            if r >= m || !l.valid[upper] {
                                continue;
                            }
                            let row = plus(partial, 4 * ((by * m + r) * n_virtual));
                            if swiglu {
                                if upper == 1 {
                                    continue;
                                }
                                if split {
                                    mem.store_f32(plus(row, 4 * l.j[0]), c[i]);
                                    mem.store_f32(plus(row, 4 * (n[0] + l.j[0])), c[i + 2]);
                                } else {
                                    out.write_swiglu(mem, r, l.j[0], c[i], c[i + 2]);
                                }
                            } else if split {
                                mem.store_f32(plus(row, 4 * (v_a + 8 * upper as i64)), c[i]);
                            } else {
                                out.write(mem, l.group[upper], r, l.j[upper], c[i]);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Runs a launch of `linear_reduce`: every output element by its grid-stride thread's math.
pub(super) fn run_reduce(kernel: &Kernel, mem: &mut Memory) {
    assert_eq!(kernel.function, "linear_reduce");
    let a = &kernel.args;
    assert_eq!(a.len(), 19);
    let out = Out::of(a, 4);
    let partial = ptr(&a[3]);
    let n: [i64; 3] = std::array::from_fn(|g| int(&a[10 + g]));
    let (m, splits, swiglu) = (int(&a[16]), int(&a[17]), int(&a[18]) != 0);
    let n_virtual = if swiglu { 2 * n[0] } else { n.iter().sum() };
    let n_out = if swiglu { n[0] } else { n_virtual };
    let threads = i64::from(kernel.grid.0) * i64::from(kernel.block.0);
    assert!(threads >= 1);
    for i in 0..m * n_out {
        let (r, v) = (i / n_out, i % n_out);
        let at =
            |s: i64, column: i64| plus(partial, 4 * (s * m * n_virtual + r * n_virtual + column));
        let sum = (1..splits).fold(mem.f32(at(0, v)), |sum, s| sum + mem.f32(at(s, v)));
        if swiglu {
            let up = (1..splits).fold(mem.f32(at(0, n[0] + v)), |u, s| {
                u + mem.f32(at(s, n[0] + v))
            });
            out.write_swiglu(mem, r, v, sum, up);
        } else {
            let (g, j) = locate(v, n);
            out.write(mem, g, r, j, sum);
        }
    }
}
