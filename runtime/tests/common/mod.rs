//! Helpers shared by the interpreter tests: random tensors, bit patterns, one-op graphs.

#![allow(dead_code)] // each test binary uses its own subset

use std::collections::BTreeMap;

use kiln_ir::{DType, Graph, InputKind, Op, TensorType, ValueId};
use kiln_kernels::testing;
use kiln_kernels::{TensorView, TensorViewMut};
use kiln_runtime::{interpret, Tensor};
use rand::rngs::StdRng;

/// A bf16 tensor: `random_f32`'s values rounded.
pub fn random_bf16(rng: &mut StdRng, dims: &[usize]) -> Tensor {
    let (_, values) = random_f32(rng, dims);
    let rounded: Vec<half::bf16> = values.iter().map(|&v| half::bf16::from_f32(v)).collect();
    Tensor::from_vec(rounded, kiln_ir::Shape::new(dims)).unwrap()
}

/// The IR text of each op of `graph`, in node order (`Op`'s `Display`: name and attributes).
pub fn op_texts(graph: &Graph) -> Vec<String> {
    (graph.ops()).map(|(_, op)| op.to_string()).collect()
}

/// An f32 tensor of uniform values in `[-1, 1)`, and the same values as a plain vector.
pub fn random_f32(rng: &mut StdRng, dims: &[usize]) -> (Tensor, Vec<f32>) {
    let values = testing::to_f32(&testing::signed(rng, dims.iter().product()));
    (Tensor::from_vec(values.clone(), dims).unwrap(), values)
}

/// An i64 tensor of integers in `0..bound`, and the same values as a plain vector.
pub fn random_ids(rng: &mut StdRng, dims: &[usize], bound: usize) -> (Tensor, Vec<i64>) {
    let values = testing::indices(rng, dims.iter().product(), bound);
    (Tensor::from_vec(values.clone(), dims).unwrap(), values)
}

/// The bit patterns of a tensor's elements (any float dtype widens to f64 exactly).
pub fn bits(tensor: &Tensor) -> Vec<u64> {
    tensor
        .to_f64_vec()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// The bit patterns of plain f32 values, as [`bits`] gives them.
pub fn f32_bits(values: &[f32]) -> Vec<u64> {
    values.iter().map(|&x| f64::from(x).to_bits()).collect()
}

/// The IR type of a tensor.
pub fn type_of(tensor: &Tensor) -> TensorType {
    TensorType::new(tensor.dtype(), tensor.shape().clone()).unwrap()
}

/// A graph of one `op` over per-run inputs named `x0`, `x1`, ... (typed like `operands`),
/// with results named `r0`, `r1`, ...; runs it and returns the results in order.
pub fn run_one(op: Op, operands: &[&Tensor]) -> kiln_runtime::Result<Vec<Tensor>> {
    let mut graph = Graph::new("one_op");
    let mut values = BTreeMap::new();
    let mut ids = Vec::new();
    for (i, tensor) in operands.iter().enumerate() {
        let name = format!("x{i}");
        ids.push(
            graph
                .input(&name, InputKind::Input, type_of(tensor))
                .unwrap(),
        );
        values.insert(name, (*tensor).clone());
    }
    let results = graph.op(op, &ids).unwrap();
    for (i, &result) in results.iter().enumerate() {
        graph.output(&format!("r{i}"), result).unwrap();
    }
    let mut outputs = interpret(&graph, &mut values)?;
    Ok((0..results.len())
        .map(|i| outputs.remove(&format!("r{i}")).unwrap())
        .collect())
}

/// A fresh f32 or f64 tensor of zeros for a kernel to write.
pub fn zeros(dims: &[usize], dtype: DType) -> Tensor {
    Tensor::zeros(dims, dtype, kiln_runtime::Device::Cpu)
}

pub fn view<'a>(data: &'a [f32], dims: &[usize]) -> TensorView<'a> {
    TensorView::contiguous(data, dims).unwrap()
}

pub fn view_mut<'a>(data: &'a mut [f32], dims: &[usize]) -> TensorViewMut<'a> {
    TensorViewMut::contiguous(data, dims).unwrap()
}

/// Declares `tensor` as graph input `name` of `kind` and binds it in `values`.
pub fn bind(
    graph: &mut Graph,
    values: &mut BTreeMap<String, Tensor>,
    name: &str,
    kind: InputKind,
    tensor: &Tensor,
) -> ValueId {
    values.insert(name.to_string(), tensor.clone());
    graph.input(name, kind, type_of(tensor)).unwrap()
}
