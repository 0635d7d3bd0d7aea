//! Test support (feature `testing`): random program graphs and plan options for property tests
//! of the planner.
//!
//! A [`GraphRecipe`] is a list of small random choices; [`GraphRecipe::build`] turns it into a
//! graph deterministically, so proptest shrinks the recipe and the failing graph shrinks with
//! it. Every choice is made to fit the type rules (a choice that cannot fit falls back to one
//! that does), so every recipe builds a graph that passes `kiln_ir::verify`. The graphs mix
//! what a planner must handle:
//! - sizes: inputs `f32[r, c]` with `r, c` in 1..=8; matmuls and reductions change sizes, bf16
//!   casts halve them;
//! - fan-in and fan-out: operands are drawn from every earlier value, so values are read by
//!   many ops or by none;
//! - views (Reshape), may-overwrite ops (Add, Mul, Scale), two-result ops (AddRmsNorm), ops
//!   with a workspace (bf16 MatMul);
//! - outputs drawn from every value (inputs and views included, some twice) and writes of
//!   params and states.

use kiln_ir::{DType, Graph, InputKind, Op, Result, Shape, TensorType, ValueId};
use proptest::prelude::*;

use crate::PlanOptions;

/// Kinds of op step a recipe can draw (see [`GraphRecipe::build`]).
const OP_KINDS: u8 = 9;

/// The random choices one graph is built from.
#[derive(Clone, Debug)]
pub struct GraphRecipe {
    /// Per input: kind (0 param, 1 input, 2 state), rows, columns.
    pub inputs: Vec<(u8, usize, usize)>,
    /// Per op step: kind, and two picks among the values so far.
    pub ops: Vec<(u8, u16, u16)>,
    /// Picks among all values, each named as an output.
    pub outputs: Vec<u16>,
    /// Per persistent input, in order: a pick among op results to write it with, if any.
    pub writes: Vec<Option<u16>>,
}

/// Random recipes: 1..=4 inputs, 1..=24 op steps, 1..=3 outputs.
pub fn recipes() -> impl Strategy<Value = GraphRecipe> {
    let input = (0..3u8, 1..=8usize, 1..=8usize);
    let op = (0..OP_KINDS, any::<u16>(), any::<u16>());
    (
        prop::collection::vec(input, 1..=4),
        prop::collection::vec(op, 1..=24),
        prop::collection::vec(any::<u16>(), 1..=3),
        prop::collection::vec(prop::option::of(any::<u16>()), 0..=4),
    )
        .prop_map(|(inputs, ops, outputs, writes)| GraphRecipe {
            inputs,
            ops,
            outputs,
            writes,
        })
}

/// Random graphs built from [`recipes`].
pub fn graphs() -> impl Strategy<Value = Graph> {
    // Every recipe builds (module doc); a failure here is a bug of this generator.
    recipes().prop_map(|recipe| recipe.build().expect("recipes build well-typed graphs"))
}

/// Random plan options: 1..=3 streams, alignment 1, 16 or 256 bytes.
pub fn plan_options() -> impl Strategy<Value = PlanOptions> {
    (1..=3usize, prop::sample::select(vec![1u64, 16, 256]))
        .prop_map(|(streams, alignment)| PlanOptions { streams, alignment })
}

/// A graph under construction and its values, in the order they were made.
struct Builder {
    graph: Graph,
    values: Vec<ValueId>,
}

impl Builder {
    fn ty(&self, value: ValueId) -> Result<TensorType> {
        self.graph.value_type(value).cloned()
    }

    /// The value `pick` lands on (there is always at least one input to land on).
    fn pick(&self, pick: u16) -> ValueId {
        self.values[usize::from(pick) % self.values.len()]
    }

    /// The first value from `pick` on (cyclically) that `fits`, or `fallback`.
    fn find(&self, pick: u16, fallback: ValueId, fits: impl Fn(&TensorType) -> bool) -> ValueId {
        let n = self.values.len();
        (0..n)
            .map(|i| self.values[(usize::from(pick) + i) % n])
            .find(|v| self.graph.value_type(*v).is_ok_and(&fits))
            .unwrap_or(fallback)
    }

    /// Adds `op` and remembers its results.
    fn op(&mut self, op: Op, operands: &[ValueId]) -> Result<Vec<ValueId>> {
        let results = self.graph.op(op, operands)?;
        self.values.extend(&results);
        Ok(results)
    }

    fn op1(&mut self, op: Op, operands: &[ValueId]) -> Result<ValueId> {
        Ok(self.op(op, operands)?[0])
    }

    /// `value` if it is `[m, k]`, else a view of it as `[1, numel]`.
    fn matrix(&mut self, value: ValueId) -> Result<ValueId> {
        let ty = self.ty(value)?;
        if ty.dims().len() == 2 {
            return Ok(value);
        }
        let shape = Shape::new(&[1, ty.shape.numel()]);
        self.op1(Op::Reshape { shape }, &[value])
    }

    /// A value of shape `[h]`: an existing one from `pick` on, else a reduction of `of`.
    fn vector(&mut self, pick: u16, of: ValueId, h: usize) -> Result<ValueId> {
        let want = TensorType::new(DType::F32, [h])?;
        let found = self.find(pick, of, |t| *t == want);
        if found != of {
            return Ok(found);
        }
        self.op1(
            Op::SumToShape {
                shape: Shape::new(&[h]),
            },
            &[of],
        )
    }
}

fn is_suffix(short: &[usize], long: &[usize]) -> bool {
    short.len() <= long.len() && long[long.len() - short.len()..] == *short
}

impl GraphRecipe {
    /// The graph: inputs, then one op step per `ops` entry, then outputs and writes. Values
    /// are all f32 except the bf16 casts feeding a matmul.
    pub fn build(&self) -> Result<Graph> {
        let mut b = Builder {
            graph: Graph::new("random"),
            values: Vec::new(),
        };
        let mut persistent = Vec::new();
        // Ops draw operands from earlier values, so there is always at least one input.
        let inputs: &[(u8, usize, usize)] = match &self.inputs[..] {
            [] => &[(1, 1, 1)],
            inputs => inputs,
        };
        for (i, &(kind, rows, cols)) in inputs.iter().enumerate() {
            let kind =
                [InputKind::Param, InputKind::Input, InputKind::State][usize::from(kind % 3)];
            let name = format!("{}{i}", kind.name());
            let value = b
                .graph
                .input(&name, kind, TensorType::new(DType::F32, [rows, cols])?)?;
            b.values.push(value);
            if kind.is_persistent() {
                persistent.push((name, value));
            }
        }
        let first_result = b.values.len();
        for &(kind, first, second) in &self.ops {
            // Operands are drawn among f32 values (bf16 casts only feed their matmul).
            let a = b.find(first, b.values[0], |t| t.dtype == DType::F32);
            let ta = b.ty(a)?;
            match kind % OP_KINDS {
                0 => drop(b.op1(Op::Scale { alpha: 0.5 }, &[a])?),
                1 | 2 => {
                    // Fan-in: a second operand whose shape is a suffix of the first's.
                    let other = b.find(second, a, |t| {
                        t.dtype == DType::F32 && is_suffix(t.dims(), ta.dims())
                    });
                    let op = if kind % OP_KINDS == 1 {
                        Op::Add
                    } else {
                        Op::Mul
                    };
                    b.op1(op, &[a, other])?;
                }
                3 => drop(b.op1(Op::Softmax, &[a])?),
                4 | 5 => {
                    // a [m, k] times another [n, k] transposed: [m, n].
                    let a = b.matrix(a)?;
                    let k = b.ty(a)?.dims()[1];
                    let other = b.find(second, a, |t| {
                        t.dtype == DType::F32 && t.dims().len() == 2 && t.dims()[1] == k
                    });
                    let (mut x, mut y) = (a, other);
                    if kind % OP_KINDS == 5 {
                        // bf16 operands: the matmul needs a workspace to widen them.
                        x = b.op1(Op::Cast { to: DType::BF16 }, &[x])?;
                        y = b.op1(Op::Cast { to: DType::BF16 }, &[y])?;
                    }
                    let matmul = Op::MatMul {
                        transpose_a: false,
                        transpose_b: true,
                    };
                    b.op1(matmul, &[x, y])?;
                }
                6 => {
                    // A view: [r, c] as [c, r] or [r·c]; [n] as [1, n] or [n, 1].
                    let dims = ta.dims();
                    let shape = match (dims, second % 2) {
                        (&[r, c], 0) => vec![c, r],
                        (&[r, c], _) => vec![r * c],
                        (&[n], 0) => vec![1, n],
                        _ => vec![ta.shape.numel(), 1],
                    };
                    b.op1(
                        Op::Reshape {
                            shape: Shape::new(&shape),
                        },
                        &[a],
                    )?;
                }
                7 => {
                    // A reduction to the last dim: a smaller value.
                    let h = ta.dims().last().copied().unwrap_or(1);
                    b.op1(
                        Op::SumToShape {
                            shape: Shape::new(&[h]),
                        },
                        &[a],
                    )?;
                }
                _ => {
                    // Two results: (a + residual, rmsnorm(a + residual)).
                    let residual = b.find(second, a, |t| *t == ta);
                    let h = ta.dims().last().copied().unwrap_or(1);
                    let weight = b.vector(second.wrapping_add(1), a, h)?;
                    b.op(Op::AddRmsNorm { eps: 1e-5 }, &[a, residual, weight])?;
                }
            }
        }
        for (i, &pick) in self.outputs.iter().enumerate() {
            let value = b.pick(pick);
            b.graph.output(&format!("out{i}"), value)?;
        }
        let results = &b.values[first_result..];
        for ((name, input), pick) in persistent.iter().zip(&self.writes) {
            let (Some(pick), ty) = (pick, b.ty(*input)?) else {
                continue;
            };
            // Only an op result of the input's own type can be written to it.
            let n = results.len();
            let found = (0..n)
                .map(|i| results[(usize::from(*pick) + i) % n])
                .find(|v| b.graph.value_type(*v).is_ok_and(|t| *t == ty));
            if let Some(value) = found {
                b.graph.write(name, value)?;
            }
        }
        Ok(b.graph)
    }
}

/// A backend's scratch needs for the planner's own tests: simple rules of the same shape as
/// real kernels' (a row of scratch per row of a norm or loss, widened bf16 GEMM operands, a
/// probs-sized buffer for attention), with no device in them.
pub struct TestWorkspaces;

impl crate::WorkspaceNeeds for TestWorkspaces {
    fn workspace_bytes(&self, op: &Op, operands: &[TensorType]) -> u64 {
        let dims = |port: usize| operands.get(port).map_or(&[][..], |t| t.dims());
        let size = operands.first().map_or(0, |t| t.dtype.size_bytes()) as u64;
        let product = |dims: &[usize]| dims.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64));
        let rows = |port: usize| match dims(port).split_last() {
            Some((_, rest)) => product(rest),
            None => 0,
        };
        let bytes = match op {
            Op::MatMul { .. } if operands.first().map(|t| t.dtype) == Some(DType::BF16) => {
                (operands.iter().take(2))
                    .fold(0u64, |sum, t| sum.saturating_add(product(t.dims()) * 4))
            }
            Op::RmsNormBackward { .. }
            | Op::AddRmsNormBackward { .. }
            | Op::CrossEntropy { .. } => rows(0).saturating_mul(size),
            Op::AttentionBackward { .. } | Op::CachedAttention { .. } => match (dims(0), dims(1)) {
                (&[b, hq, t, _], &[_, _, s, _]) => product(&[b, hq, t, s]).saturating_mul(size),
                _ => 0,
            },
            _ => 0,
        };
        bytes
    }
}
