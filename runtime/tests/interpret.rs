//! The reference interpreter on small hand-built graphs, bit for bit against the kernels
//! called directly on plain vectors; and its bindings, writes and graph checks.

mod common;

use std::collections::BTreeMap;

use common::{bind, bits, f32_bits, op_texts, random_bf16, random_f32, random_ids, view, view_mut};
use kiln_ir::{DType, Graph, InputKind, Op, Shape};
use kiln_kernels::matmul::Transpose;
use kiln_kernels::{testing, TensorView};
use kiln_runtime::{interpret, Tensor};

#[test]
fn embedding_to_loss_matches_the_kernels_bit_for_bit() {
    let mut rng = testing::rng("embedding_to_loss_matches_the_kernels_bit_for_bit");
    let (vocab, hidden, classes, eps) = (11, 6, 5, 1e-6);
    let (embed, embed_v) = random_f32(&mut rng, &[vocab, hidden]);
    let (ids, ids_v) = random_ids(&mut rng, &[2, 3], vocab);
    let (w, w_v) = random_f32(&mut rng, &[classes, hidden]);
    let (bias, bias_v) = random_f32(&mut rng, &[classes]);
    let (norm, norm_v) = random_f32(&mut rng, &[classes]);
    let mut targets_v = testing::indices(&mut rng, 6, classes);
    targets_v[2] = -100;
    let targets = Tensor::from_vec(targets_v.clone(), [6]).unwrap();

    let mut graph = Graph::new("lm_head");
    let mut values = BTreeMap::new();
    let embed_id = bind(&mut graph, &mut values, "embed", InputKind::Param, &embed);
    let ids_id = bind(&mut graph, &mut values, "ids", InputKind::Input, &ids);
    let w_id = bind(&mut graph, &mut values, "w", InputKind::Param, &w);
    let bias_id = bind(&mut graph, &mut values, "bias", InputKind::Param, &bias);
    let norm_id = bind(&mut graph, &mut values, "norm", InputKind::Param, &norm);
    let targets_id = bind(
        &mut graph,
        &mut values,
        "targets",
        InputKind::Input,
        &targets,
    );
    let e = graph.op1(Op::Embedding, &[embed_id, ids_id]).unwrap();
    let shape = Shape::new(&[6, hidden]);
    let rows = graph.op1(Op::Reshape { shape }, &[e]).unwrap();
    let linear = Op::MatMul {
        transpose_a: false,
        transpose_b: true,
    };
    let m = graph.op1(linear, &[rows, w_id]).unwrap();
    let a = graph.op1(Op::Add, &[m, bias_id]).unwrap();
    let logits = graph.op1(Op::RmsNorm { eps }, &[a, norm_id]).unwrap();
    let ce = Op::CrossEntropy { ignore_index: -100 };
    let loss = graph.op1(ce, &[logits, targets_id]).unwrap();
    graph.output("loss", loss).unwrap();
    graph.output("logits", logits).unwrap();
    let outputs = interpret(&graph, &mut values).unwrap();

    // The same kernels, called directly.
    let mut e_v = vec![0f32; 6 * hidden];
    let ids_view = TensorView::contiguous(&ids_v, [2, 3]).unwrap();
    kiln_kernels::embedding::embedding(
        &view(&embed_v, &[vocab, hidden]),
        &ids_view,
        &mut view_mut(&mut e_v, &[2, 3, hidden]),
    )
    .unwrap();
    let mut m_v = vec![0f32; 6 * classes];
    let transpose = Transpose { a: false, b: true };
    kiln_kernels::matmul::matmul(
        &view(&e_v, &[6, hidden]),
        &view(&w_v, &[classes, hidden]),
        &mut view_mut(&mut m_v, &[6, classes]),
        transpose,
        &mut [],
    )
    .unwrap();
    let mut a_v = vec![0f32; 6 * classes];
    kiln_kernels::elementwise::add(
        &view(&m_v, &[6, classes]),
        &view(&bias_v, &[classes]),
        &mut view_mut(&mut a_v, &[6, classes]),
    )
    .unwrap();
    let mut logits_v = vec![0f32; 6 * classes];
    kiln_kernels::norm::rmsnorm(
        &view(&a_v, &[6, classes]),
        &view(&norm_v, &[classes]),
        eps,
        &mut view_mut(&mut logits_v, &[6, classes]),
    )
    .unwrap();
    let mut loss_v = [0f32];
    kiln_kernels::loss::cross_entropy(
        &view(&logits_v, &[6, classes]),
        &TensorView::contiguous(&targets_v, [6]).unwrap(),
        -100,
        &mut view_mut(&mut loss_v, &[]),
    )
    .unwrap();

    assert_eq!(bits(&outputs["logits"]), f32_bits(&logits_v));
    assert_eq!(bits(&outputs["loss"]), f32_bits(&loss_v));
    assert!(loss_v[0].is_finite() && loss_v[0] > 0.0);
    // Nothing was written, so every binding is still the tensor given.
    assert!(values["embed"].storage().same(embed.storage()));
}

#[test]
fn attention_forward_and_backward_match_the_kernels() {
    let mut rng = testing::rng("attention_forward_and_backward_match_the_kernels");
    let (b, hq, hkv, t, s, d, scale) = (1, 4, 2, 3, 5, 6, 0.4);
    // q arrives as [B,T,Hq,D] and is made BHTD by transpose + contiguous in the graph.
    let (q_bthd, q_bthd_v) = random_f32(&mut rng, &[b, t, hq, d]);
    let (k, k_v) = random_f32(&mut rng, &[b, hkv, s, d]);
    let (v, v_v) = random_f32(&mut rng, &[b, hkv, s, d]);
    let (grad, grad_v) = random_f32(&mut rng, &[b, t, hq, d]);

    let mut graph = Graph::new("attention");
    let mut values = BTreeMap::new();
    let q_in = bind(&mut graph, &mut values, "q", InputKind::Input, &q_bthd);
    let k_id = bind(&mut graph, &mut values, "k", InputKind::Input, &k);
    let v_id = bind(&mut graph, &mut values, "v", InputKind::Input, &v);
    let g_id = bind(&mut graph, &mut values, "grad", InputKind::Input, &grad);
    let q_t = graph
        .op1(Op::Transpose { dim0: 1, dim1: 2 }, &[q_in])
        .unwrap();
    let q_id = graph.op1(Op::Contiguous, &[q_t]).unwrap();
    let forward = graph
        .op(Op::Attention { scale }, &[q_id, k_id, v_id])
        .unwrap();
    let backward = graph
        .op(
            Op::AttentionBackward { scale },
            &[q_id, k_id, v_id, forward[1], g_id],
        )
        .unwrap();
    for (name, value) in [("out", forward[0]), ("probs", forward[1])]
        .into_iter()
        .chain([
            ("gq", backward[0]),
            ("gk", backward[1]),
            ("gv", backward[2]),
        ])
    {
        graph.output(name, value).unwrap();
    }
    let outputs = interpret(&graph, &mut values).unwrap();

    // q in BHTD, written out by hand.
    let mut q_v = vec![0f32; q_bthd_v.len()];
    for (ti, hi, j) in
        (0..t).flat_map(|ti| (0..hq).flat_map(move |hi| (0..d).map(move |j| (ti, hi, j))))
    {
        q_v[(hi * t + ti) * d + j] = q_bthd_v[(ti * hq + hi) * d + j];
    }
    let (q_dims, kv_dims) = ([b, hq, t, d], [b, hkv, s, d]);
    let mut probs_v = vec![0f32; b * hq * t * s];
    let mut out_v = vec![0f32; b * t * hq * d];
    kiln_kernels::attention::attention(
        &view(&q_v, &q_dims),
        &view(&k_v, &kv_dims),
        &view(&v_v, &kv_dims),
        scale,
        &mut view_mut(&mut probs_v, &[b, hq, t, s]),
        &mut view_mut(&mut out_v, &[b, t, hq, d]),
    )
    .unwrap();
    let (mut gq, mut gk, mut gv) = (
        vec![0f32; q_v.len()],
        vec![0f32; k_v.len()],
        vec![0f32; v_v.len()],
    );
    let mut workspace = vec![0f32; s];
    kiln_kernels::attention::attention_backward(
        &view(&q_v, &q_dims),
        &view(&k_v, &kv_dims),
        &view(&v_v, &kv_dims),
        &view(&probs_v, &[b, hq, t, s]),
        &view(&grad_v, &[b, t, hq, d]),
        scale,
        &mut view_mut(&mut gq, &q_dims),
        &mut view_mut(&mut gk, &kv_dims),
        &mut view_mut(&mut gv, &kv_dims),
        &mut view_mut(&mut workspace, &[s]),
    )
    .unwrap();
    for (name, want) in [
        ("out", &out_v),
        ("probs", &probs_v),
        ("gq", &gq),
        ("gk", &gk),
        ("gv", &gv),
    ] {
        assert_eq!(bits(&outputs[name]), f32_bits(want), "{name}");
    }
}

#[test]
fn cache_write_then_cached_attention_matches_the_kernels_and_replaces_the_states() {
    let mut rng = testing::rng("cache_write_then_cached_attention_matches_the_kernels");
    let (b, hq, hkv, t, smax, d, scale) = (2, 4, 2, 2, 6, 4, 0.5);
    let (k_cache, k_cache_v) = random_f32(&mut rng, &[b, hkv, smax, d]);
    let (v_cache, v_cache_v) = random_f32(&mut rng, &[b, hkv, smax, d]);
    let (new_k, new_k_v) = random_f32(&mut rng, &[b, hkv, t, d]);
    let (new_v, new_v_v) = random_f32(&mut rng, &[b, hkv, t, d]);
    let (q, q_v) = random_f32(&mut rng, &[b, hq, t, d]);
    let positions_v = vec![1i64, 4];
    let positions = Tensor::from_vec(positions_v.clone(), [b]).unwrap();

    let mut graph = Graph::new("decode");
    let mut values = BTreeMap::new();
    let kc = bind(
        &mut graph,
        &mut values,
        "k_cache",
        InputKind::State,
        &k_cache,
    );
    let vc = bind(
        &mut graph,
        &mut values,
        "v_cache",
        InputKind::State,
        &v_cache,
    );
    let nk = bind(&mut graph, &mut values, "new_k", InputKind::Input, &new_k);
    let nv = bind(&mut graph, &mut values, "new_v", InputKind::Input, &new_v);
    let q_id = bind(&mut graph, &mut values, "q", InputKind::Input, &q);
    let pos = bind(
        &mut graph,
        &mut values,
        "positions",
        InputKind::Input,
        &positions,
    );
    let kc2 = graph.op1(Op::KvCacheWrite, &[kc, nk, pos]).unwrap();
    let vc2 = graph.op1(Op::KvCacheWrite, &[vc, nv, pos]).unwrap();
    let out = graph
        .op1(Op::CachedAttention { scale }, &[q_id, kc2, vc2, pos])
        .unwrap();
    graph.output("out", out).unwrap();
    graph.write("k_cache", kc2).unwrap();
    graph.write("v_cache", vc2).unwrap();
    let outputs = interpret(&graph, &mut values).unwrap();

    let cache_dims = [b, hkv, smax, d];
    let positions_view = TensorView::contiguous(&positions_v, [b]).unwrap();
    let (mut k_want, mut v_want) = (k_cache_v.clone(), v_cache_v.clone());
    for (cache, new) in [(&mut k_want, &new_k_v), (&mut v_want, &new_v_v)] {
        kiln_kernels::cache::kv_cache_write(
            &mut view_mut(cache, &cache_dims),
            &view(new, &[b, hkv, t, d]),
            &positions_view,
            None,
        )
        .unwrap();
    }
    let mut probs = vec![0f32; b * hq * t * smax];
    let mut out_want = vec![0f32; b * t * hq * d];
    kiln_kernels::cache::cached_attention(
        &view(&q_v, &[b, hq, t, d]),
        &view(&k_want, &cache_dims),
        &view(&v_want, &cache_dims),
        (&positions_view, None),
        scale,
        &mut view_mut(&mut probs, &[b, hq, t, smax]),
        &mut view_mut(&mut out_want, &[b, t, hq, d]),
    )
    .unwrap();
    assert_eq!(bits(&outputs["out"]), f32_bits(&out_want));
    assert_eq!(bits(&values["k_cache"]), f32_bits(&k_want));
    assert_eq!(bits(&values["v_cache"]), f32_bits(&v_want));
    // The states were replaced by new tensors; the old ones still hold the old rows.
    assert!(!values["k_cache"].storage().same(k_cache.storage()));
    assert_eq!(bits(&k_cache), f32_bits(&k_cache_v));
    assert_eq!(bits(&v_cache), f32_bits(&v_cache_v));
    assert_ne!(k_want, k_cache_v);
}

/// A bf16 decode attention's RoPEs and cache writes over a pool of slots (a padding row
/// among them), fused into one `rope_kv_write` by the fusion pass, give the unfused program's
/// bits: the attention's output and both caches.
#[test]
fn the_fused_rope_and_cache_write_equals_its_unfused_ops_bit_for_bit() {
    let mut rng = testing::rng("interpret_rope_kv");
    let (b, hq, hkv, t, pool, smax, d) = (3, 4, 2, 1, 5, 6, 8);
    let mut graph = Graph::new("decode");
    let mut values = BTreeMap::new();
    let mut input = |name: &str, kind: InputKind, tensor: &Tensor| {
        bind(&mut graph, &mut values, name, kind, tensor)
    };
    let kc = input(
        "k_cache",
        InputKind::State,
        &random_bf16(&mut rng, &[pool, hkv, smax, d]),
    );
    let vc = input(
        "v_cache",
        InputKind::State,
        &random_bf16(&mut rng, &[pool, hkv, smax, d]),
    );
    let q = input(
        "q",
        InputKind::Input,
        &random_f32(&mut rng, &[b, t, hq, d]).0,
    );
    let k = input(
        "k",
        InputKind::Input,
        &random_f32(&mut rng, &[b, t, hkv, d]).0,
    );
    let v = input(
        "v",
        InputKind::Input,
        &random_f32(&mut rng, &[b, hkv, t, d]).0,
    );
    let q_bias = input(
        "q_bias",
        InputKind::Param,
        &random_bf16(&mut rng, &[hq * d]),
    );
    let k_bias = input(
        "k_bias",
        InputKind::Param,
        &random_bf16(&mut rng, &[hkv * d]),
    );
    let positions = Tensor::from_vec(vec![2i64, 0, 5], [b]).unwrap();
    let pos = input("positions", InputKind::Input, &positions);
    let rows = Tensor::from_vec(vec![3i64, kiln_ir::PADDING_SLOT, 0], [b]).unwrap();
    let rows = input("rows", InputKind::Input, &rows);
    let rope_positions = Tensor::from_vec(vec![2i64, 0, 5], [b, t]).unwrap();
    let rope_pos = input("rope_positions", InputKind::Input, &rope_positions);
    let rope = Op::Rope {
        theta: 1e6,
        bias: true,
    };
    let q_rot = graph.op1(rope.clone(), &[q, rope_pos, q_bias]).unwrap();
    let k_rot = graph.op1(rope, &[k, rope_pos, k_bias]).unwrap();
    let kc2 = graph
        .op1(Op::KvCacheWrite, &[kc, k_rot, pos, rows])
        .unwrap();
    let vc2 = graph.op1(Op::KvCacheWrite, &[vc, v, pos, rows]).unwrap();
    let attention = Op::CachedAttention { scale: 0.3 };
    let out = graph.op1(attention, &[q_rot, kc2, vc2, pos, rows]).unwrap();
    graph.output("out", out).unwrap();
    graph.write("k_cache", kc2).unwrap();
    graph.write("v_cache", vc2).unwrap();

    let fused = kiln_ir::fuse(&graph).unwrap();
    kiln_ir::verify(&fused).unwrap();
    let texts = op_texts(&fused);
    let names: Vec<&str> = texts.iter().map(|t| kiln_ir::name_of_text(t)).collect();
    assert_eq!(names, ["rope_kv_write", "cached_attention"]);
    let (mut unfused_values, mut fused_values) = (values.clone(), values.clone());
    let want = interpret(&graph, &mut unfused_values).unwrap();
    let got = interpret(&fused, &mut fused_values).unwrap();
    assert_eq!(bits(&got["out"]), bits(&want["out"]));
    for cache in ["k_cache", "v_cache"] {
        assert_eq!(bits(&fused_values[cache]), bits(&unfused_values[cache]));
        // The written rows changed the cache.
        assert_ne!(bits(&fused_values[cache]), bits(&values[cache]));
    }
}

/// A bf16 prefill attention's RoPEs, cache writes and v's head-major copy over a pool of slots
/// (a padding row among them), fused into one staged `rope_kv_write` (its FlashAttention then
/// reads the op's f16 rows), give the unfused program's bits: the attention's output and both
/// caches. The rule leaves the ops apart where the rotated keys are read elsewhere too, and
/// ahead of a FlashAttention that rounds to bf16 (mixed precision's).
#[test]
fn the_staged_rope_and_cache_write_equals_its_unfused_ops_bit_for_bit() {
    let mut rng = testing::rng("interpret_rope_kv_staged");
    let (b, hq, hkv, t, pool, smax, d) = (3, 4, 2, 5, 5, 12, 16);
    let tensors = [
        random_bf16(&mut rng, &[pool, hkv, smax, d]),
        random_bf16(&mut rng, &[pool, hkv, smax, d]),
        random_f32(&mut rng, &[b, t, hq, d]).0,
        random_f32(&mut rng, &[b, t, hkv, d]).0,
        random_f32(&mut rng, &[b, t, hkv, d]).0,
        random_bf16(&mut rng, &[hq * d]),
        random_bf16(&mut rng, &[hkv * d]),
    ];
    let positions = Tensor::from_vec(vec![2i64, 0, 7], [b]).unwrap();
    let rows = Tensor::from_vec(vec![3i64, kiln_ir::PADDING_SLOT, 0], [b]).unwrap();
    let rope_positions: Vec<i64> = [2i64, 0, 7]
        .iter()
        .flat_map(|&p| (p..p + t as i64).collect::<Vec<_>>())
        .collect();
    let rope_positions = Tensor::from_vec(rope_positions, [b, t]).unwrap();
    // The program, with the rotated keys also an output, or the attention rounding to bf16.
    let program = |keys_out: bool, rounding: DType| {
        let mut graph = Graph::new("prefill");
        let mut values = BTreeMap::new();
        let mut input = |name: &str, kind: InputKind, tensor: &Tensor| {
            bind(&mut graph, &mut values, name, kind, tensor)
        };
        let kc = input("k_cache", InputKind::State, &tensors[0]);
        let vc = input("v_cache", InputKind::State, &tensors[1]);
        let q = input("q", InputKind::Input, &tensors[2]);
        let k = input("k", InputKind::Input, &tensors[3]);
        let v = input("v", InputKind::Input, &tensors[4]);
        let q_bias = input("q_bias", InputKind::Param, &tensors[5]);
        let k_bias = input("k_bias", InputKind::Param, &tensors[6]);
        let pos = input("positions", InputKind::Input, &positions);
        let slots = input("rows", InputKind::Input, &rows);
        let rope_pos = input("rope_positions", InputKind::Input, &rope_positions);
        let rope = Op::Rope {
            theta: 1e6,
            bias: true,
        };
        let q_rot = graph.op1(rope.clone(), &[q, rope_pos, q_bias]).unwrap();
        let k_rot = graph.op1(rope, &[k, rope_pos, k_bias]).unwrap();
        let v_t = (graph.op1(Op::Transpose { dim0: 1, dim1: 2 }, &[v]))
            .and_then(|v_t| graph.op1(Op::Contiguous, &[v_t]))
            .unwrap();
        let write = Op::KvCacheWrite;
        let kc2 = graph.op1(write.clone(), &[kc, k_rot, pos, slots]).unwrap();
        let vc2 = graph.op1(write, &[vc, v_t, pos, slots]).unwrap();
        let flash = Op::FlashAttention {
            scale: 0.3,
            rounding,
        };
        let out = graph.op(flash, &[q_rot, k_rot, v_t]).unwrap();
        graph.output("out", out[0]).unwrap();
        if keys_out {
            graph.output("k_rot", k_rot).unwrap();
        }
        graph.write("k_cache", kc2).unwrap();
        graph.write("v_cache", vc2).unwrap();
        (graph, values)
    };
    let (graph, values) = program(false, DType::F16);
    let fused = kiln_ir::fuse(&graph).unwrap();
    kiln_ir::verify(&fused).unwrap();
    assert_eq!(
        op_texts(&fused),
        [
            "rope_kv_write{theta=1000000.0, bias=true, staged=f16}",
            "flash_attention{scale=0.3, rounding=f16}"
        ]
    );
    let (mut unfused_values, mut fused_values) = (values.clone(), values.clone());
    let want = interpret(&graph, &mut unfused_values).unwrap();
    let got = interpret(&fused, &mut fused_values).unwrap();
    assert_eq!(bits(&got["out"]), bits(&want["out"]));
    for cache in ["k_cache", "v_cache"] {
        assert_eq!(bits(&fused_values[cache]), bits(&unfused_values[cache]));
        assert_ne!(bits(&fused_values[cache]), bits(&values[cache]));
    }
    for (keys_out, rounding) in [(true, DType::F16), (false, DType::BF16)] {
        let fused = kiln_ir::fuse(&program(keys_out, rounding).0).unwrap();
        let rope_kv = op_texts(&fused)
            .iter()
            .filter(|op| op.starts_with("rope_kv"))
            .count();
        assert_eq!(
            rope_kv, 0,
            "keys read elsewhere: {keys_out}, rounding {rounding}"
        );
    }
}
