//! Builders of `elementwise.cu`: f32 add (of f32 or bf16 terms), mul, scale, sum_to_shape,
//! broadcast_to, swiglu. Counts are in elements; every launch is correct in place (`out == a`
//! of the same dtype).

use super::launch::{all_aligned, grid_stride, size_arg};
use super::{Addr, Arg, Launch, Stored};
use crate::Result;

const MODULE: &str = "elementwise";

fn items(function: &'static str, items: u64, args: Vec<Arg>) -> Launch {
    grid_stride(MODULE, function, items, args)
}

/// Whether four floats at a time fit every pointer and count.
fn vec4(addresses: &[Addr], counts: &[u64]) -> bool {
    all_aligned(addresses, 16) && counts.iter().all(|c| c % 4 == 0)
}

/// `out[i] = a[i] ⊕ b[i % b_len]` for `n > 0` elements, `b_len` dividing `n`.
fn binary(
    scalar: &'static str,
    vector: &'static str,
    out: Addr,
    a: Addr,
    b: Addr,
    n: u64,
    b_len: u64,
) -> Launch {
    if vec4(&[out, a, b], &[n, b_len]) {
        let args = vec![Arg::Ptr(out), Arg::Ptr(a), Arg::Ptr(b)];
        let args = [args, vec![size_arg(n / 4), size_arg(b_len / 4)]].concat();
        items(vector, n / 4, args)
    } else {
        let args = vec![Arg::Ptr(out), Arg::Ptr(a), Arg::Ptr(b)];
        let args = [args, vec![size_arg(n), size_arg(b_len)]].concat();
        items(scalar, n, args)
    }
}

/// `out = a + b[i % b_len]` (b's shape a suffix of a's), `n > 0` elements, each term f32 or
/// stored in bf16 (a bias, or a rounded gradient; widened); four at a time when the counts
/// allow and every pointer is aligned to its vector. A bf16 `a` is never `out`.
pub fn add(
    out: Addr,
    (a, a_stored): (Addr, Stored),
    (b, b_stored): (Addr, Stored),
    n: u64,
    b_len: u64,
) -> Launch {
    let (scalar, vector) = match (a_stored, b_stored) {
        (Stored::F32, Stored::F32) => ("add_f32", "add_f32_vec4"),
        (Stored::F32, Stored::BF16) => ("add_f32_bf16", "add_f32_bf16_vec4"),
        (Stored::BF16, Stored::BF16) => ("add_bf16_bf16", "add_bf16_bf16_vec4"),
        (Stored::BF16, Stored::F32) => ("add_bf16_f32", "add_bf16_f32_vec4"),
    };
    let args = vec![Arg::Ptr(out), Arg::Ptr(a), Arg::Ptr(b)];
    let aligned = all_aligned(&[out], 16)
        && all_aligned(&[a], a_stored.vector_bytes())
        && all_aligned(&[b], b_stored.vector_bytes());
    if aligned && n.is_multiple_of(4) && b_len.is_multiple_of(4) {
        let args = [args, vec![size_arg(n / 4), size_arg(b_len / 4)]].concat();
        items(vector, n / 4, args)
    } else {
        let args = [args, vec![size_arg(n), size_arg(b_len)]].concat();
        items(scalar, n, args)
    }
}

/// `out = a · b[i % b_len]`, `n > 0` elements.
pub fn mul_f32(out: Addr, a: Addr, b: Addr, n: u64, b_len: u64) -> Launch {
    binary("mul_f32", "mul_f32_vec4", out, a, b, n, b_len)
}

/// `out = alpha · a`, with `alpha` already rounded to f32 as the CPU does.
pub fn scale_f32(out: Addr, a: Addr, alpha: f32, n: u64) -> Launch {
    if vec4(&[out, a], &[n]) {
        let args = vec![Arg::Ptr(out), Arg::Ptr(a), Arg::F32(alpha), size_arg(n / 4)];
        items("scale_f32_vec4", n / 4, args)
    } else {
        let args = vec![Arg::Ptr(out), Arg::Ptr(a), Arg::F32(alpha), size_arg(n)];
        items("scale_f32", n, args)
    }
}

/// `out[j] = Σ_i src[i, j]` for `src [rows, cols]`, `cols > 0` (`rows` may be 0), split over
/// chunks of rows with the partials in `workspace` (of
/// [`columns::partials_bytes`](super::columns::partials_bytes)).
pub fn sum_to_shape_f32(
    out: Addr,
    src: Addr,
    [rows, cols]: [u64; 2],
    workspace: Addr,
) -> Result<Vec<Launch>> {
    let function = (MODULE, "sum_to_shape_f32");
    super::columns::column_sums(function, out, vec![Arg::Ptr(src)], [rows, cols], workspace)
}

/// `out[i] = src[i % src_len]`, `n > 0` elements.
pub fn broadcast_to_f32(out: Addr, src: Addr, n: u64, src_len: u64) -> Launch {
    let args = vec![Arg::Ptr(out), Arg::Ptr(src), size_arg(n), size_arg(src_len)];
    items("broadcast_to_f32", n, args)
}

/// `swiglu`'s entry points, indexed by [`Stored::bit`] of (gate and up, out) and the vector
/// access: `swiglu_f32[_bf16_in][_bf16_out][_vec4]`.
const SWIGLU: [&str; 8] = [
    "swiglu_f32",
    "swiglu_f32_vec4",
    "swiglu_f32_bf16_out",
    "swiglu_f32_bf16_out_vec4",
    "swiglu_f32_bf16_in",
    "swiglu_f32_bf16_in_vec4",
    "swiglu_f32_bf16_in_bf16_out",
    "swiglu_f32_bf16_in_bf16_out_vec4",
];

/// `swiglu_backward`'s entry points, indexed as [`SWIGLU`] by (gate and up, incoming gradient,
/// results) and the vector access: `swiglu_backward_f32[_bf16_in][_bf16_grad][_bf16_out][_vec4]`.
const SWIGLU_BACKWARD: [&str; 16] = [
    "swiglu_backward_f32",
    "swiglu_backward_f32_vec4",
    "swiglu_backward_f32_bf16_out",
    "swiglu_backward_f32_bf16_out_vec4",
    "swiglu_backward_f32_bf16_grad",
    "swiglu_backward_f32_bf16_grad_vec4",
    "swiglu_backward_f32_bf16_grad_bf16_out",
    "swiglu_backward_f32_bf16_grad_bf16_out_vec4",
    "swiglu_backward_f32_bf16_in",
    "swiglu_backward_f32_bf16_in_vec4",
    "swiglu_backward_f32_bf16_in_bf16_out",
    "swiglu_backward_f32_bf16_in_bf16_out_vec4",
    "swiglu_backward_f32_bf16_in_bf16_grad",
    "swiglu_backward_f32_bf16_in_bf16_grad_vec4",
    "swiglu_backward_f32_bf16_in_bf16_grad_bf16_out",
    "swiglu_backward_f32_bf16_in_bf16_grad_bf16_out_vec4",
];

/// The entry point of `table` for stored dtypes `stored` (most significant first) and the
/// vector access.
fn entry(table: &[&'static str], stored: &[Stored], vector: bool) -> &'static str {
    let index = (stored.iter()).fold(0, |index, s| index * 2 + s.bit()) * 2 + usize::from(vector);
    table[index]
}

/// `out = silu(gate) * up` for `n > 0` elements, computed in f32: `gate` and `up` f32, or bf16
/// widened as read (`in_stored`: rounded GEMM products); `out` f32, or bf16 rounded as written
/// (`out_stored`). Four elements per access when `n` is a multiple of 4 and every pointer is
/// aligned to its vector.
pub fn swiglu(
    (out, out_stored): (Addr, Stored),
    ([gate, up], in_stored): ([Addr; 2], Stored),
    n: u64,
) -> Launch {
    let vector = n.is_multiple_of(4)
        && all_aligned(&[gate, up], in_stored.vector_bytes())
        && all_aligned(&[out], out_stored.vector_bytes());
    let function = entry(&SWIGLU, &[in_stored, out_stored], vector);
    let count = if vector { n / 4 } else { n };
    let args = vec![Arg::Ptr(out), Arg::Ptr(gate), Arg::Ptr(up), size_arg(count)];
    items(function, count, args)
}

/// Gradients of swiglu for `n > 0` elements: `grad_gate` and `grad_up` f32, or bf16 rounded as
/// written (`out_stored`), from `gate` and `up` (f32, or bf16 widened as read: `in_stored`) and
/// `grad_out` (f32, or bf16 widened as read). Four elements per access when `n` is a multiple
/// of 4 and every pointer is aligned to its vector.
pub fn swiglu_backward(
    ([grad_gate, grad_up], out_stored): ([Addr; 2], Stored),
    ([gate, up], in_stored): ([Addr; 2], Stored),
    (grad_out, grad_stored): (Addr, Stored),
    n: u64,
) -> Launch {
    let vector = n.is_multiple_of(4)
        && all_aligned(&[gate, up], in_stored.vector_bytes())
        && all_aligned(&[grad_gate, grad_up], out_stored.vector_bytes())
        && all_aligned(&[grad_out], grad_stored.vector_bytes());
    let function = entry(
        &SWIGLU_BACKWARD,
        &[in_stored, grad_stored, out_stored],
        vector,
    );
    let count = if vector { n / 4 } else { n };
    let args = vec![
        Arg::Ptr(grad_gate),
        Arg::Ptr(grad_up),
        Arg::Ptr(gate),
        Arg::Ptr(up),
        Arg::Ptr(grad_out),
        size_arg(count),
    ];
    items(function, count, args)
}
