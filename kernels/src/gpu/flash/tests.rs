//! The builders' choices: which instance runs which head dim, the launches of empty problems,
//! and the refusals.

use super::*;

fn dims(q_len: u64, kv_len: u64, head_dim: u64) -> AttentionDims {
    AttentionDims {
        batch: 2,
        q_heads: 6,
        kv_heads: 2,
        q_len,
        kv_len,
        head_dim,
    }
}

fn addr(slot: u32) -> Addr {
    Addr { slot, offset: 0 }
}

/// The forward's addresses, slots 0..=5 (also the launch-signature test's).
pub(crate) fn forward() -> FlashForward {
    FlashForward {
        q: addr(0),
        k: addr(1),
        v: addr(2),
        out: Forms::f32(addr(3)),
        lse: addr(4),
        workspace: addr(5),
        stored: [DType::F32; 3],
        rounding: DType::BF16,
    }
}

/// The backward's addresses, slots 0..=9 (also the launch-signature test's).
pub(crate) fn backward() -> FlashBackward {
    FlashBackward {
        q: addr(0),
        k: addr(1),
        v: addr(2),
        out: addr(3),
        lse: addr(4),
        grad_out: addr(5),
        grad_q: addr(6),
        grad_k: addr(7),
        grad_v: addr(8),
        workspace: addr(9),
        stored: [DType::F32; 4],
    }
}

fn kernel(launch: &Launch) -> &Kernel {
    match launch {
        Launch::Kernel(kernel) => kernel,
        other => panic!("not a kernel: {other:?}"),
    }
}

fn names(launches: &[Launch]) -> Vec<&str> {
    launches.iter().map(|l| kernel(l).function).collect()
}

#[test]
fn each_head_dim_runs_the_smallest_instance_that_holds_it() {
    let cases = [
        (0, "d16"),
        (1, "d16"),
        (16, "d16"),
        (17, "d32"),
        (64, "d64"),
        (65, "d128"),
        (128, "d128"),
    ];
    for (head_dim, suffix) in cases {
        let launches = flash_attention_f32(forward(), dims(70, 90, head_dim), 0.5).unwrap();
        // q, k, v staged, then the tile kernel.
        assert_eq!(names(&launches)[..3], ["flash_attention_stage"; 3]);
        let main = kernel(&launches[3]);
        assert!(
            main.function.ends_with(suffix),
            "{head_dim}: {}",
            main.function
        );
        // B·Hq blocks across, ceil(70 / 64) query tiles down.
        assert_eq!(main.grid, (12, 2, 1));
    }
}

/// The forward runs in two warp groups (8 warps a block) while its blocks are fewer than the
/// SMs, in one (4 warps) from one wave on; plain and rounding to f16 alike.
#[test]
fn grids_below_one_wave_run_the_forward_in_two_warp_groups() {
    let heads = |batch, q_heads, q_len| AttentionDims {
        batch,
        q_heads,
        kv_heads: 1,
        q_len,
        kv_len: q_len,
        head_dim: 64,
    };
    let cases = [
        (heads(1, 14, 512), true),   // 0.5B prefill, T = 512: 112 blocks
        (heads(1, 14, 2048), false), // T = 2048: 448
        (heads(1, 131, 64), true),
        (heads(1, 132, 64), false),
        (heads(2, 6, 700), false), // 2 · 6 · 11 = 132 blocks: one wave
        (heads(2, 6, 640), true),  // 2 · 6 · 10 = 120
    ];
    for (dims, groups) in cases {
        let blocks = dims.batch * dims.q_heads * dims.q_len.div_ceil(64);
        for rounding in [DType::BF16, DType::F16] {
            let at = FlashForward {
                rounding,
                ..forward()
            };
            let launches = flash_attention_f32(at, dims, 0.5).unwrap();
            let main = kernel(launches.last().unwrap());
            assert_eq!(
                main.function.contains("_groups_"),
                groups,
                "{blocks} blocks"
            );
            assert_eq!(main.block.0, if groups { 256 } else { 128 });
            assert_eq!(main.grid.0 as u64 * main.grid.1 as u64, blocks);
        }
    }
}

#[test]
fn staged_operands_and_scratch_do_not_overlap() {
    let (dims, d) = (dims(70, 130, 40), 64);
    let regions = Regions::new(addr(9), &dims, d, [DType::F32; 3]);
    let starts = [
        regions.q,
        regions.k,
        regions.v,
        regions.grad_out,
        regions.delta,
        regions.partial_k,
        regions.partial_v,
    ];
    let sizes = [
        2 * 6 * 70 * d * 2,
        2 * 2 * 130 * d * 2,
        2 * 2 * 130 * d * 2,
        2 * 6 * 70 * d * 2,
        2 * 6 * 70 * 4,
        2 * 6 * 130 * 40 * 4,
        2 * 6 * 130 * 40 * 4,
    ];
    for i in 1..starts.len() {
        assert!(
            starts[i - 1].offset + sizes[i - 1] <= starts[i].offset,
            "region {i}"
        );
        assert_eq!(starts[i].offset % SLOT_ALIGN, 0);
    }
    assert!(regions.partial_v.offset + sizes[6] <= regions.end);
    assert_eq!(
        backward_workspace_bytes(&dims, [DType::F32; 3]),
        regions.end
    );
    assert_eq!(
        forward_workspace_bytes(&dims, [DType::F32; 3]),
        regions.grad_out.offset
    );
    // Without GQA there are no partials.
    let mha = AttentionDims {
        kv_heads: 6,
        ..dims
    };
    let plain = Regions::new(addr(9), &mha, d, [DType::F32; 3]);
    assert_eq!(plain.end, plain.partial_k.offset);
}

#[test]
fn the_backward_stages_then_runs_delta_key_tiles_reduce_and_query_tiles() {
    let launches = flash_attention_backward_f32(backward(), dims(70, 130, 64), 0.5).unwrap();
    assert_eq!(
        names(&launches),
        [
            "flash_attention_stage",
            "flash_attention_stage",
            "flash_attention_stage",
            "flash_attention_stage",
            "flash_attention_backward_delta",
            "flash_attention_backward_kv_d64",
            "flash_attention_backward_reduce",
            "flash_attention_backward_q_d64"
        ]
    );
    // Δ: a warp per row, 8 rows a block; dK/dV: B·Hq × ceil(130 / 64); dQ: B·Hq × ceil(70 / 64).
    assert_eq!(
        kernel(&launches[4]).grid,
        ((2 * 6 * 70u32).div_ceil(8), 1, 1)
    );
    assert_eq!(kernel(&launches[5]).grid, (12, 3, 1));
    assert_eq!(kernel(&launches[7]).grid, (12, 2, 1));
    // Without GQA the key tiles write the gradients themselves.
    let mha = AttentionDims {
        kv_heads: 6,
        ..dims(70, 130, 64)
    };
    let launches = flash_attention_backward_f32(backward(), mha, 0.5).unwrap();
    assert!(!names(&launches).contains(&"flash_attention_backward_reduce"));
}

#[test]
fn empty_problems_launch_only_what_writes_something() {
    assert!(flash_attention_f32(forward(), dims(0, 5, 8), 0.5)
        .unwrap()
        .is_empty());
    // No query row, but keys: their gradients are still written (as zeros).
    let launches = flash_attention_backward_f32(backward(), dims(0, 5, 8), 0.5).unwrap();
    assert_eq!(
        names(&launches),
        [
            "flash_attention_stage",
            "flash_attention_stage",
            "flash_attention_backward_kv_d16",
            "flash_attention_backward_reduce"
        ]
    );
    assert!(flash_attention_backward_f32(backward(), dims(0, 0, 8), 0.5)
        .unwrap()
        .is_empty());
}

#[test]
fn wide_heads_and_bad_groupings_are_refused() {
    let error = flash_attention_f32(forward(), dims(4, 4, 129), 0.5).unwrap_err();
    assert!(error.to_string().contains("up to 128"), "{error}");
    let mut four = dims(4, 4, 64);
    four.kv_heads = 4; // does not divide 6 query heads
    assert!(flash_attention_f32(forward(), four, 0.5).is_err());
    assert!(flash_attention_backward_f32(backward(), dims(5, 4, 64), 0.5).is_err());
    // The backward rounds to bf16: an f16 operand is not its rounding.
    let f16_grad = FlashBackward {
        stored: [DType::F32, DType::F32, DType::F32, DType::F16],
        ..backward()
    };
    let error = flash_attention_backward_f32(f16_grad, dims(4, 4, 64), 0.5).unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("grad_out is f16 under the bf16 rounding"),
        "{text}"
    );
}

/// `at`'s forward over rows of the kernels' head dim 64 is the one launch of `instance`, reading
/// q, k and v where they are: no stage, no workspace.
fn reads_in_place(at: FlashForward, instance: &str) {
    let launches = flash_attention_f32(at, dims(70, 90, 64), 0.5).unwrap();
    assert_eq!(names(&launches), [instance]);
    let args = &kernel(&launches[0]).args;
    assert!(matches!(args[3..6], [Arg::Ptr(q), Arg::Ptr(k), Arg::Ptr(v)]
        if [q, k, v] == [addr(0), addr(1), addr(2)]));
    assert_eq!(forward_workspace_bytes(&dims(70, 90, 64), at.stored), 0);
}

/// A bf16 q, k or v of a padded head dim is read where it is (no stage, no workspace); one of
/// another head dim is staged from bf16; grad_out is always staged, from its own storage.
#[test]
fn bf16_rows_of_the_kernels_head_dim_are_read_where_they_are() {
    let bf16 = FlashForward {
        stored: [DType::BF16; 3],
        ..forward()
    };
    reads_in_place(bf16, "flash_attention_forward_groups_d64");
    // Only k in bf16: q and v staged from f32.
    let mixed = FlashForward {
        stored: [DType::F32, DType::BF16, DType::F32],
        ..forward()
    };
    let launches = flash_attention_f32(mixed, dims(70, 90, 64), 0.5).unwrap();
    assert_eq!(
        names(&launches),
        [
            "flash_attention_stage",
            "flash_attention_stage",
            "flash_attention_forward_groups_d64"
        ]
    );
    // Head dim 40 pads to 64: bf16 rows are staged too.
    let launches = flash_attention_f32(bf16, dims(70, 90, 40), 0.5).unwrap();
    assert_eq!(names(&launches)[..3], ["flash_attention_stage_bf16"; 3]);
    // The backward: grad_out staged (re-laid) from bf16, Δ from bf16.
    let backward = FlashBackward {
        stored: [DType::BF16; 4],
        ..backward()
    };
    let launches = flash_attention_backward_f32(backward, dims(70, 130, 64), 0.5).unwrap();
    assert_eq!(
        names(&launches),
        [
            "flash_attention_stage_bf16",
            "flash_attention_backward_delta_bf16",
            "flash_attention_backward_kv_d64",
            "flash_attention_backward_reduce",
            "flash_attention_backward_q_d64"
        ]
    );
    let all = backward_workspace_bytes(&dims(70, 130, 64), [DType::F32; 3]);
    let none = backward_workspace_bytes(&dims(70, 130, 64), [DType::BF16; 3]);
    let (q, kv) = (2 * 6 * 70 * 64 * 2, 2 * 2 * 130 * 64 * 2);
    assert_eq!(all - none, q + 2 * kv);
}

#[test]
fn a_bf16_operand_read_where_it_is_must_be_aligned_for_the_tile_copies() {
    let unaligned = FlashForward {
        k: Addr { slot: 1, offset: 8 },
        stored: [DType::BF16; 3],
        ..forward()
    };
    let error = flash_attention_f32(unaligned, dims(70, 90, 64), 0.5).unwrap_err();
    assert!(error.to_string().contains("16-byte aligned"), "{error}");
}

/// The f16 forward stages each f32 operand as f16 rows (the bf16 stage's bytes), reads f16
/// rows of its head dim where they are (and copies those of another through the bf16 stage,
/// which gives back every 16-bit pattern but some NaN payloads), and runs the f16 instance; a
/// bf16 operand with the f16 rounding, an f16 one with the bf16 rounding, or a rounding other
/// than bf16 and f16, is refused.
#[test]
fn the_f16_forward_stages_its_f32_operands_as_f16_rows() {
    let f16 = FlashForward {
        rounding: DType::F16,
        ..forward()
    };
    for (head_dim, instance) in [
        (40, "flash_attention_forward_f16_groups_d64"),
        (128, "flash_attention_forward_f16_groups_d128"),
    ] {
        let launches = flash_attention_f32(f16, dims(70, 90, head_dim), 0.5).unwrap();
        let mut want = vec!["flash_attention_stage_f16"; 3];
        want.push(instance);
        assert_eq!(names(&launches), want);
    }
    let rows = FlashForward {
        stored: [DType::F16; 3],
        ..f16
    };
    reads_in_place(rows, "flash_attention_forward_f16_groups_d64");
    let launches = flash_attention_f32(rows, dims(70, 90, 40), 0.5).unwrap();
    assert_eq!(names(&launches)[..3], ["flash_attention_stage_bf16"; 3]);
    for stored in [
        [DType::F32, DType::BF16, DType::F32],
        [DType::F16, DType::F32, DType::F32],
    ] {
        let rounding = if stored[0] == DType::F16 {
            DType::BF16
        } else {
            DType::F16
        };
        let mismatched = FlashForward {
            stored,
            rounding,
            ..forward()
        };
        let error = flash_attention_f32(mismatched, dims(70, 90, 64), 0.5).unwrap_err();
        assert!(
            error.to_string().contains("of the rounding's dtype"),
            "{error}"
        );
    }
    let f32_rounding = FlashForward {
        rounding: DType::F32,
        ..forward()
    };
    assert!(flash_attention_f32(f32_rounding, dims(70, 90, 64), 0.5).is_err());
}
