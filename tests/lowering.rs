//! Every program lowered for a device backend without a device (what CI can check of the GPU
//! path): every op of the tiny and official programs has launches, every address lies inside
//! its slot, and on one stream the graph's writes (updated params, AdamW moments, KV caches)
//! are made in their own slots, with no copy back.

use kiln_frontend::model::{ModelConfig, Precision};
use kiln_frontend::programs::{build, ProgramKind, ProgramOptions};
use kiln_ir::{LINEAR_MAX_ROWS, UNROUNDED_LINEAR_MAX_ROWS};
use kiln_kernels::gpu::SOURCES;
use kiln_planner::{plan, PlanOptions};
use kiln_runtime::{lower_for_device, LowerOptions};

fn check(config: &ModelConfig, options: &ProgramOptions, streams: usize, what: &str) {
    for kind in [
        ProgramKind::Prefill,
        ProgramKind::Decode,
        ProgramKind::Train,
    ] {
        if options.precision == Precision::Bf16 && kind == ProgramKind::Train {
            continue; // bf16 weights are for inference
        }
        let graph = build(kind, config, options).unwrap();
        let planned = plan(
            &graph,
            &PlanOptions {
                streams,
                ..Default::default()
            },
            &kiln_runtime::Workspaces::Cuda,
        )
        .unwrap();
        let summary = lower_for_device(&graph, &planned, LowerOptions::default())
            .unwrap_or_else(|e| panic!("{what} {}: {e}", kind.name()));
        println!(
            "{what} {} streams={streams}: {} kernels, {} GEMMs, {} copies, {} slots, {} writes in place, copied back: {:?}",
            kind.name(),
            summary.kernels,
            summary.gemms,
            summary.copies,
            summary.slots,
            summary.in_place_writes.len(),
            summary.copied_writes
        );
        // On one stream every write is made in place; with side streams, a parameter with a
        // reader that no event orders before its update is written to an output slot and
        // copied back.
        if streams == 1 {
            assert!(summary.copied_writes.is_empty(), "{what} {}", kind.name());
        }
        assert_eq!(
            summary.in_place_writes.len() + summary.copied_writes.len(),
            graph.writes().len()
        );
        assert!(summary.kernels > 0);
        // bf16 inference of up to 16 rows (`UNROUNDED_LINEAR_MAX_ROWS`: a decode's batch, a
        // prefill's tokens) runs every linear on the skinny kernels, no GEMM.
        let rows = match kind {
            ProgramKind::Decode => options.batch,
            _ => options.batch * options.seq,
        };
        let skinny = options.precision == Precision::Bf16 && rows <= UNROUNDED_LINEAR_MAX_ROWS;
        assert!(summary.gemms > 0 || skinny, "{what} {}", kind.name());
    }
}

#[test]
fn tiny_programs_lower_with_every_write_in_place() {
    for config in [ModelConfig::tiny(), ModelConfig::tiny_llama()] {
        for precision in Precision::ALL {
            // Caches of their own, and a KV pool of 5 slots.
            for pool in [None, Some(5)] {
                let options = ProgramOptions {
                    batch: 2,
                    seq: 6,
                    max_seq: Some(12),
                    pool,
                    precision,
                    ..Default::default()
                };
                for streams in [1, 2] {
                    let what = format!("tiny {:?} {precision:?} pool {pool:?}", config.family);
                    check(&config, &options, streams, &what);
                }
            }
        }
    }
}

#[test]
fn official_programs_lower_with_every_write_in_place() {
    let config = kiln_frontend::hf::presets::preset("qwen2.5-0.5b")
        .unwrap()
        .0;
    let options = ProgramOptions {
        batch: 1,
        seq: 512,
        max_seq: Some(512),
        ..Default::default()
    };
    check(&config, &options, 1, "qwen2.5-0.5b");
    let bf16 = ProgramOptions {
        precision: Precision::Bf16,
        ..options.clone()
    };
    check(&config, &bf16, 1, "qwen2.5-0.5b bf16");
    // Mixed precision's train step with SwiGLU's gate and up in bf16 (its prefill and decode
    // too).
    let swiglu = ProgramOptions {
        precision: Precision::Bf16Swiglu,
        ..options
    };
    check(&config, &swiglu, 1, "qwen2.5-0.5b bf16-swiglu");
}

/// By default bf16 decode runs every linear on the skinny kernels up to 16 rows; past 16 the
/// fusion pass has the linears' SwiGLU results and normed rows written rounded for the next
/// GEMM, and those rounded linears (o, gate/up, down) take cuBLASLt while q/k/v and the LM
/// head stay on the skinny kernels up to their 32 rows (`LowerOptions::linear_rows`, measured
/// in BENCHMARKS.md); past 32 every linear takes cuBLASLt, one GEMM per weight (q, k and v are
/// three).
#[test]
fn bf16_decode_takes_the_skinny_kernels_where_they_won() {
    use kiln_ir::{graph::NodeKind, Op};
    let config = ModelConfig::tiny();
    for batch in [16, 17, 32, 33] {
        let options = ProgramOptions {
            batch,
            seq: 6,
            max_seq: Some(12),
            precision: Precision::Bf16,
            ..Default::default()
        };
        let graph = build(ProgramKind::Decode, &config, &options).unwrap();
        let (mut weights, mut rounded) = (0, 0);
        for n in graph.node_indices() {
            let (op, is_rounded) = match &graph.node(n).unwrap().kind {
                NodeKind::Op(Op::Rounded(op)) => (&**op, true),
                NodeKind::Op(op) => (op, false),
                _ => continue,
            };
            if let Op::Linear { biases, .. } = op {
                weights += biases.len();
                rounded += if is_rounded { biases.len() } else { 0 };
            }
        }
        assert!(weights > rounded);
        assert_eq!(
            rounded > 0,
            batch > UNROUNDED_LINEAR_MAX_ROWS,
            "batch {batch}"
        );
        let planned = plan(
            &graph,
            &PlanOptions::default(),
            &kiln_runtime::Workspaces::Cuda,
        );
        let summary = lower_for_device(&graph, &planned.unwrap(), LowerOptions::default());
        let want = match batch <= LINEAR_MAX_ROWS {
            true => rounded,
            false => weights,
        };
        assert_eq!(summary.unwrap().gemms, want, "batch {batch}");
    }
}

/// The HIP backend's lowering (`LowerOptions::portable`) of every tiny program and of the
/// official bf16-GEMM train step: no vendor GEMM (kiln's tiled kernel takes each), only
/// modules hipRTC compiles (the tensor-core ones as their portable variants), no clusters, and
/// every address inside its slot.
#[test]
fn the_hip_lowering_needs_no_vendor_gemm_and_names_only_portable_modules() {
    let tiny = ProgramOptions {
        batch: 2,
        seq: 6,
        max_seq: Some(12),
        ..Default::default()
    };
    let official = kiln_frontend::hf::presets::preset("qwen2.5-0.5b")
        .unwrap()
        .0;
    let large = ProgramOptions {
        batch: 1,
        seq: 512,
        max_seq: Some(512),
        precision: Precision::Bf16Gemm,
        ..Default::default()
    };
    let mut cases = vec![(official, large, ProgramKind::Train)];
    for config in [ModelConfig::tiny(), ModelConfig::tiny_llama()] {
        for precision in Precision::ALL {
            for kind in [
                ProgramKind::Prefill,
                ProgramKind::Decode,
                ProgramKind::Train,
            ] {
                if precision == Precision::Bf16 && kind == ProgramKind::Train {
                    continue;
                }
                let options = ProgramOptions {
                    precision,
                    ..tiny.clone()
                };
                cases.push((config.clone(), options, kind));
            }
        }
    }
    for (config, options, kind) in cases {
        let what = format!(
            "{:?} {:?} {}",
            config.family,
            options.precision,
            kind.name()
        );
        let graph = build(kind, &config, &options).unwrap();
        let planned = plan(
            &graph,
            &PlanOptions::default(),
            &kiln_runtime::Workspaces::Cuda,
        )
        .unwrap();
        let cuda = lower_for_device(&graph, &planned, LowerOptions::default()).unwrap();
        let hip = lower_for_device(&graph, &planned, LowerOptions::portable())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(hip.gemms, 0, "{what}");
        // A tiled kernel per GEMM, and a reduce launch per split skinny linear (no clusters).
        assert!(hip.kernels >= cuda.kernels + cuda.gemms, "{what}");
        assert!(hip.modules.contains("gemm") || cuda.gemms == 0, "{what}");
        for module in &hip.modules {
            assert!(
                SOURCES.iter().any(|(name, _)| name == module),
                "{what}: {module}"
            );
            assert!(
                !["flash", "linear_mma"].contains(module),
                "{what}: {module}"
            );
        }
        println!("{what}: {} kernels, modules {:?}", hip.kernels, hip.modules);
    }
}

/// The rank programs lower every `all_reduce` to one collective launch of its buffers.
#[test]
fn parallel_programs_lower_each_all_reduce_to_one_collective() {
    let config = ModelConfig::tiny();
    let data_parallel = ProgramOptions {
        batch: 2,
        seq: 8,
        precision: Precision::Bf16Gemm,
        data_parallel: Some(kiln_frontend::programs::DataParallel {
            bucket_bytes: 40_000,
        }),
        ..Default::default()
    };
    let tensor_parallel = ProgramOptions {
        batch: 2,
        max_seq: Some(16),
        precision: Precision::Bf16,
        tensor_parallel: Some(2),
        ..Default::default()
    };
    for (kind, options) in [
        (ProgramKind::Train, &data_parallel),
        (ProgramKind::Decode, &tensor_parallel),
    ] {
        let graph = build(kind, &config, options).unwrap();
        let collectives = (graph.node_indices())
            .filter(|&n| {
                graph.node(n).is_some_and(|node| {
                    matches!(
                        node.kind,
                        kiln_ir::graph::NodeKind::Op(kiln_ir::Op::AllReduce)
                    )
                })
            })
            .count();
        let planned = plan(
            &graph,
            &PlanOptions::default(),
            &kiln_runtime::Workspaces::Cuda,
        )
        .unwrap();
        let summary = lower_for_device(&graph, &planned, LowerOptions::default()).unwrap();
        assert!(collectives > 0);
        assert_eq!(summary.collectives, collectives, "{}", kind.name());
    }
}

/// By default (`LowerOptions::l2_prefetch_bytes`, 32 MiB), beside each layer's cached attention
/// split of the official bf16 decode at batch 8, a launch on a side stream prefetches the
/// weights of the linears after the split up to the next layer's, in their order (the o
/// projection, gate, up, down, and the next layer's q, k, v), whole while they fit the budget
/// (the last layer's not the tied LM head's table, past it), on a second stream; with 0 bytes,
/// nothing. At batch 1 (fewer rows than `LowerOptions::l2_prefetch_min_rows`) nothing forks. A
/// tiny model's weights are all below the least range worth a prefetch. The HIP backend's
/// lowering (`LowerOptions::portable`) prefetches nothing.
#[test]
fn decode_splits_fork_prefetches_of_the_weights_of_the_linears_after_them() {
    let (config, _) = kiln_frontend::hf::presets::preset("qwen2.5-0.5b").unwrap();
    let options = |batch| ProgramOptions {
        batch,
        seq: 512,
        max_seq: Some(1024),
        precision: Precision::Bf16,
        ..Default::default()
    };
    let lower = |config: &ModelConfig, options: &ProgramOptions, lowering: LowerOptions| {
        let graph = build(ProgramKind::Decode, config, options).unwrap();
        let planned = plan(
            &graph,
            &PlanOptions::default(),
            &kiln_runtime::Workspaces::Cuda,
        )
        .unwrap();
        lower_for_device(&graph, &planned, lowering).unwrap()
    };
    let default = LowerOptions::default().l2_prefetch_bytes;
    assert_eq!(default, 32 << 20);
    let bytes = |l2_prefetch_bytes| LowerOptions {
        l2_prefetch_bytes,
        ..LowerOptions::default()
    };
    let launches = |summary: &kiln_runtime::LoweringSummary, name: &str| {
        summary.by_launch.get(name).copied().unwrap_or(0)
    };
    let side = |summary: &_| launches(summary, "prefetch.prefetch_l2");
    let splits = |summary: &_| launches(summary, "decode.cached_attention_split_f32_bf16");
    let layers = config.num_hidden_layers;
    let one = lower(&config, &options(1), bytes(default));
    assert!(one.prefetches.is_empty() && side(&one) == 0 && one.streams == 1);
    assert_eq!(splits(&one), layers);
    let off = lower(&config, &options(8), bytes(0));
    assert!(off.prefetches.is_empty() && side(&off) == 0 && off.streams == 1);
    let on = lower(&config, &options(8), bytes(default));
    assert_eq!((side(&on), splits(&on), on.streams), (layers, layers, 2));
    assert_eq!(on.kernels, off.kernels + config.num_hidden_layers);
    assert_eq!(on.prefetches.len(), config.num_hidden_layers);
    let (h, i) = (config.hidden_size as u64, config.intermediate_size as u64);
    let kv = (config.num_key_value_heads * config.head_dim) as u64;
    let last = config.num_hidden_layers - 1;
    for (layer, ranges) in on.prefetches.iter().enumerate() {
        let p = format!("model.layers.{layer}.");
        let mut want = vec![
            (format!("{p}self_attn.o_proj.weight"), h * h * 2),
            (format!("{p}mlp.gate_proj.weight"), h * i * 2),
            (format!("{p}mlp.up_proj.weight"), h * i * 2),
            (format!("{p}mlp.down_proj.weight"), i * h * 2),
        ];
        if layer != last {
            let n = format!("model.layers.{}.self_attn.", layer + 1);
            want.push((format!("{n}q_proj.weight"), h * h * 2));
            want.push((format!("{n}k_proj.weight"), kv * h * 2));
            want.push((format!("{n}v_proj.weight"), kv * h * 2));
        }
        assert_eq!(ranges, &want, "layer {layer}");
    }
    let tiny_options = ProgramOptions {
        seq: 6,
        max_seq: Some(128),
        ..options(8)
    };
    let tiny_config = ModelConfig::tiny();
    let tiny = lower(&tiny_config, &tiny_options, bytes(default));
    assert!(tiny.prefetches.is_empty() && side(&tiny) == 0);
    assert_eq!(splits(&tiny), tiny_config.num_hidden_layers);
    // The HIP backend's lowering prefetches nothing (Hopper's bulk prefetch).
    let portable = lower(&config, &options(8), LowerOptions::portable());
    assert!(portable.prefetches.is_empty() && portable.streams == 1);
}
