//! The skinny linear builder: what it refuses (naming the argument), its split rule, and that
//! its launches name kernels of `linear.cu` and `linear_mma.cu` with as many arguments as their
//! signatures.

use super::*;
use crate::gpu::SOURCES;

fn addr(slot: u32) -> Addr {
    Addr { slot, offset: 0 }
}

fn group(slot: u32, n: u64) -> LinearGroup {
    LinearGroup {
        w: addr(slot),
        bias: Some(addr(slot + 1)),
        out: addr(slot + 2),
        n,
        ldo: n,
    }
}

/// `x [m, k]` bf16 against groups of `columns[g]` columns.
fn layer(m: u64, k: u64, columns: &[u64]) -> SkinnyLinear {
    SkinnyLinear {
        x: addr(0),
        x_dtype: GemmDType::BF16,
        m,
        k,
        ldx: k,
        groups: (0..columns.len())
            .map(|g| group(1 + 3 * g as u32, columns[g]))
            .collect(),
        swiglu: false,
    }
}

fn swiglu(m: u64, k: u64, n: u64) -> SkinnyLinear {
    SkinnyLinear {
        swiglu: true,
        ..layer(m, k, &[n, n])
    }
}

/// The argument a refused layer's error names (also the builder's, with a workspace given).
fn refused(spec: &SkinnyLinear) -> &'static str {
    assert!(!spec.fits(), "{spec:?} fits");
    let from_builder = skinny_linear(spec, Some(addr(30)), true).unwrap_err();
    match (spec.check().unwrap_err(), from_builder) {
        (Error::Argument { argument, .. }, Error::Argument { argument: same, .. }) => {
            assert_eq!(argument, same);
            argument
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn refusals_name_the_argument() {
    let misaligned = |slot| Addr { slot, offset: 8 };
    assert!(layer(1, 896, &[896]).fits());
    assert_eq!(refused(&layer(0, 896, &[896])), "m");
    assert_eq!(refused(&layer(33, 896, &[896])), "m");
    assert!(layer(32, 896, &[896]).fits());
    assert_eq!(refused(&layer(1, 900, &[896])), "k");
    assert_eq!(refused(&layer(1, 0, &[896])), "k");
    assert_eq!(refused(&layer(1, 896, &[])), "groups");
    assert_eq!(refused(&layer(1, 896, &[8, 8, 8, 8])), "groups");
    assert_eq!(refused(&layer(1, 896, &[8, 0])), "n");
    let mut spec = layer(2, 896, &[896]);
    spec.ldx = 892;
    assert_eq!(refused(&spec), "ldx");
    spec.ldx = 900;
    assert_eq!(refused(&spec), "ldx", "not a multiple of 8");
    spec.ldx = 904;
    assert!(spec.fits());
    spec.x = misaligned(0);
    assert_eq!(refused(&spec), "x");
    let mut spec = layer(1, 896, &[896, 128]);
    spec.groups[1].w = misaligned(4);
    assert_eq!(refused(&spec), "w");
    let mut spec = layer(1, 896, &[896, 128]);
    spec.groups[1].bias = Some(Addr { slot: 5, offset: 1 });
    assert_eq!(refused(&spec), "bias");
    spec.groups[1].bias = Some(Addr { slot: 5, offset: 2 });
    assert!(spec.fits(), "bias needs 2 bytes only");
    spec.groups[1].out = Addr { slot: 6, offset: 2 };
    assert_eq!(refused(&spec), "out");
    spec.groups[1].out = Addr { slot: 6, offset: 4 };
    spec.groups[1].ldo = 127;
    assert_eq!(refused(&spec), "ldo");
    // SwiGLU: gate and up of equal n, nothing else.
    assert!(swiglu(1, 896, 4864).fits());
    let lone = SkinnyLinear {
        swiglu: true,
        ..layer(1, 896, &[4864])
    };
    assert_eq!(refused(&lone), "swiglu");
    let three = SkinnyLinear {
        swiglu: true,
        ..layer(1, 896, &[8, 8, 8])
    };
    assert_eq!(refused(&three), "swiglu");
    let unequal = SkinnyLinear {
        swiglu: true,
        ..layer(1, 896, &[8, 16])
    };
    assert_eq!(refused(&unequal), "swiglu");
    // The message names the argument too.
    let message = layer(33, 896, &[896]).check().unwrap_err().to_string();
    assert!(
        message.contains("`m`") && message.contains("33") && message.contains("1 to 32"),
        "{message}"
    );
}

#[test]
fn the_plan_is_a_pure_function_of_the_shape_with_whole_cuts() {
    for m in 1..=LINEAR_MAX_ROWS {
        for k in [8, 64, 136, 896, 1536, 4864, 8960, 1 << 20] {
            for columns in [1, 127, 128, 1152, 9728, 151_936] {
                let plan = linear_plan(m, k, columns);
                assert_eq!(plan, linear_plan(m, k, columns));
                let at = format!("m {m} k {k} columns {columns}: {plan:?}");
                assert_eq!(plan.tensor_cores, m >= 2, "{at}");
                if plan.tensor_cores {
                    assert!(plan.rows.is_multiple_of(8), "{at}");
                    assert!(plan.rows >= m && plan.rows < m + 8, "{at}");
                } else {
                    assert_eq!(plan.rows, 1, "{at}");
                }
                assert!(plan.column_tiles * TILE_COLUMNS >= columns, "{at}");
                assert!((plan.column_tiles - 1) * TILE_COLUMNS < columns, "{at}");
                assert!(
                    plan.splits >= 1 && plan.split_k.is_multiple_of(SPLIT_ALIGN),
                    "{at}"
                );
                // Every split has elements; together they cover k.
                assert!((plan.splits - 1) * plan.split_k < k, "{at}");
                assert!(plan.splits * plan.split_k >= k, "{at}");
                if plan.splits > 1 {
                    assert!(plan.split_k >= MIN_SPLIT_K, "{at}");
                    // Partial sums (written and read) at most a quarter of the weight bytes on
                    // CUDA cores, half on tensor cores.
                    let divisor = if plan.tensor_cores { 8 } else { 16 };
                    assert!(divisor * plan.splits * m <= k, "{at}");
                }
                assert!(plan.stage_k <= plan.split_k, "{at}");
                assert!(plan.stage_k.is_multiple_of(SPLIT_ALIGN), "{at}");
                assert!(plan.shared_bytes() <= 34 * 1024, "{at}");
                assert!(
                    plan.shared_bytes() <= 48 * 1024,
                    "no opt-in launch attribute"
                );
            }
        }
    }
    // Out-of-contract shapes still give a plan of one block.
    let degenerate = linear_plan(0, 0, 0);
    assert_eq!((degenerate.column_tiles, degenerate.splits), (1, 1));
}

#[test]
fn qwen_decode_shapes_split_as_documented() {
    // (m, k, virtual columns) -> (column tiles, splits, split_k)
    let cases = [
        ((1, 896, 1152), (9, 7, 128)),       // q, k, v
        ((1, 896, 9728), (76, 3, 320)),      // gate and up
        ((1, 4864, 896), (7, 26, 192)),      // down
        ((1, 896, 151_936), (1187, 1, 896)), // lm_head
        ((1, 1536, 17_920), (140, 1, 1536)), // 1.5B gate and up
        ((1, 8960, 1536), (12, 20, 448)),    // 1.5B down
        ((8, 896, 1152), (9, 7, 128)),       // tensor cores from here
        ((8, 896, 9728), (76, 7, 128)),
        ((16, 896, 1152), (9, 7, 128)),
        ((16, 4864, 896), (7, 38, 128)),
        ((32, 896, 1152), (9, 3, 320)),
        ((32, 896, 9728), (76, 3, 320)),
        ((32, 4864, 896), (7, 19, 256)),
    ];
    for ((m, k, columns), expected) in cases {
        let plan = linear_plan(m, k, columns);
        assert_eq!(
            (plan.column_tiles, plan.splits, plan.split_k),
            expected,
            "{m} x {k} x {columns}"
        );
        // A split launch on CUDA cores is one wave of resident blocks.
        let blocks = plan.column_tiles * plan.splits;
        let one_wave = plan.tensor_cores || plan.splits == 1 || blocks <= CUDA_CORE_RESIDENT;
        assert!(one_wave, "{plan:?}");
    }
    assert_eq!(swiglu(1, 896, 4864).plan(), linear_plan(1, 896, 9728));
}

#[test]
fn workspace_is_needed_exactly_when_k_is_split() {
    let down = layer(1, 4864, &[896]);
    assert_eq!(down.workspace_bytes(), 26 * 896 * 4);
    assert_eq!(refused_workspace(&down, None), "workspace");
    let odd = Addr { slot: 9, offset: 2 };
    assert_eq!(refused_workspace(&down, Some(odd)), "workspace");
    // 26 splits: more than a cluster holds, so the reduce launch stays.
    assert_eq!(skinny_linear(&down, Some(addr(9)), true).unwrap().len(), 2);
    let lm_head = layer(1, 896, &[151_936]);
    assert_eq!(lm_head.workspace_bytes(), 0);
    assert_eq!(skinny_linear(&lm_head, None, true).unwrap().len(), 1);
}

#[test]
fn splits_finish_in_clusters_of_at_most_sixteen_blocks() {
    // q/k/v: 7 splits (1.5B's 12); gate/up: 3 (CUDA cores) and 7 (tensor cores, measured
    // slower in clusters); down: 26 and 38.
    for (spec, finishes) in [
        (layer(1, 896, &[896, 128, 128]), true),
        (layer(1, 1536, &[1536, 256, 256]), true),
        (swiglu(1, 896, 4864), true),
        (swiglu(8, 896, 4864), false),
        (layer(1, 4864, &[896]), false),
        (layer(16, 4864, &[896]), false),
    ] {
        let plan = spec.plan();
        assert_eq!(plan.cluster_finish(true), finishes, "{plan:?}");
        assert!(!plan.cluster_finish(false));
        let without = kernels(skinny_linear(&spec, Some(addr(30)), false).unwrap());
        let with = kernels(skinny_linear(&spec, Some(addr(30)), true).unwrap());
        assert_eq!(without.len(), 2);
        assert_eq!(with.len(), if finishes { 1 } else { 2 });
        assert_eq!(without[0].cluster, (1, 1, 1));
        if !finishes {
            assert_eq!(with, without);
            continue;
        }
        // One cluster per column tile, the flag set (linear_r1's last argument); the rest of
        // the main launch is the same.
        let (with, without) = (&with[0], &without[0]);
        assert_eq!(with.cluster, (1, plan.splits as u32, 1));
        let last = with.args.len() - 1;
        assert_eq!(
            (&with.args[last], &without.args[last]),
            (&Arg::I32(1), &Arg::I32(0))
        );
        assert_eq!(with.args[..last], without.args[..last]);
        assert_eq!(
            (with.grid, with.shared_bytes),
            (without.grid, without.shared_bytes)
        );
    }
    // An unsplit launch is never a cluster.
    let lm_head = layer(1, 896, &[151_936]);
    assert!(!lm_head.plan().cluster_finish(true));
}

fn refused_workspace(spec: &SkinnyLinear, workspace: Option<Addr>) -> &'static str {
    match skinny_linear(spec, workspace, true) {
        Err(Error::Argument { argument, .. }) => argument,
        other => panic!("{other:?}"),
    }
}

/// The parameter count of `extern "C" __global__ void function(...)` in `module`.
fn parameters(module: &str, function: &str) -> Option<usize> {
    crate::gpu::tests::parameter_kinds(module, function).map(|kinds| kinds.len())
}

fn kernels(launches: Vec<Launch>) -> Vec<Kernel> {
    let kernel = |launch| match launch {
        Launch::Kernel(kernel) => kernel,
        other => panic!("{other:?}"),
    };
    launches.into_iter().map(kernel).collect()
}

#[test]
fn launches_name_linear_kernels_with_their_signatures() {
    let mut seen = std::collections::BTreeSet::new();
    for (m, function) in [
        (1, "linear_r1"),
        (2, "linear_mma_r8"),
        (7, "linear_mma_r8"),
        (8, "linear_mma_r8"),
        (9, "linear_mma_r16"),
        (16, "linear_mma_r16"),
        (17, "linear_mma_r24"),
        (24, "linear_mma_r24"),
        (25, "linear_mma_r32"),
        (32, "linear_mma_r32"),
    ] {
        for spec in [
            layer(m, 896, &[896, 128, 128]),
            layer(m, 896, &[151_936]),
            swiglu(m, 896, 4864),
        ] {
            let launches = kernels(skinny_linear(&spec, Some(addr(30)), false).unwrap());
            let plan = spec.plan();
            assert_eq!(launches.len(), if plan.splits > 1 { 2 } else { 1 });
            let main = &launches[0];
            assert_eq!(main.function, function);
            let module = if m == 1 { MODULE } else { MMA_MODULE };
            assert_eq!(main.module, module);
            assert_eq!(main.grid, (plan.column_tiles as u32, plan.splits as u32, 1));
            assert_eq!(main.block, (256, 1, 1));
            let staged = match m {
                1 => plan.stage_k * 4,
                _ => (plan.stage_k + 32) * 2,
            };
            assert_eq!(main.shared_bytes as u64, plan.rows * staged);
            if let Some(reduce) = launches.get(1) {
                assert_eq!((reduce.module, reduce.function), (MODULE, "linear_reduce"));
            }
            for kernel in &launches {
                let count = parameters(kernel.module, kernel.function).unwrap_or_else(|| {
                    panic!("{} is not a kernel of {}", kernel.function, kernel.module)
                });
                assert_eq!(count, kernel.args.len(), "{}", kernel.function);
                seen.insert(kernel.function);
            }
        }
    }
    // The norm epilogue: one block per row, a thread per column up to 1024, after a split;
    // more columns take the reduce and the norm in place.
    let norm = |stored| NormEpilogue {
        residual: addr(31),
        weight: addr(32),
        stored,
        normed: addr(33),
        eps: 1e-6,
    };
    let wide = |m, k, clusters| {
        let spec = layer(m, k, &[1536]);
        let launched =
            skinny_linear_add_rmsnorm(&spec, Some(addr(30)), norm(Stored::F32), clusters);
        let launched = kernels(launched.unwrap());
        launched.iter().map(|k| k.function).collect::<Vec<_>>()
    };
    let reduced = ["linear_mma_r8", "linear_reduce", "add_rmsnorm_f32"];
    assert_eq!(wide(8, 4864, false), reduced);
    assert_eq!(wide(8, 896, true), reduced); // tensor cores: no clusters
    assert_eq!(
        wide(1, 4864, true),
        ["linear_r1", "linear_reduce", "add_rmsnorm_f32"]
    ); // 22 splits
    assert_eq!(wide(1, 896, true), ["linear_r1", "add_rmsnorm_f32"]); // 7 splits, one cluster
    assert_eq!(wide(1, 1536, true), ["linear_r1", "add_rmsnorm_f32"]); // 1.5B's o: 12
    for (m, k, n, stored, reduce) in [
        (1, 4864, 896, Stored::BF16, "linear_reduce_add_rmsnorm_bf16"),
        (8, 4864, 1024, Stored::F32, "linear_reduce_add_rmsnorm"),
    ] {
        let spec = layer(m, k, &[n]);
        let launches =
            kernels(skinny_linear_add_rmsnorm(&spec, Some(addr(30)), norm(stored), true).unwrap());
        assert!(spec.plan().splits > 1);
        assert_eq!(launches[1].function, reduce);
        let threads = (n as u32).min(1024);
        assert_eq!(
            (launches[1].grid, launches[1].block),
            ((m as u32, 1, 1), (threads, 1, 1))
        );
        let count = parameters(MODULE, reduce).unwrap();
        assert_eq!(count, launches[1].args.len(), "{reduce}");
        seen.insert(launches[1].function);
    }
    // The RoPE and cache epilogue's: in clusters at one row, else its reduce.
    let qkv = layer(1, 896, &[896, 128, 128]);
    for clusters in [true, false] {
        let launched = skinny_linear_rope(&qkv, addr(9), rope(64), clusters, addr(30));
        for kernel in kernels(launched.unwrap()) {
            let count = parameters(kernel.module, kernel.function);
            assert_eq!(count, Some(kernel.args.len()), "{}", kernel.function);
            seen.insert(kernel.function);
        }
    }
    let defined: usize = (SOURCES.iter())
        .filter(|(name, _)| [MODULE, MMA_MODULE].contains(name))
        .map(|(_, source)| source.matches("extern \"C\" __global__ void ").count())
        .sum();
    assert_eq!(seen.len(), defined, "every kernel is reached: {seen:?}");
}

#[test]
fn swiglu_writes_group_zero_and_missing_groups_have_no_columns() {
    // Split: the reduce kernel writes; its first output pointer is gate's.
    let spec = swiglu(1, 896, 4864);
    let launches = kernels(skinny_linear(&spec, Some(addr(30)), false).unwrap());
    let reduce = &launches[1];
    assert_eq!(reduce.function, "linear_reduce");
    assert_eq!(reduce.args[0], Arg::Ptr(spec.groups[0].out));
    assert_eq!(reduce.args[3], Arg::Ptr(addr(30)));
    assert_eq!(reduce.args.last(), Some(&Arg::I32(1)));
    // One group: groups 1 and 2 pass n = 0 and no bias.
    let spec = layer(1, 896, &[151_936]);
    let main = &kernels(skinny_linear(&spec, None, true).unwrap())[0];
    assert_eq!(
        &main.args[10..16],
        &[
            Arg::I32(1),
            Arg::I32(0),
            Arg::I32(0),
            Arg::I64(151_936),
            Arg::I64(0),
            Arg::I64(0)
        ]
    );
    // x as f32 sets the rounding flag.
    let f32_input = SkinnyLinear {
        x_dtype: GemmDType::F32,
        ..spec
    };
    let main = &kernels(skinny_linear(&f32_input, None, true).unwrap())[0];
    assert_eq!(main.args[19..21], [Arg::Ptr(addr(0)), Arg::I32(1)]);
}

fn rope(head_dim: u64) -> RopeEpilogue {
    RopeEpilogue {
        q_rot: addr(20),
        k_cache: addr(21),
        v_cache: addr(22),
        rope_positions: addr(23),
        positions: addr(24),
        rows: CacheRows::Own,
        seq: 1,
        capacity: 64,
        head_dim,
        theta: 1e4,
    }
}

/// The RoPE and cache epilogue: one row of split k finishes in its clusters (one launch) where
/// the head divides the tile, else the reduce; one split writes y into the workspace, at its
/// columns and unbiased, for the reduce to finish; heads that do not divide the groups, two
/// groups and rows that are no whole tokens are refused.
#[test]
fn the_rope_epilogue_finishes_pairs_in_clusters_or_by_its_reduce() {
    let names = |spec: &SkinnyLinear, head_dim, clusters| {
        let launches = skinny_linear_rope(spec, addr(9), rope(head_dim), clusters, addr(30));
        let kernels = kernels(launches.unwrap());
        kernels.iter().map(|k| k.function).collect::<Vec<_>>()
    };
    let qkv = layer(1, 896, &[896, 128, 128]);
    assert_eq!(names(&qkv, 64, true), ["linear_r1_rope"]);
    assert_eq!(names(&qkv, 64, false), ["linear_r1", "linear_reduce_rope"]);
    let wide = layer(1, 512, &[512, 256, 256]);
    assert_eq!(names(&wide, 256, true), ["linear_r1", "linear_reduce_rope"]);
    let rows = layer(8, 896, &[896, 128, 128]);
    assert_eq!(
        names(&rows, 64, true),
        ["linear_mma_r8", "linear_reduce_rope"]
    );
    for kernel in kernels(skinny_linear_rope(&qkv, addr(9), rope(64), true, addr(30)).unwrap()) {
        assert_eq!(kernel.cluster, (1, kernel.grid.1, 1));
        assert_eq!(
            parameters(kernel.module, kernel.function),
            Some(kernel.args.len())
        );
    }
    // One split (k = 64): y at the workspace's columns, no bias; the reduce adds the biases.
    let small = layer(3, 64, &[64, 32, 32]);
    assert_eq!(small.plan().splits, 1);
    assert_eq!(small.rope_workspace_bytes(), 3 * 128 * 4);
    let launches = skinny_linear_rope(&small, addr(9), rope(16), true, addr(30)).unwrap();
    let [main, reduce] = &kernels(launches)[..] else {
        panic!("two launches");
    };
    let outs: Vec<&Arg> = main.args[..3].iter().collect();
    let at = |offset| Arg::Ptr(Addr { slot: 9, offset });
    assert_eq!(outs, [&at(0), &at(64 * 4), &at(96 * 4)]);
    assert!(
        main.args[10..13].iter().all(|a| *a == Arg::I32(0)),
        "{:?}",
        main.args
    );
    assert_eq!(reduce.args[4..7], [Arg::I32(1), Arg::I32(1), Arg::I32(1)]);
    // Refusals.
    let refused = |spec: &SkinnyLinear, head_dim| match skinny_linear_rope(
        spec,
        addr(9),
        rope(head_dim),
        true,
        addr(30),
    ) {
        Err(Error::Argument { argument, .. }) => argument,
        other => panic!("{other:?}"),
    };
    assert_eq!(refused(&qkv, 48), "rope");
    assert_eq!(refused(&qkv, 7), "rope");
    assert_eq!(refused(&layer(1, 896, &[896, 128]), 64), "rope");
    let two_tokens = RopeEpilogue { seq: 2, ..rope(64) };
    let launched = skinny_linear_rope(&qkv, addr(9), two_tokens, true, addr(30));
    assert!(matches!(
        launched,
        Err(Error::Argument {
            argument: "rope",
            ..
        })
    ));
}
