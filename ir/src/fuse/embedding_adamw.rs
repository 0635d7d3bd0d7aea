//! The `embedding_adamw` rule (see the pass's module doc): an `AdamW` or `AdamWCopy` (no
//! gradient scale) whose gradient is an `EmbeddingBackward`'s table, read by that update alone,
//! is two [`Op::EmbeddingAdamW`]s on the scatter's operands, the unnamed rows' update and then
//! the named rows' on its results: the `[V,H]` gradient is never written and read again, and
//! the rows no id names are updated from the base (or zero) alone, as soon as the base exists.

use super::{only_read_by, op_of, takes, Fusion, Users};
use crate::{EmbeddingRows, Graph, Op, ValueId};

/// The rule at every update it matches: per update, the two fusions in their order.
pub(super) fn embedding_adamw_fusions(graph: &Graph, users: &Users) -> Vec<Fusion> {
    let mut fusions = Vec::new();
    for update in graph.node_indices() {
        let (config, copy) = match op_of(graph, update) {
            Some(&Op::AdamW(config)) => (config, false),
            Some(&Op::AdamWCopy(config)) => (config, true),
            _ => continue,
        };
        let operands = graph.operands(update);
        let step = 4 + usize::from(copy);
        if operands.len() != step + 2 {
            continue; // a scaled (clipped) gradient
        }
        let grad = operands[1];
        let Some(&Op::EmbeddingBackward { onto, .. }) = op_of(graph, grad.node) else {
            continue;
        };
        if !only_read_by(users, grad, update) {
            continue;
        }
        let op = |rows| Op::EmbeddingAdamW {
            config,
            onto,
            copy,
            rows,
        };
        // The update's results: the unnamed rows' update stands for them first, then the
        // named rows' update, which reads them.
        let ends: Vec<ValueId> = (0..3 + usize::from(copy))
            .map(|port| ValueId { node: update, port })
            .collect();
        // param, m, v[, copy], step, lr, then the scatter's ids[, grad][, base]: the unnamed
        // rows' update on the state, the named rows' on the unnamed rows' results.
        let [ids, scatter_grad] = graph.operands(grad.node)[..2] else {
            continue;
        };
        let base = graph.operands(grad.node).get(2).copied();
        let mut state: Vec<ValueId> = [0, 2, 3].iter().map(|&port| operands[port]).collect();
        state.extend(copy.then(|| operands[4]));
        let mut unnamed = state.clone();
        unnamed.extend(&operands[step..]);
        unnamed.push(ids);
        unnamed.extend(base);
        let mut named = ends.clone();
        named.extend(&operands[step..]);
        named.extend([ids, scatter_grad]);
        named.extend(base);
        // The unnamed rows' results have the state's types.
        let mut typed = state;
        typed.extend(&named[ends.len()..]);
        let ops = [
            (op(EmbeddingRows::Unnamed), unnamed),
            (op(EmbeddingRows::Named), named),
        ];
        if !takes(graph, &ops[0].0, &ops[0].1) || !takes(graph, &ops[1].0, &typed) {
            continue;
        }
        for (op, operands) in ops {
            fusions.push(Fusion {
                at: update,
                replaced: vec![grad.node, update],
                op,
                operands,
                ends: ends.clone(),
            });
        }
    }
    fusions
}

#[cfg(test)]
mod tests {
    use crate::fuse::ops_with_operands;
    use crate::graph::NodeKind;
    use crate::{
        fuse, AdamWConfig, DType, EmbeddingRows, Graph, InputKind, Op, TensorType, ValueId,
    };

    const CONFIG: AdamWConfig = AdamWConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };

    /// An embedding table's update from its scatter gradient: onto a bf16 base (a tied
    /// table) or not, writing a bf16 copy or not; `scaled` gives the update a gradient
    /// scale, `output` also outputs the gradient.
    fn update(onto: bool, copy: bool, scaled: bool, output: bool) -> Graph {
        let ty = |dtype, dims: &[usize]| TensorType::new(dtype, dims).unwrap();
        let mut g = Graph::new("update");
        let mut input = |name: &str, kind, t| g.input(name, kind, t).unwrap();
        let param = input("embed", InputKind::Param, ty(DType::F32, &[7, 4]));
        let m = input("embed.m", InputKind::State, ty(DType::F32, &[7, 4]));
        let v = input("embed.v", InputKind::State, ty(DType::F32, &[7, 4]));
        let copy_in = input("embed.bf16", InputKind::State, ty(DType::BF16, &[7, 4]));
        let step = input("step", InputKind::Input, ty(DType::I64, &[]));
        let lr = input("lr", InputKind::Input, ty(DType::F64, &[]));
        let scale = input("scale", InputKind::Input, ty(DType::F32, &[]));
        let ids = input("ids", InputKind::Input, ty(DType::I64, &[2, 3]));
        let grad = input("grad", InputKind::Input, ty(DType::F32, &[2, 3, 4]));
        let base = input("head", InputKind::Input, ty(DType::BF16, &[7, 4]));
        let mut scatter_operands = vec![ids, grad];
        if onto {
            scatter_operands.push(base);
        }
        let scatter = (g.op1(Op::EmbeddingBackward { vocab: 7, onto }, &scatter_operands)).unwrap();
        let mut operands = vec![param, scatter, m, v];
        if copy {
            operands.push(copy_in);
        }
        operands.extend([step, lr]);
        if scaled {
            operands.push(scale);
        }
        let op = match copy {
            true => Op::AdamWCopy(CONFIG),
            false => Op::AdamW(CONFIG),
        };
        let results = g.op(op, &operands).unwrap();
        for (name, result) in ["embed", "embed.m", "embed.v", "embed.bf16"]
            .iter()
            .zip(results)
        {
            g.write(name, result).unwrap();
        }
        if output {
            g.output("grad.embed", scatter).unwrap();
        }
        g
    }

    #[test]
    fn an_update_becomes_its_unnamed_then_its_named_rows_with_a_base_or_copy_or_not() {
        for onto in [false, true] {
            for copy in [false, true] {
                let fused = fuse(&update(onto, copy, false, false)).unwrap();
                crate::verify(&fused).unwrap();
                let ops = ops_with_operands(&fused);
                assert_eq!(ops.len(), 2, "{ops:?}");
                let op = |rows| Op::EmbeddingAdamW {
                    config: CONFIG,
                    onto,
                    copy,
                    rows,
                };
                assert_eq!(ops[0].0, op(EmbeddingRows::Unnamed));
                assert_eq!(ops[1].0, op(EmbeddingRows::Named));
                let name = |v: &ValueId| match &fused.node(v.node).unwrap().kind {
                    NodeKind::Input { name, .. } => name.clone(),
                    NodeKind::Op(op) => format!("{}.{}", op.name(), v.port),
                };
                let names =
                    |operands: &[ValueId]| -> Vec<String> { operands.iter().map(name).collect() };
                // param, m, v[, copy], step, lr, ids[, base]: the scatter's gradient unread.
                let mut want = vec!["embed", "embed.m", "embed.v"];
                want.extend(copy.then_some("embed.bf16"));
                want.extend(["step", "lr", "ids"]);
                want.extend(onto.then_some("head"));
                assert_eq!(names(&ops[0].1), want);
                // The first update's results, step, lr, ids, grad[, base].
                let state = 3 + usize::from(copy);
                let mut want: Vec<String> = (0..state)
                    .map(|port| format!("embedding_adamw.{port}"))
                    .collect();
                want.extend(["step", "lr", "ids", "grad"].map(String::from));
                want.extend(onto.then(|| "head".to_string()));
                assert_eq!(names(&ops[1].1), want);
                // The second update's results are written.
                let second = (fused.node_indices())
                    .filter(|&n| matches!(fused.node(n).unwrap().kind, NodeKind::Op(_)))
                    .nth(1);
                for (_, value) in fused.writes() {
                    assert_eq!(Some(value.node), second);
                }
            }
        }
    }

    #[test]
    fn a_scaled_update_or_a_gradient_read_elsewhere_stays_apart() {
        for (scaled, output) in [(true, false), (false, true)] {
            let fused = fuse(&update(true, true, scaled, output)).unwrap();
            let names: Vec<&str> = ops_with_operands(&fused)
                .iter()
                .map(|(op, _)| op.name())
                .collect();
            assert_eq!(
                names,
                ["embedding_backward", "adamw_copy"],
                "{scaled} {output}"
            );
        }
    }
}
