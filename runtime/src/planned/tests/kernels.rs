//! Ops with workspaces and in-place state updates: bf16 matmul, attention and its backward,
//! kv_cache_write with cached_attention, AdamW.

use std::collections::BTreeMap;

use kiln_ir::{AdamWConfig, Graph, InputKind, Op, Shape};
use kiln_kernels::testing;

use super::plans::{arena, bound, make_plan, output, workspace};
use super::{assert_matches_interpret, bind, random, random_bf16};
use crate::Tensor;

#[test]
fn a_bf16_matmul_with_its_workspace_matches_the_interpreter() {
    let mut rng = testing::rng("a_bf16_matmul_with_its_workspace_matches_the_interpreter");
    let mut graph = Graph::new("bf16_matmul");
    let mut values = BTreeMap::new();
    let mut input = |name: &str, kind: InputKind, dims: &[usize]| {
        let tensor = random_bf16(&mut rng, dims);
        bind(&mut graph, &mut values, name, kind, &tensor)
    };
    let a = input("a", InputKind::Input, &[2, 3, 4]);
    let b = input("b", InputKind::Param, &[2, 5, 4]);
    let b2 = input("b2", InputKind::Param, &[2, 6, 5]);
    let linear = Op::MatMul {
        transpose_a: false,
        transpose_b: true,
    };
    let m = graph.op1(linear.clone(), &[a, b]).unwrap();
    let s = graph.op1(Op::Scale { alpha: 0.25 }, &[m]).unwrap();
    let c = graph
        .op1(
            Op::Cast {
                to: kiln_ir::DType::BF16,
            },
            &[s],
        )
        .unwrap();
    let m2 = graph.op1(linear, &[c, b2]).unwrap();
    graph.output("m2", m2).unwrap();
    graph.output("s", s).unwrap();
    // m is scaled in place into s (an output, so its buffer lives to the end); the second
    // matmul's workspace reuses the bytes of the first one's.
    let plan = make_plan(
        &graph,
        &[
            bound(&[a]),
            bound(&[b]),
            bound(&[b2]),
            arena(0, &[m, s]),
            workspace(256, m),
            arena(768, &[c]),
            workspace(256, m2),
            output(&[m2]),
        ],
    );
    // f32 copies of the operands: (24 + 40) floats, then (30 + 60).
    assert_eq!(plan.buffers[4].size, 4 * (24 + 40));
    assert_eq!(plan.buffers[6].size, 4 * (30 + 60));
    assert_matches_interpret(&graph, &plan, &values);
}

#[test]
fn attention_and_its_backward_match_the_interpreter() {
    let mut rng = testing::rng("attention_and_its_backward_match_the_interpreter");
    let (b, hq, hkv, t, s, d, scale) = (1, 4, 2, 3, 5, 6, 0.4);
    let mut graph = Graph::new("attention");
    let mut values = BTreeMap::new();
    let mut input = |name: &str, dims: &[usize]| {
        let tensor = random(&mut rng, dims);
        bind(&mut graph, &mut values, name, InputKind::Input, &tensor)
    };
    let q = input("q", &[b, hq, t, d]);
    let k = input("k", &[b, hkv, s, d]);
    let v = input("v", &[b, hkv, s, d]);
    let g = input("grad", &[b, t, hq, d]);
    let forward = graph.op(Op::Attention { scale }, &[q, k, v]).unwrap();
    let backward_op = Op::AttentionBackward { scale };
    let backward = graph.op(backward_op, &[q, k, v, forward[1], g]).unwrap();
    graph.output("out", forward[0]).unwrap();
    for (name, value) in ["gq", "gk", "gv"].into_iter().zip(&backward) {
        graph.output(name, *value).unwrap();
    }
    let plan = make_plan(
        &graph,
        &[
            bound(&[q]),
            bound(&[k]),
            bound(&[v]),
            bound(&[g]),
            output(&[forward[0]]),
            arena(0, &[forward[1]]),
            output(&[backward[0]]),
            output(&[backward[1]]),
            output(&[backward[2]]),
            workspace(256, backward[0]),
        ],
    );
    // The GPU's GEMM backward: dS and the masked probs, [B,Hq,T,S] f32 each rounded up to 256
    // bytes, then grad_out transposed, [B,Hq,T,D] f32.
    let probs_bytes = (4 * b * hq * t * s).next_multiple_of(256);
    assert_eq!(
        plan.buffers[9].size,
        (2 * probs_bytes + 4 * b * hq * t * d) as u64
    );
    assert_matches_interpret(&graph, &plan, &values);
}

#[test]
fn cache_writes_and_cached_attention_with_state_writes_match_the_interpreter() {
    let mut rng = testing::rng("cache_writes_and_cached_attention_with_state_writes_match");
    let (b, hq, hkv, t, smax, d, scale) = (2, 4, 2, 2, 6, 4, 0.5);
    let mut graph = Graph::new("decode");
    let mut values = BTreeMap::new();
    let mut input = |name: &str, kind: InputKind, dims: &[usize]| {
        let tensor = random(&mut rng, dims);
        bind(&mut graph, &mut values, name, kind, &tensor)
    };
    let kc = input("k_cache", InputKind::State, &[b, hkv, smax, d]);
    let vc = input("v_cache", InputKind::State, &[b, hkv, smax, d]);
    let nk = input("new_k", InputKind::Input, &[b, hkv, t, d]);
    let nv = input("new_v", InputKind::Input, &[b, hkv, t, d]);
    let q = input("q", InputKind::Input, &[b, hq, t, d]);
    let positions = Tensor::from_vec(vec![1i64, 4], [b]).unwrap();
    let pos = bind(
        &mut graph,
        &mut values,
        "positions",
        InputKind::Input,
        &positions,
    );
    let kc2 = graph.op1(Op::KvCacheWrite, &[kc, nk, pos]).unwrap();
    let vc2 = graph.op1(Op::KvCacheWrite, &[vc, nv, pos]).unwrap();
    let out_op = Op::CachedAttention { scale };
    let out = graph.op1(out_op, &[q, kc2, vc2, pos]).unwrap();
    graph.output("out", out).unwrap();
    graph.write("k_cache", kc2).unwrap();
    graph.write("v_cache", vc2).unwrap();
    let ws = workspace(0, out);
    let plan = make_plan(
        &graph,
        &[
            // The caches are updated in their own buffers.
            bound(&[kc, kc2]),
            bound(&[vc, vc2]),
            bound(&[nk]),
            bound(&[nv]),
            bound(&[q]),
            bound(&[pos]),
            output(&[out]),
            ws,
        ],
    );
    assert_eq!(plan.buffers[7].size, 4 * (b * hq * t * smax) as u64);
    assert_matches_interpret(&graph, &plan, &values);

    // The same program with the new caches written to the arena instead, then copied out.
    let plan = make_plan(
        &graph,
        &[
            bound(&[kc]),
            bound(&[vc]),
            bound(&[nk]),
            bound(&[nv]),
            bound(&[q]),
            bound(&[pos]),
            arena(0, &[kc2]),
            arena(512, &[vc2]),
            output(&[out]),
            workspace(1024, out),
        ],
    );
    assert_matches_interpret(&graph, &plan, &values);
}

#[test]
fn adamw_updating_param_and_moments_in_place_matches_the_interpreter() {
    let mut rng = testing::rng("adamw_updating_param_and_moments_in_place_matches");
    let dims = [3, 7];
    let mut graph = Graph::new("adamw");
    let mut values = BTreeMap::new();
    let w = bind(
        &mut graph,
        &mut values,
        "w",
        InputKind::Param,
        &random(&mut rng, &dims),
    );
    let x = bind(
        &mut graph,
        &mut values,
        "x",
        InputKind::Input,
        &random(&mut rng, &dims),
    );
    let m = bind(
        &mut graph,
        &mut values,
        "m",
        InputKind::State,
        &random(&mut rng, &dims),
    );
    let v_values = testing::to_f32(&testing::uniform(&mut rng, 21, 0.0, 0.1));
    let v_tensor = Tensor::from_vec(v_values, dims).unwrap();
    let v = bind(&mut graph, &mut values, "v", InputKind::State, &v_tensor);
    let step_tensor = Tensor::from_vec(vec![3i64], Shape::scalar()).unwrap();
    let step = bind(
        &mut graph,
        &mut values,
        "step",
        InputKind::Input,
        &step_tensor,
    );
    let lr_tensor = Tensor::scalar(1e-2, kiln_ir::DType::F64);
    let lr = bind(&mut graph, &mut values, "lr", InputKind::Input, &lr_tensor);
    // A gradient computed in the arena, clipped there.
    let grad = graph.op1(Op::Mul, &[x, w]).unwrap();
    let clipped = graph
        .op(Op::ClipGradNorm { max_norm: 0.5 }, &[grad])
        .unwrap();
    let config = AdamWConfig {
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let updated = graph
        .op(Op::AdamW(config), &[w, grad, m, v, step, lr, clipped[1]])
        .unwrap();
    for (name, value) in ["w", "m", "v"].into_iter().zip(&updated) {
        graph.write(name, *value).unwrap();
    }
    graph.output("grad", grad).unwrap();
    graph.output("norm", clipped[0]).unwrap();
    graph.output("scale", clipped[1]).unwrap();
    let plan = make_plan(
        &graph,
        &[
            bound(&[w, updated[0]]),
            bound(&[x]),
            bound(&[m, updated[1]]),
            bound(&[v, updated[2]]),
            bound(&[step]),
            bound(&[lr]),
            output(&[grad]),
            output(&[clipped[0]]),
            output(&[clipped[1]]),
            workspace(0, clipped[0]),
        ],
    );
    assert_matches_interpret(&graph, &plan, &values);
}
