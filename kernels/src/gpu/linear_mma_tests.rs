//! The tensor-core path checked without a GPU: the builder's own launches, run by the CPU
//! emulation of `linear_mma.cu` and `linear_reduce` (`linear_emulation.rs`), against a plain
//! f64 reference, on shapes that reach every branch: odd m, k a multiple of 8 but not of 16 or
//! shorter than a chunk, n not a multiple of 16, 1 to 3 groups, SwiGLU, bias, split k, several
//! stages. Buffers are exactly as long as the layer needs, so any read or write past them
//! panics; outputs start as a NaN sentinel, which must survive where nothing is to be written.

use half::bf16;
use rand::rngs::StdRng;

use super::emulation::{run_mma, run_reduce, Memory};
use super::*;
use crate::testing;

const SENTINEL: u32 = 0x7fc0_0001;

struct Case {
    m: u64,
    k: u64,
    n: &'static [u64],
    swiglu: bool,
    /// Overrides the plan's stage_k (a multiple of 64) to run several stages per block.
    stage_k: Option<u64>,
}

const fn case(m: u64, k: u64, n: &'static [u64], swiglu: bool) -> Case {
    Case {
        m,
        k,
        n,
        swiglu,
        stage_k: None,
    }
}

fn bf16_bits(rng: &mut StdRng, len: usize) -> Vec<u16> {
    let values = testing::signed(rng, len);
    values
        .iter()
        .map(|&v| bf16::from_f64(v).to_bits())
        .collect()
}

fn bytes_u16(values: &[u16]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn bytes_f32(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn widen(bits: u16) -> f64 {
    f64::from(bf16::from_bits(bits).to_f32())
}

fn f32_at(bytes: &[u8], offset: usize, i: usize) -> f32 {
    let at = offset + 4 * i;
    f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

/// Runs `case` (x f32 when `x_f32`, bias on every other group) and checks every output.
fn run(case: &Case, x_f32: bool, rng: &mut StdRng) {
    let (m, k) = (case.m as usize, case.k as usize);
    let ldx = k + 8 * usize::from(x_f32); // a padded x row when f32
    let groups = case.n.len();
    // Slots: 0 x, 1..=3 w, 4..=6 bias, 7..=9 out, 10 workspace; offsets keep each alignment.
    let x_len = (m - 1) * ldx + k;
    let x_values = testing::to_f32(&testing::signed(rng, x_len));
    let (x_bytes, x_used): (Vec<u8>, Vec<f64>) = match x_f32 {
        true => {
            let rounded = x_values
                .iter()
                .map(|&v| f64::from(bf16::from_f32(v).to_f32()));
            (bytes_f32(&x_values), rounded.collect())
        }
        false => {
            let bits: Vec<u16> = x_values
                .iter()
                .map(|&v| bf16::from_f32(v).to_bits())
                .collect();
            (bytes_u16(&bits), bits.iter().map(|&b| widen(b)).collect())
        }
    };
    let mut slots = vec![Vec::new(); 11];
    let put = |slots: &mut Vec<Vec<u8>>, slot: usize, offset: usize, bytes: Vec<u8>| {
        slots[slot] = [vec![0xee; offset], bytes].concat();
        Addr {
            slot: slot as u32,
            offset: offset as u64,
        }
    };
    let x = put(&mut slots, 0, 48, x_bytes);
    let mut weights = Vec::new();
    let mut biases = Vec::new();
    let mut spec_groups = Vec::new();
    for (g, &n) in case.n.iter().enumerate() {
        let (n, ldo) = (n as usize, n as usize + 3 * g);
        let w = bf16_bits(rng, n * k);
        let bias = (g % 2 == 0).then(|| bf16_bits(rng, n));
        let w_at = put(&mut slots, 1 + g, 16 * (g + 1), bytes_u16(&w));
        let b_at = bias
            .as_ref()
            .map(|b| put(&mut slots, 4 + g, 2 * g + 2, bytes_u16(b)));
        let out = vec![f32::from_bits(SENTINEL); (m - 1) * ldo + n];
        let out_at = put(&mut slots, 7 + g, 4 * g + 4, bytes_f32(&out));
        spec_groups.push(LinearGroup {
            w: w_at,
            bias: b_at,
            out: out_at,
            n: n as u64,
            ldo: ldo as u64,
        });
        weights.push(w);
        biases.push(bias);
    }
    let spec = SkinnyLinear {
        x,
        x_dtype: if x_f32 {
            GemmDType::F32
        } else {
            GemmDType::BF16
        },
        m: case.m,
        k: case.k,
        ldx: ldx as u64,
        groups: spec_groups,
        swiglu: case.swiglu,
    };
    let plan = spec.plan();
    let workspace = put(
        &mut slots,
        10,
        4,
        vec![0xff; spec.workspace_bytes() as usize],
    );
    // Tensor cores never finish in clusters (measured slower).
    let mut launches = kernels(skinny_linear(&spec, Some(workspace), true).unwrap());
    assert_eq!(launches.len(), if plan.splits > 1 { 2 } else { 1 });
    if let Some(stage_k) = case.stage_k {
        assert!(stage_k.is_multiple_of(64) && stage_k < plan.stage_k);
        launches[0].args[25] = Arg::I64(stage_k as i64);
        launches[0].shared_bytes = (plan.rows * (stage_k + 32) * 2) as u32;
    }
    let mut memory = Memory(slots);
    run_mma(&launches[0], &mut memory);
    if let Some(reduce) = launches.get(1) {
        run_reduce(reduce, &mut memory);
    }

    let at = format!(
        "m {m} k {k} n {:?} swiglu {} x_f32 {x_f32} stage {:?}: {plan:?}",
        case.n, case.swiglu, case.stage_k
    );
    // y_g[r, j] in f64 and the scale of its rounding: sum over k of |x w|, plus |bias|.
    let dot = |g: usize, r: usize, j: usize| -> (f64, f64) {
        let w = &weights[g][j * k..(j + 1) * k];
        let x = &x_used[r * ldx..r * ldx + k];
        let bias = biases[g].as_ref().map_or(0.0, |b| widen(b[j]));
        let sum: f64 = x.iter().zip(w).map(|(&a, &b)| a * widen(b)).sum();
        let scale: f64 = x.iter().zip(w).map(|(&a, &b)| (a * widen(b)).abs()).sum();
        (sum + bias, 2e-5 * (scale + bias.abs()) + 1e-7)
    };
    let outputs = if case.swiglu { 1 } else { groups };
    for (g, group) in spec.groups.iter().enumerate() {
        let (n, ldo) = (group.n as usize, group.ldo as usize);
        let offset = group.out.offset as usize;
        let bytes = &memory.0[group.out.slot as usize];
        for i in 0..(m - 1) * ldo + n {
            let (r, j) = (i / ldo, i % ldo);
            let got = f32_at(bytes, offset, i);
            if g >= outputs || j >= n {
                assert_eq!(
                    got.to_bits(),
                    SENTINEL,
                    "{at}: group {g} [{r}, {j}] is written"
                );
                continue;
            }
            let (want, tolerance) = match case.swiglu {
                false => dot(g, r, j),
                true => {
                    let ((gate, tg), (up, tu)) = (dot(0, r, j), dot(1, r, j));
                    let sigmoid = 1.0 / (1.0 + (-gate).exp());
                    let silu = gate * sigmoid;
                    (
                        silu * up,
                        1.1 * tg * up.abs() + silu.abs() * tu + tg * tu + 1e-6,
                    )
                }
            };
            let error = (f64::from(got) - want).abs();
            assert!(
                error <= tolerance,
                "{at}: group {g} [{r}, {j}] = {got}, want {want} (error {error:e}, tolerance \
                 {tolerance:e})"
            );
        }
    }
}

fn kernels(launches: Vec<Launch>) -> Vec<Kernel> {
    let kernel = |launch| match launch {
        Launch::Kernel(kernel) => kernel,
        other => panic!("{other:?}"),
    };
    launches.into_iter().map(kernel).collect()
}

#[test]
fn tensor_core_path_matches_the_reference_on_every_branch() {
    let mut rng = testing::rng("tensor_core_path_matches_the_reference_on_every_branch");
    let cases = [
        case(2, 8, &[1], false),               // one vector of k, one column
        case(3, 24, &[15, 17], false),         // k shorter than a chunk
        case(5, 40, &[130], false),            // k = a chunk and a vector
        case(7, 136, &[33, 5, 90], false),     // three groups, k % 16 = 8
        case(8, 896, &[896, 128, 128], false), // q/k/v of Qwen2.5-0.5B, split
        case(9, 1000, &[300], false),          // split, a short last range
        case(13, 264, &[70, 70], true),        // SwiGLU, two splits
        case(16, 896, &[200, 200], true),      // SwiGLU, split
        case(17, 520, &[17, 31], false),       // three tiles of rows
        case(23, 1000, &[9, 9], true),         // SwiGLU, a partial warp
        case(24, 4864, &[40], false),          // down-like: many splits
        case(25, 72, &[250, 6], false),        // four tiles, one split
        case(31, 1024, &[129, 1, 64], false),  // odd widths across groups
        case(32, 896, &[160], false),          // all 32 rows
        case(32, 392, &[48, 48], true),        // SwiGLU at 32 rows
        Case {
            stage_k: Some(64),
            ..case(32, 392, &[24, 8], false) // 7 stages, the last one vector long
        },
        Case {
            stage_k: Some(128),
            ..case(2, 1000, &[40], false) // several stages per split range
        },
        Case {
            stage_k: Some(64),
            ..case(19, 200, &[21, 21], true)
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        run(case, i % 2 == 0, &mut rng);
        run(case, i % 2 == 1, &mut rng);
    }
}

#[test]
fn emulated_cases_cover_splits_and_single_launches() {
    // The cases above reach both epilogues: in-kernel (one split) and through linear_reduce.
    assert_eq!(linear_plan(13, 264, 140).splits, 2);
    assert!(linear_plan(16, 896, 400).splits > 1);
    assert!(linear_plan(24, 4864, 40).splits > 1);
    assert_eq!(linear_plan(32, 392, 96).splits, 1);
    assert_eq!(linear_plan(25, 72, 256).splits, 1);
    assert!(linear_plan(9, 1000, 300).splits > 1);
}
