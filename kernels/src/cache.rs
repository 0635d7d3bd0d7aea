//! The KV cache of incremental decoding: writing new key/value rows into it, and causal GQA
//! attention of a block of queries over it.
//!
//! Layouts (all contiguous; the float operands of one call share f32 or f64 — `kv_cache_write`
//! also copies bf16 and f16 rows into a cache of their dtype; `positions` and `rows` are i32 or
//! i64):
//! - `cache`, `k_cache`, `v_cache` `[S,H,Smax,D]`: position `s` of cache row `c` and head `h`
//!   holds the key (or value) of that sequence's token at absolute position `s`;
//! - `new` `[B,H,T,D]`: the rows of `T` consecutive new tokens;
//! - `positions` `[B]`: the absolute position of the first new token of each batch row;
//! - `rows` `[B]` (optional): the cache row (slot) of each batch row in a pool of `S`, or
//!   [`PADDING_SLOT`] for a padding row, which reads and writes no cache row (its attention
//!   output is 0); without `rows` batch row `b` owns cache row `b` and `S = B`;
//! - `q` `[B,Hq,T,D]`, `probs` `[B,Hq,T,Smax]` (workspace, written), `out` `[B,T,Hq,D]`.
//!
//! ```text
//! kv_cache_write:    cache[c,h,positions[b]+t,:] = new[b,h,t,:]   c = rows[b] (or b);
//!                    every other cache row and position untouched
//! cached_attention:  query t of row b sits at p = positions[b] + t and attends positions
//!                    0..=p of cache row c, exactly as `attention` does with S = p + 1 − t keys
//! ```
//!
//! Invariants: every position must fit, `0 <= positions[b]` and `positions[b] + T <= Smax`,
//! and every slot must name a cache row, `0 <= rows[b] < S`, or be padding; otherwise the call is an
//! [`Error::IndexOutOfRange`] on that operand and writes nothing. The slots a write takes are
//! distinct (two batch rows writing one sequence is [`Error::Argument`]).
//!
//! `cached_attention` computes each query row with the very function `attention` uses
//! ([`attend_row`]), so with `positions[b] = S − T` over a cache whose first `S` rows are `k`
//! and `v`, its `out` equals `attention(q, k, v)`'s bit for bit, and its `probs` equal
//! attention's in the first `S` columns (the others are 0).

use crate::attention::attend_row;
use crate::dispatch_real;
use crate::element::{Element, Real};
use crate::error::{expect_rank, expect_shape, Error, Result};
use crate::indices::Indices;
use crate::view::{TensorView, TensorViewMut};
use half::{bf16, f16};
use kiln_ir::{DType, PADDING_SLOT};

/// Checks `positions` is an integer `[batch]` whose every entry leaves room for `block` rows
/// in a cache of `capacity` rows: `0 <= p` and `p + block <= capacity`.
fn check_positions<'a>(
    op: &'static str,
    positions: &TensorView<'a>,
    batch: usize,
    block: usize,
    capacity: usize,
) -> Result<Indices<'a>> {
    const OPERAND: &str = "positions";
    expect_shape(op, OPERAND, positions.shape(), &[batch])?;
    let starts = Indices::of(op, OPERAND, positions)?;
    // `p + block <= capacity` is `p < capacity - block + 1`; callers check block <= capacity
    // first, so this cannot underflow.
    starts.check_below(op, OPERAND, capacity - block + 1, None)?;
    Ok(starts)
}

fn dims4(op: &'static str, operand: &'static str, view: &TensorView<'_>) -> Result<[usize; 4]> {
    expect_rank(op, operand, view.shape(), 4)?;
    let mut dims = [0; 4];
    dims.copy_from_slice(view.shape().dims());
    Ok(dims)
}

/// The error for a block `[B,H,T,D]` of more rows than a cache of `capacity` rows holds.
fn block_too_long(
    op: &'static str,
    operand: &'static str,
    view: &TensorView<'_>,
    [b, h, _, d]: [usize; 4],
    capacity: usize,
) -> Error {
    Error::Shape {
        op,
        operand,
        expected: format!("[{b},{h},T,{d}] with T <= {capacity} cache rows"),
        got: view.shape().clone(),
    }
}

/// The cache row of each batch row: `rows[b]` of a pool of `slots` rows, checked to name one
/// or to be [`PADDING_SLOT`], or `b` itself without `rows` (then the cache must have one row
/// per batch row).
#[derive(Clone, Copy)]
enum Slots<'a> {
    Own,
    Pool(Indices<'a>),
}

impl<'a> Slots<'a> {
    fn check(
        op: &'static str,
        rows: Option<&TensorView<'a>>,
        batch: usize,
        slots: usize,
    ) -> Result<Self> {
        let Some(rows) = rows else {
            return Ok(Slots::Own);
        };
        expect_shape(op, "rows", rows.shape(), &[batch])?;
        let indices = Indices::of(op, "rows", rows)?;
        indices.check_below(op, "rows", slots, Some(PADDING_SLOT))?;
        Ok(Slots::Pool(indices))
    }

    /// The cache row of batch row `b` (checked in range by [`Slots::check`]); `None` for a
    /// padding row.
    fn of(&self, b: usize) -> Option<usize> {
        match self {
            Slots::Own => Some(b),
            Slots::Pool(rows) => usize::try_from(rows.get(b)).ok(),
        }
    }
}

/// Overwrites positions `positions[b]..positions[b] + T` of every head of batch row `b`'s
/// cache row (`rows[b]`, or `b` without `rows`) of `cache` `[S,H,Smax,D]` with `new`
/// `[B,H,T,D]`; everything else is left as it was. A position that is negative or leaves no
/// room for `T` rows, or a slot outside the pool, is [`Error::IndexOutOfRange`] on its
/// operand; two batch rows on one slot is [`Error::Argument`]; then nothing is written.
pub fn kv_cache_write(
    cache: &mut TensorViewMut<'_>,
    new: &TensorView<'_>,
    positions: &TensorView<'_>,
    rows: Option<&TensorView<'_>>,
) -> Result<()> {
    const OP: &str = "kv_cache_write";
    let [slots, heads, capacity, head_dim] = dims4(OP, "cache", &cache.as_view())?;
    let new_dims = dims4(OP, "new", new)?;
    let [batch, _, block, _] = new_dims;
    if block > capacity {
        return Err(block_too_long(OP, "new", new, new_dims, capacity));
    }
    expect_shape(OP, "new", new.shape(), &[batch, heads, block, head_dim])?;
    let positions = check_positions(OP, positions, batch, block, capacity)?;
    let slot = Slots::check(OP, rows, batch, slots)?;
    if rows.is_none() && batch != slots {
        let expected = format!("[{batch},{heads},{capacity},{head_dim}] (one row per batch row)");
        return Err(Error::Shape {
            op: OP,
            operand: "cache",
            expected,
            got: cache.shape().clone(),
        });
    }
    if let Some((first, second)) = repeated_slot(&slot, batch) {
        return Err(Error::Argument {
            op: OP,
            argument: "rows",
            reason: format!(
                "batch rows {first} and {second} both write slot {}",
                slot.of(first).unwrap_or_default()
            ),
        });
    }
    let layout = WriteLayout {
        heads,
        capacity,
        block,
        head_dim,
    };
    // A copy of rows: any float dtype (bf16 caches of inference too).
    match cache.dtype() {
        DType::BF16 => kv_cache_write_typed::<bf16>(layout, cache, new, (positions, slot)),
        DType::F16 => kv_cache_write_typed::<f16>(layout, cache, new, (positions, slot)),
        dtype => dispatch_real!(
            OP,
            dtype,
            kv_cache_write_typed(layout, cache, new, (positions, slot))
        ),
    }
}

/// Two batch rows that take the same slot (padding rows take none), if any.
fn repeated_slot(slot: &Slots<'_>, batch: usize) -> Option<(usize, usize)> {
    (0..batch).find_map(|b| {
        let taken = slot.of(b)?;
        (0..b).find(|&a| slot.of(a) == Some(taken)).map(|a| (a, b))
    })
}

/// The sizes of one cache write.
#[derive(Clone, Copy)]
struct WriteLayout {
    heads: usize,
    capacity: usize,
    block: usize,
    head_dim: usize,
}

fn kv_cache_write_typed<T: Element>(
    layout: WriteLayout,
    cache: &mut TensorViewMut<'_>,
    new: &TensorView<'_>,
    (positions, slot): (Indices<'_>, Slots<'_>),
) -> Result<()> {
    const OP: &str = "kv_cache_write";
    let new = new.slice::<T>(OP, "new")?;
    let cache = cache.slice_mut::<T>(OP, "cache")?;
    let WriteLayout {
        heads,
        capacity,
        block,
        head_dim,
    } = layout;
    let block_len = block * head_dim;
    for (b_h, new_block) in new.chunks_exact(block_len.max(1)).enumerate() {
        // Checked non-negative and in range by `check_positions`.
        let (b, h) = (b_h / heads, b_h % heads);
        let Some(row) = slot.of(b) else {
            continue;
        };
        let start = positions.get(b) as usize;
        let first = ((row * heads + h) * capacity + start) * head_dim;
        cache[first..first + block_len].copy_from_slice(new_block);
    }
    Ok(())
}

/// Causal GQA of `q` `[B,Hq,T,D]` over the cache `k_cache`, `v_cache` `[S,Hkv,Smax,D]`: query
/// `t` of row `b` sits at `p = positions[b] + t` and attends positions `0..=p` of its cache row
/// (`rows[b]`, or `b` without `rows`). Writes the
/// probabilities into the workspace `probs` `[B,Hq,T,Smax]` (0 past `p`) and the result into
/// `out` `[B,T,Hq,D]`. Same math, order and bits as [`attention`](crate::attention::attention)
/// (see the module doc).
pub fn cached_attention(
    q: &TensorView<'_>,
    k_cache: &TensorView<'_>,
    v_cache: &TensorView<'_>,
    (positions, rows): (&TensorView<'_>, Option<&TensorView<'_>>),
    scale: f64,
    probs: &mut TensorViewMut<'_>,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "cached_attention";
    let q_dims = dims4(OP, "q", q)?;
    let [batch, q_heads, q_len, head_dim] = q_dims;
    let [pool, kv_heads, capacity, _] = dims4(OP, "k_cache", k_cache)?;
    let slots = if rows.is_some() { pool } else { batch };
    if kv_heads == 0 || q_heads % kv_heads != 0 {
        return Err(Error::Shape {
            op: OP,
            operand: "k_cache",
            expected: format!(
                "[{slots},Hkv,Smax,{head_dim}] with Hkv >= 1 dividing the {q_heads} query heads"
            ),
            got: k_cache.shape().clone(),
        });
    }
    let cache_shape = [slots, kv_heads, capacity, head_dim];
    expect_shape(OP, "k_cache", k_cache.shape(), &cache_shape)?;
    expect_shape(OP, "v_cache", v_cache.shape(), &cache_shape)?;
    if q_len > capacity {
        return Err(block_too_long(OP, "q", q, q_dims, capacity));
    }
    let probs_shape = [batch, q_heads, q_len, capacity];
    expect_shape(OP, "probs", probs.shape(), &probs_shape)?;
    expect_shape(OP, "out", out.shape(), &[batch, q_len, q_heads, head_dim])?;
    let positions = check_positions(OP, positions, batch, q_len, capacity)?;
    let slot = Slots::check(OP, rows, batch, slots)?;
    let layout = AttendLayout {
        batch,
        q_heads,
        kv_heads,
        q_len,
        capacity,
        head_dim,
    };
    let caches = [k_cache, v_cache];
    dispatch_real!(
        OP,
        q.dtype(),
        cached_attention_typed(layout, q, caches, (positions, slot), scale, probs, out)
    )
}

/// The sizes of one cached attention call.
#[derive(Clone, Copy)]
struct AttendLayout {
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    q_len: usize,
    capacity: usize,
    head_dim: usize,
}

fn cached_attention_typed<T: Real>(
    layout: AttendLayout,
    q: &TensorView<'_>,
    [k_cache, v_cache]: [&TensorView<'_>; 2],
    (positions, slot): (Indices<'_>, Slots<'_>),
    scale: f64,
    probs: &mut TensorViewMut<'_>,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "cached_attention";
    let q = q.slice::<T>(OP, "q")?;
    let k = k_cache.slice::<T>(OP, "k_cache")?;
    let v = v_cache.slice::<T>(OP, "v_cache")?;
    let probs = probs.slice_mut::<T>(OP, "probs")?;
    let out = out.slice_mut::<T>(OP, "out")?;
    let scale = T::of(scale);
    let AttendLayout {
        batch,
        q_heads,
        kv_heads,
        q_len,
        capacity,
        head_dim,
    } = layout;
    let group = q_heads / kv_heads;

    for b in 0..batch {
        // Checked non-negative and in range by `check_positions`.
        let start = positions.get(b) as usize;
        let row = slot.of(b);
        for h in 0..q_heads {
            let kv_first = (row.unwrap_or(0) * kv_heads + h / group) * capacity * head_dim;
            let q_row0 = (b * q_heads + h) * q_len;
            for t in 0..q_len {
                let q_first = (q_row0 + t) * head_dim;
                let probs_first = (q_row0 + t) * capacity;
                let out_first = ((b * q_len + t) * q_heads + h) * head_dim;
                attend_row(
                    &q[q_first..q_first + head_dim],
                    &k[kv_first..],
                    &v[kv_first..],
                    scale,
                    // A padding row attends no keys: its probs and output are 0.
                    row.map_or(0, |_| start + t + 1),
                    &mut probs[probs_first..probs_first + capacity],
                    &mut out[out_first..out_first + head_dim],
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod pool_tests;
#[cfg(test)]
mod rejection_tests;
#[cfg(test)]
mod tests;
