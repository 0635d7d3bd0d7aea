//! The `add_rmsnorm` rule (see the pass's module doc): the residual add and RMSNorm after a
//! one-group linear become the linear's epilogue.

use super::{op_of, Fusion, Users};
use crate::{Graph, Op, ValueId};

/// The `add_rmsnorm` rule: a one-group `Linear` whose result (or a reshape of it) is read by
/// an `AddRmsNorm` as its `x` and by nothing else takes that norm as its epilogue, emitted
/// where the norm was (after its residual and weight).
pub(super) fn with_add_rmsnorm(graph: &Graph, users: &Users, mut fusion: Fusion) -> Fusion {
    let (
        Op::Linear {
            biases,
            swiglu: false,
            ..
        },
        [end],
    ) = (&fusion.op, &fusion.ends[..])
    else {
        return fusion;
    };
    let Some([Some(reader)]) = users.get(end).map(Vec::as_slice) else {
        return fusion;
    };
    let (view, norm) = match op_of(graph, *reader) {
        Some(Op::Reshape { .. }) => match users.get(&ValueId {
            node: *reader,
            port: 0,
        }) {
            Some(readers) if readers.len() == 1 => (Some(*reader), readers[0]),
            _ => return fusion,
        },
        _ => (None, Some(*reader)),
    };
    let Some(norm) = norm else {
        return fusion;
    };
    let (Some(&Op::AddRmsNorm { eps }), [x, residual, weight]) =
        (op_of(graph, norm), &graph.operands(norm)[..])
    else {
        return fusion;
    };
    let y = view.map_or(*end, |node| ValueId { node, port: 0 });
    if *x != y || biases.len() != 1 {
        return fusion;
    }
    fusion.op = Op::Linear {
        biases: biases.clone(),
        swiglu: false,
        add_rmsnorm: Some(eps),
        rope_kv: None,
    };
    fusion.at = norm;
    fusion.operands.extend([*residual, *weight]);
    fusion.replaced.extend(view.into_iter().chain([norm]));
    fusion.ends = (0..2).map(|port| ValueId { node: norm, port }).collect();
    fusion
}
