//! Builders of `embedding.cu`: the gather, the deterministic scatter-add backward (zero the
//! table, or copy a base onto which it adds, then the first token of each id writes that id's
//! row, summed in token order), and AdamW of a table from that scatter, which is never written.

use super::launch::{all_aligned, block_per, grid_stride, size_arg};
use super::optim::{update_launch, AdamWHyper};
use super::{Addr, Arg, Launch, Stored};
use crate::{Error, Result};
use kiln_ir::EmbeddingRows;

const MODULE: &str = "embedding";

/// `out [N,H] = weight [V,H] rows ids [N]` (i64), one block per token (`tokens > 0`); an id
/// outside `0..V` raises the `fault` word.
pub fn embedding_f32(
    out: Addr,
    (weight, stored): (Addr, Stored),
    ids: Addr,
    [tokens, hidden, vocab]: [u64; 3],
    fault: Addr,
) -> Result<Launch> {
    let args = vec![
        Arg::Ptr(out),
        Arg::Ptr(weight),
        Arg::Ptr(ids),
        size_arg(tokens),
        size_arg(hidden),
        size_arg(vocab),
        Arg::Ptr(fault),
    ];
    let function = stored.pick("embedding_f32", "embedding_bf16");
    block_per(MODULE, function, "tokens", tokens, args)
}

/// `out[0..n] = 0` (f32; `n > 0`).
pub fn zero_f32(out: Addr, n: u64) -> Launch {
    let args = vec![Arg::Ptr(out), size_arg(n)];
    grid_stride(MODULE, "zero_f32", n, args)
}

/// `out[0..n] = 0` (bf16; `n > 0`).
pub fn zero_bf16(out: Addr, n: u64) -> Launch {
    let args = vec![Arg::Ptr(out), size_arg(n)];
    grid_stride(MODULE, "zero_bf16", n, args)
}

/// `out[0..n] = 0 + base[0..n]` (`out` f32, `base` f32 or bf16 widened; `n > 0`): the table
/// before [`embedding_backward_f32`] onto a base.
pub fn embedding_base_f32(out: Addr, (base, stored): (Addr, Stored), n: u64) -> Launch {
    let args = vec![Arg::Ptr(out), Arg::Ptr(base), size_arg(n)];
    let function = stored.pick("embedding_base_f32", "embedding_base_bf16");
    grid_stride(MODULE, function, n, args)
}

/// The rows named by `ids` of `grad_weight [V,H]` (`tokens > 0`), after [`zero_f32`], or after
/// [`embedding_base_f32`] onto `base` (`[V,H]`, f32 or bf16), whose row each sum then has
/// added; an id outside `0..V` raises the `fault` word.
pub fn embedding_backward_f32(
    grad_weight: Addr,
    ids: Addr,
    grad_out: Addr,
    base: Option<(Addr, Stored)>,
    [tokens, hidden, vocab]: [u64; 3],
    fault: Addr,
) -> Result<Launch> {
    // Without a base the kernel never reads its pointer; pass a valid one all the same.
    let (base_addr, stored) = base.unwrap_or((grad_out, Stored::F32));
    let args = vec![
        Arg::Ptr(grad_weight),
        Arg::Ptr(ids),
        Arg::Ptr(grad_out),
        Arg::Ptr(base_addr),
        Arg::I32(i32::from(base.is_some())),
        size_arg(tokens),
        size_arg(hidden),
        size_arg(vocab),
        Arg::Ptr(fault),
    ];
    let function = stored.pick("embedding_backward_f32", "embedding_backward_f32_bf16_base");
    block_per(MODULE, function, "tokens", tokens, args)
}

/// Tokens an owner scans at once (`KILN_EMBED_WINDOW`); past it, the named rows' update keeps
/// the owners' partial sums in its workspace.
const WINDOW: u64 = 4096;

/// The bytes of [`embedding_adamw`]'s workspace for `rows` and `[tokens, hidden, vocab]`: the
/// unnamed rows' bitmap of named rows (a bit a row, in 16-byte units); past [`WINDOW`] tokens,
/// the named rows' partial sums `[tokens, hidden]` f32.
pub fn embedding_adamw_workspace_bytes(
    rows: EmbeddingRows,
    [tokens, hidden, vocab]: [u64; 3],
) -> u64 {
    match rows {
        EmbeddingRows::Unnamed => vocab.div_ceil(128).saturating_mul(16),
        EmbeddingRows::Named if tokens > WINDOW => tokens.saturating_mul(hidden).saturating_mul(4),
        EmbeddingRows::Named => 0,
    }
}

/// The device tensors of [`embedding_adamw`]: the table `param` [V,H] and its `m`, `v` (f32),
/// updated in place, its bf16 `copy` when given; the `step` and `lr` scalars; the scatter's
/// `ids`, its `grad_out` (f32; the named rows' update alone reads it) and its `base` (f32 or
/// bf16) when it goes onto one; and the [`embedding_adamw_workspace_bytes`] at `workspace`.
#[derive(Clone, Copy, Debug)]
pub struct EmbeddingAdamW {
    pub param: Addr,
    pub m: Addr,
    pub v: Addr,
    pub copy: Option<Addr>,
    pub step: Addr,
    pub lr: Addr,
    pub ids: Addr,
    pub grad_out: Option<Addr>,
    pub base: Option<(Addr, Stored)>,
    pub workspace: Addr,
}

/// AdamW of the `rows` of the table from the gradient [`embedding_backward_f32`] would write
/// (onto the base, or after [`zero_f32`]), with the bits of that scatter then `optim::adamw`
/// (see embedding.cu). The unnamed rows: the bitmap cleared, each id's bit set (an id outside
/// `0..V` raises `fault`), the rows whose bit is clear updated from `0 + base` (or 0), four
/// elements at a time where the sizes and pointers allow. The named rows: each from its sum
/// (an id outside `0..V` raises `fault`). `[tokens, hidden, vocab]`, `vocab · hidden > 0`;
/// the named rows need `grad_out`.
pub fn embedding_adamw(
    update: EmbeddingAdamW,
    rows: EmbeddingRows,
    [tokens, hidden, vocab]: [u64; 3],
    hyper: AdamWHyper,
    fault: Addr,
) -> Result<Vec<Launch>> {
    let EmbeddingAdamW {
        param,
        m,
        v,
        copy,
        step,
        lr,
        ids,
        grad_out,
        base,
        workspace,
    } = update;
    // Without a base the kernels never read its pointer; pass a valid one all the same.
    let (base_addr, stored) = base.unwrap_or((param, Stored::F32));
    let has_base = Arg::I32(i32::from(base.is_some()));
    let mut launches = Vec::new();
    match (rows, grad_out) {
        (EmbeddingRows::Unnamed, _) => {
            let named = workspace;
            launches.push(zero_f32(named, vocab.div_ceil(32)));
            if tokens > 0 {
                let args = vec![
                    Arg::Ptr(named),
                    Arg::Ptr(ids),
                    size_arg(tokens),
                    size_arg(vocab),
                    Arg::Ptr(fault),
                ];
                launches.push(grid_stride(MODULE, "embedding_mark", tokens, args));
            }
            let n = vocab.saturating_mul(hidden);
            let vector = n.is_multiple_of(4)
                && hidden.is_multiple_of(4)
                && all_aligned(&[param, m, v], 16)
                && all_aligned(&[base_addr], stored.vector_bytes())
                && copy.is_none_or(|c| all_aligned(&[c], 8));
            let (rest, items) = match vector {
                true => (
                    stored.pick(
                        "embedding_adamw_rest_f32_vec4",
                        "embedding_adamw_rest_bf16_vec4",
                    ),
                    n / 4,
                ),
                false => (
                    stored.pick("embedding_adamw_rest_f32", "embedding_adamw_rest_bf16"),
                    n,
                ),
            };
            let mut args = vec![
                Arg::Ptr(param),
                Arg::Ptr(m),
                Arg::Ptr(v),
                copy.map_or(Arg::Null, Arg::Ptr),
                Arg::Ptr(named),
                Arg::Ptr(base_addr),
                has_base,
                Arg::Ptr(step),
                Arg::Ptr(lr),
                size_arg(hidden),
                size_arg(items),
            ];
            args.extend(hyper.args());
            launches.push(update_launch(MODULE, rest, items, args));
        }
        (EmbeddingRows::Named, Some(grad_out)) if tokens > 0 => {
            let partials = match tokens > WINDOW {
                true => Arg::Ptr(workspace),
                false => Arg::Null,
            };
            let mut args = vec![
                Arg::Ptr(param),
                Arg::Ptr(m),
                Arg::Ptr(v),
                copy.map_or(Arg::Null, Arg::Ptr),
                partials,
                Arg::Ptr(ids),
                Arg::Ptr(grad_out),
                Arg::Ptr(base_addr),
                has_base,
                Arg::Ptr(step),
                Arg::Ptr(lr),
                size_arg(tokens),
                size_arg(hidden),
                size_arg(vocab),
                Arg::Ptr(fault),
            ];
            args.extend(hyper.args());
            let function = stored.pick("embedding_adamw_named_f32", "embedding_adamw_named_bf16");
            launches.push(block_per(MODULE, function, "tokens", tokens, args)?);
        }
        (EmbeddingRows::Named, Some(_)) => {} // no token names a row
        (EmbeddingRows::Named, None) => {
            return Err(Error::Argument {
                op: "embedding_adamw",
                argument: "grad_out",
                reason: "is needed for the named rows".into(),
            })
        }
    }
    Ok(launches)
}
