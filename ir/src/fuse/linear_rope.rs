//! The `linear_rope` rule (see the pass's module doc): a decode attention's `RopeKvWrite` whose
//! q, k and v are the three results of one `Linear` (through reshapes) becomes that linear's
//! epilogue (`rope_kv`): the projection, its biases, RoPE and the cache append in one op.

use petgraph::graph::NodeIndex;

use super::{only_read_by, op_of, takes, Fusion, Users};
use crate::op::rope_kv::{LinearRopeKv, RopeKvParts, K, K_CACHE, POSITIONS, Q, V};
use crate::{Graph, Op, ValueId};

/// The rule at every `RopeKvWrite` it matches.
pub(super) fn linear_rope_fusions(graph: &Graph, users: &Users) -> Vec<Fusion> {
    graph
        .node_indices()
        .filter_map(|node| linear_rope_fusion(graph, users, node))
        .collect()
}

/// `RopeKvWrite{theta, bias}(q, k, v, caches, indices…[, q_bias, k_bias])` at `write` (not the
/// staged form), with q, k and v results 0, 1 and 2 of one three-group `Linear` without an
/// epilogue, each through reshapes read by the next alone, the linear's results read by
/// nothing else; with `bias`, q's and k's groups have none of their own (the rotation's bias
/// is added where the linear adds one, before the rotation, as unfused). The fused op reads
/// its results as the unfused views do (its type rule checks the shapes).
fn linear_rope_fusion(graph: &Graph, users: &Users, write: NodeIndex) -> Option<Fusion> {
    let Some(&Op::RopeKvWrite {
        theta,
        bias,
        staged: None,
    }) = op_of(graph, write)
    else {
        return None;
    };
    let operands = graph.operands(write);
    let parts = RopeKvParts::of(theta, bias, operands.len())?;
    let mut linear = None;
    let mut replaced = Vec::new();
    for (group, port) in [Q, K, V].into_iter().enumerate() {
        let (mut value, mut reader) = (operands[port], write);
        while let Some(Op::Reshape { .. }) = op_of(graph, value.node) {
            if !only_read_by(users, value, reader) {
                return None;
            }
            replaced.push(value.node);
            (value, reader) = (graph.operands(value.node)[0], value.node);
        }
        if value.port != group || !only_read_by(users, value, reader) {
            return None;
        }
        if *linear.get_or_insert(value.node) != value.node {
            return None;
        }
    }
    let linear = linear?;
    let Some(Op::Linear {
        biases,
        swiglu: false,
        add_rmsnorm: None,
        rope_kv: None,
    }) = op_of(graph, linear)
    else {
        return None;
    };
    if biases.len() != 3 || (bias && (biases[0] || biases[1])) {
        return None;
    }
    let linear_operands = graph.operands(linear);
    // The groups' biases in group order: the linear's, or the rotations' for q and k.
    let mut own = linear_operands[4..].iter().copied();
    let mut fused_biases = Vec::with_capacity(3);
    let mut bias_values = Vec::new();
    for (group, &has) in biases.iter().enumerate() {
        let rotation = match group {
            0 => parts.q_rope.get(2),
            1 => parts.k_rope.get(2),
            _ => None,
        };
        let value = match (has, rotation) {
            (true, _) => own.next(),
            (false, Some(&port)) => Some(operands[port]),
            (false, None) => None,
        };
        fused_biases.push(value.is_some());
        bias_values.extend(value);
    }
    let mut fused = linear_operands[..4].to_vec();
    fused.extend(bias_values);
    fused.extend_from_slice(&operands[K_CACHE..POSITIONS + parts.indices.len()]);
    let op = Op::Linear {
        biases: fused_biases,
        swiglu: false,
        add_rmsnorm: None,
        rope_kv: Some(theta),
    };
    if !takes(graph, &op, &fused) || !same_views(graph, &operands, &fused) {
        return None;
    }
    replaced.extend([linear, write]);
    Some(Fusion {
        at: write,
        replaced,
        op,
        operands: fused,
        ends: (0..3).map(|port| ValueId { node: write, port }).collect(),
    })
}

/// Whether the unfused q, k and v (`operands`) are the fused op's views of its results
/// ([`LinearRopeKv::views`]).
fn same_views(graph: &Graph, operands: &[ValueId], fused: &[ValueId]) -> bool {
    let dims = |v: ValueId| graph.value_type(v).ok().map(|t| t.dims().to_vec());
    let widths: Option<Vec<usize>> = (fused[1..4].iter())
        .map(|&w| dims(w).and_then(|d| d.first().copied()))
        .collect();
    let (Some(widths), Some(cache), Some(positions)) =
        (widths, dims(operands[K_CACHE]), dims(operands[K_CACHE + 2]))
    else {
        return false;
    };
    LinearRopeKv::views(&widths, &cache, &positions).is_some_and(|views| {
        (views.into_iter().zip([Q, K, V])).all(|(view, port)| dims(operands[port]) == Some(view))
    })
}

#[cfg(test)]
mod tests {
    use crate::graph::NodeKind;
    use crate::{fuse, DType, Graph, InputKind, Op, Shape, TensorType};

    fn ty(dtype: DType, dims: &[usize]) -> TensorType {
        TensorType::new(dtype, dims).unwrap()
    }

    /// One decode attention's front (B=2, T=1, K=16, Hq=4, Hkv=2, D=8): q/k/v as one linear
    /// (v biased), reshaped, rotated with q's and k's biases and written into the caches by a
    /// `RopeKvWrite`, read by a `CachedAttention`; `linear_q_bias` gives the linear a q bias,
    /// `rope_biases` the rotations theirs, `keep_q` also outputs q's view.
    fn front(linear_q_bias: bool, rope_biases: bool, keep_q: bool) -> Graph {
        let mut g = Graph::new("front");
        let mut input = |name: &str, kind, t| g.input(name, kind, t).unwrap();
        let x = input("x", InputKind::Input, ty(DType::BF16, &[2, 16]));
        let w: Vec<_> = [("wq", 32), ("wk", 16), ("wv", 16)]
            .map(|(name, n)| input(name, InputKind::Param, ty(DType::BF16, &[n, 16])))
            .to_vec();
        let bias = |g: &mut Graph, name: &str, n| {
            g.input(name, InputKind::Param, ty(DType::BF16, &[n]))
                .unwrap()
        };
        let (k_cache, v_cache) = (
            g.input("k_cache", InputKind::State, ty(DType::BF16, &[2, 2, 8, 8])),
            g.input("v_cache", InputKind::State, ty(DType::BF16, &[2, 2, 8, 8])),
        );
        let (k_cache, v_cache) = (k_cache.unwrap(), v_cache.unwrap());
        let positions = g.input("positions", InputKind::Input, ty(DType::I64, &[2]));
        let positions = positions.unwrap();
        let q_bias = bias(&mut g, "bq", 32);
        let v_bias = bias(&mut g, "bv", 16);
        let mut operands = vec![x, w[0], w[1], w[2]];
        operands.extend(linear_q_bias.then_some(q_bias));
        operands.push(v_bias);
        let linear = Op::Linear {
            biases: vec![linear_q_bias, false, true],
            swiglu: false,
            add_rmsnorm: None,
            rope_kv: None,
        };
        let ys = g.op(linear, &operands).unwrap();
        let view = |g: &mut Graph, value, dims: &[usize]| {
            let shape = Shape::new(dims);
            g.op1(Op::Reshape { shape }, &[value]).unwrap()
        };
        let q = view(&mut g, ys[0], &[2, 1, 4, 8]);
        let k = view(&mut g, ys[1], &[2, 1, 2, 8]);
        let v = view(&mut g, ys[2], &[2, 2, 1, 8]);
        let rope_positions = view(&mut g, positions, &[2, 1]);
        let mut rope_operands = vec![q, k, v, k_cache, v_cache, rope_positions, positions];
        if rope_biases {
            let k_bias = bias(&mut g, "bk", 16);
            rope_operands.extend([q_bias, k_bias]);
        }
        let rope = Op::RopeKvWrite {
            theta: 1e4,
            bias: rope_biases,
            staged: None,
        };
        let written = g.op(rope, &rope_operands).unwrap();
        let mut attention = written.clone();
        attention.push(positions);
        let out = g
            .op1(Op::CachedAttention { scale: 0.5 }, &attention)
            .unwrap();
        g.output("out", out).unwrap();
        g.write("k_cache", written[1]).unwrap();
        g.write("v_cache", written[2]).unwrap();
        if keep_q {
            g.output("q", q).unwrap();
        }
        g
    }

    fn ops(graph: &Graph) -> Vec<Op> {
        graph.ops().map(|(_, op)| op.clone()).collect()
    }

    #[test]
    fn the_rotation_and_cache_write_of_a_linears_results_become_its_epilogue() {
        let fused = fuse(&front(false, true, false)).unwrap();
        crate::verify(&fused).unwrap();
        let ops = ops(&fused);
        let linear = Op::Linear {
            biases: vec![true, true, true],
            swiglu: false,
            add_rmsnorm: None,
            rope_kv: Some(1e4),
        };
        let reshapes = ops.iter().filter(|op| matches!(op, Op::Reshape { .. }));
        assert_eq!(
            reshapes.count(),
            1,
            "only the rope positions' view: {ops:?}"
        );
        assert!(ops.contains(&linear), "{ops:?}");
        assert!(
            !ops.iter().any(|op| matches!(op, Op::RopeKvWrite { .. })),
            "{ops:?}"
        );
        // The linear's operands: x, the weights, q's and k's biases (the rotation's) and v's,
        // then the caches and indices.
        let node = (fused.node_indices())
            .find(|&n| matches!(&fused.node(n).unwrap().kind, NodeKind::Op(op) if *op == linear))
            .unwrap();
        let names: Vec<String> = (fused.operands(node).iter())
            .map(|v| match &fused.node(v.node).unwrap().kind {
                NodeKind::Input { name, .. } => name.clone(),
                NodeKind::Op(op) => op.name().to_string(),
            })
            .collect();
        let want = [
            "x",
            "wq",
            "wk",
            "wv",
            "bq",
            "bk",
            "bv",
            "k_cache",
            "v_cache",
            "reshape",
            "positions",
        ];
        assert_eq!(names, want);
    }

    #[test]
    fn two_q_biases_and_a_q_read_elsewhere_keep_the_ops_apart() {
        let fused = |linear_q_bias, rope_biases, keep_q| {
            let ops = ops(&fuse(&front(linear_q_bias, rope_biases, keep_q)).unwrap());
            let in_linear = (ops.iter()).any(|op| {
                matches!(
                    op,
                    Op::Linear {
                        rope_kv: Some(_),
                        ..
                    }
                )
            });
            let apart = ops.iter().any(|op| matches!(op, Op::RopeKvWrite { .. }));
            assert_ne!(in_linear, apart, "{ops:?}");
            in_linear
        };
        // Without the rotation's biases, the linear's own q bias fuses as it is.
        assert!(fused(true, false, false));
        // A q bias in the linear and another in the rotation: two adds, not one.
        assert!(!fused(true, true, false));
        // q's view also an output: q must exist, the ops stay apart.
        assert!(!fused(false, true, true));
    }
}
