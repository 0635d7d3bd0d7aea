//! Builders of `copy.cu`: strided → row-major copies (rank ≤ 6), also rounding f32 to bf16,
//! and f32 ↔ bf16 casts.

use super::launch::{all_aligned, grid_stride, size_arg};
use super::{Addr, Arg, Forms, Launch};
use crate::{Error, Result};

const MODULE: &str = "copy";

/// The largest rank the strided copy takes.
pub const MAX_COPY_RANK: usize = 6;

/// Copies the view `src` (first element at `src`, `dims` and element `strides`) into the
/// row-major `dst`; elements of `element_bytes` (2, 4 or 8), moved as bits. The view holds
/// some element.
pub fn strided_copy(
    dst: Addr,
    src: Addr,
    dims: &[usize],
    strides: &[usize],
    element_bytes: usize,
) -> Result<Launch> {
    let function = match element_bytes {
        2 => "strided_copy_b16",
        4 => "strided_copy_b32",
        8 => "strided_copy_b64",
        _ => {
            return Err(Error::Argument {
                op: "strided_copy",
                argument: "element_bytes",
                reason: format!("{element_bytes}-byte elements are not supported (2, 4 or 8)"),
            })
        }
    };
    strided(function, vec![Arg::Ptr(dst)], src, dims, strides)
}

/// [`strided_copy`] of an f32 view into a row-major f32 `dst`, a bf16 one (each element
/// rounded to nearest even as [`cast_f32_to_bf16`] rounds it), or both.
pub fn strided_copy_f32(
    dst: Forms,
    src: Addr,
    dims: &[usize],
    strides: &[usize],
) -> Result<Launch> {
    let (function, dst) = match (dst.f32, dst.rounded) {
        (Some(dst), None) => ("strided_copy_b32", vec![Arg::Ptr(dst)]),
        (None, Some(rounded)) => ("strided_round_f32_to_bf16", vec![Arg::Ptr(rounded)]),
        (Some(_), Some(_)) => ("strided_copy_f32_and_bf16", dst.args().to_vec()),
        (None, None) => {
            return Err(Error::Argument {
                op: "strided_copy_f32",
                argument: "dst",
                reason: "neither an f32 nor a bf16 destination".to_string(),
            })
        }
    };
    strided(function, dst, src, dims, strides)
}

/// A launch of the strided copy kernel `function` into `dst` (one pointer or two).
fn strided(
    function: &'static str,
    dst: Vec<Arg>,
    src: Addr,
    dims: &[usize],
    strides: &[usize],
) -> Result<Launch> {
    if dims.len() > MAX_COPY_RANK || strides.len() != dims.len() {
        return Err(Error::Argument {
            op: function,
            argument: "dims",
            reason: format!(
                "rank {} with {} strides; at most rank {MAX_COPY_RANK}",
                dims.len(),
                strides.len()
            ),
        });
    }
    // Pad at the front to rank 6 with dim 1, stride 0.
    let pad = MAX_COPY_RANK - dims.len();
    let padded_dims = std::iter::repeat_n(1, pad).chain(dims.iter().copied());
    let padded_strides = std::iter::repeat_n(0, pad).chain(strides.iter().copied());
    let n: u64 = dims.iter().map(|&d| d as u64).product();
    let mut args = dst;
    args.extend([Arg::Ptr(src), size_arg(n)]);
    args.extend(padded_dims.map(|d| size_arg(d as u64)));
    args.extend(padded_strides.map(|s| size_arg(s as u64)));
    Ok(grid_stride(MODULE, function, n, args))
}

/// `dst` (bf16) = `src` (f32) rounded to nearest even, `n > 0` elements.
pub fn cast_f32_to_bf16(dst: Addr, src: Addr, n: u64) -> Launch {
    // Four elements per thread where the count and the addresses allow it.
    let vector = n.is_multiple_of(4) && all_aligned(&[dst], 8) && all_aligned(&[src], 16);
    cast(
        dst,
        src,
        n,
        vector,
        ("cast_f32_to_bf16", "cast_f32_to_bf16_vec4"),
    )
}

/// `dst` (f32) = `src` (bf16), exact, `n > 0` elements.
pub fn cast_bf16_to_f32(dst: Addr, src: Addr, n: u64) -> Launch {
    let vector = n.is_multiple_of(4) && all_aligned(&[dst], 16) && all_aligned(&[src], 8);
    cast(
        dst,
        src,
        n,
        vector,
        ("cast_bf16_to_f32", "cast_bf16_to_f32_vec4"),
    )
}

/// A cast launch: the scalar kernel over `n` elements, or the vector one over `n / 4` groups.
fn cast(
    dst: Addr,
    src: Addr,
    n: u64,
    vector: bool,
    (scalar, vec4): (&'static str, &'static str),
) -> Launch {
    let (function, items) = if vector { (vec4, n / 4) } else { (scalar, n) };
    let args = vec![Arg::Ptr(dst), Arg::Ptr(src), size_arg(items)];
    grid_stride(MODULE, function, items, args)
}
