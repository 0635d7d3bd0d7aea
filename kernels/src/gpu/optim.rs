//! Builder of `optim.cu`: one AdamW step in place (step and learning rate read on the
//! device), and the two launches of gradient clipping.

use super::launch::{all_aligned, size_arg, SMS};
use super::{Addr, Arg, Kernel, Launch, Stored, BLOCK_THREADS};

/// AdamW hyper-parameters as the IR holds them (f64); the learning rate is a device scalar.
#[derive(Clone, Copy, Debug)]
pub struct AdamWHyper {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

/// The most blocks of an AdamW launch: 8 blocks of 256 threads on each of an H200's 132 SMs,
/// one full wave. Past it threads loop, so the per-thread f64 bias corrections are paid once
/// per thread, not once per element (the element count alone decides the grid).
const MAX_BLOCKS: u64 = 8 * SMS;

/// The device tensors of one AdamW step: `param`, `m`, `v` (f32) updated in place from `grad`
/// (f32, or bf16 widened as read), times the f32 scalar `scale` when given, the i64 scalar
/// `step` and the f64 scalar `lr`; `copy`, when given, receives the new param rounded to bf16
/// (a persistent bf16 weight).
#[derive(Clone, Copy, Debug)]
pub struct AdamWUpdate {
    pub param: Addr,
    pub m: Addr,
    pub v: Addr,
    pub grad: (Addr, Stored),
    pub step: Addr,
    pub lr: Addr,
    pub scale: Option<Addr>,
    pub copy: Option<Addr>,
}

/// One AdamW step over `n > 0` elements (see [`AdamWUpdate`]). The scalars the CPU rounds once
/// on the host are rounded here the same way. Four elements per access when `n` is a multiple
/// of 4 and every tensor pointer is aligned to its vector (16 bytes; 8 for a bf16 gradient and
/// the copy).
pub fn adamw(update: AdamWUpdate, n: u64, hyper: AdamWHyper) -> Launch {
    let AdamWUpdate {
        param,
        m,
        v,
        grad: (grad, grad_dtype),
        step,
        lr,
        scale,
        copy,
    } = update;
    let vector = n.is_multiple_of(4)
        && all_aligned(&[param, m, v], 16)
        && all_aligned(&[grad], grad_dtype.vector_bytes())
        && copy.is_none_or(|c| all_aligned(&[c], 8));
    let (function, items) = match vector {
        true => (
            grad_dtype.pick("adamw_f32_vec4", "adamw_f32_bf16_grad_vec4"),
            n / 4,
        ),
        false => (grad_dtype.pick("adamw_f32", "adamw_f32_bf16_grad"), n),
    };
    let mut args = vec![
        Arg::Ptr(param),
        Arg::Ptr(m),
        Arg::Ptr(v),
        Arg::Ptr(grad),
        copy.map_or(Arg::Null, Arg::Ptr),
        Arg::Ptr(step),
        Arg::Ptr(lr),
        scale.map_or(Arg::Null, Arg::Ptr),
        size_arg(items),
    ];
    args.extend(hyper.args());
    update_launch("optim", function, items, args)
}

impl AdamWHyper {
    /// The hyper-parameters as every update kernel takes them, last: weight decay and the
    /// betas in f64, then the f32 scalars the CPU rounds once on the host (1 - beta1, beta2,
    /// 1 - beta2, eps).
    pub(super) fn args(&self) -> [Arg; 7] {
        [
            Arg::F64(self.weight_decay),
            Arg::F64(self.beta1),
            Arg::F64(self.beta2),
            Arg::F32((1.0 - self.beta1) as f32),
            Arg::F32(self.beta2 as f32),
            Arg::F32((1.0 - self.beta2) as f32),
            Arg::F32(self.eps as f32),
        ]
    }
}

/// A grid-stride update of `items` (elements or vectors) on at most [`MAX_BLOCKS`] blocks.
pub(super) fn update_launch(
    module: &'static str,
    function: &'static str,
    items: u64,
    args: Vec<Arg>,
) -> Launch {
    let blocks = items
        .div_ceil(u64::from(BLOCK_THREADS))
        .clamp(1, MAX_BLOCKS) as u32;
    Kernel::launch(
        module,
        function,
        (blocks, 1, 1),
        (BLOCK_THREADS, 1, 1),
        0,
        args,
    )
}

/// Threads of the clipping kernels (`KILN_CLIP_THREADS`).
const CLIP_THREADS: u32 = 256;
/// The most partial sums one gradient's squares are split into.
const CLIP_MAX_PARTIALS: u64 = 256;

/// The partial sums (f64 each) a gradient of `n` elements is split into: one per 8 elements of
/// each thread, at most [`CLIP_MAX_PARTIALS`]; fixed by `n` alone, so the sum's order is.
pub fn clip_partials(n: u64) -> u64 {
    n.div_ceil(u64::from(CLIP_THREADS) * 8)
        .clamp(1, CLIP_MAX_PARTIALS)
}

/// Workspace bytes of clipping gradients of these element counts.
pub fn clip_workspace_bytes(counts: impl IntoIterator<Item = u64>) -> u64 {
    counts
        .into_iter()
        .fold(0u64, |sum, n| sum.saturating_add(clip_partials(n) * 8))
}

/// Sums the squares of `grad` (f32, `n` elements) into its [`clip_partials`]`(n)` f64
/// partials at `partials`.
pub fn clip_grad_norm_partial(grad: Addr, n: u64, partials: Addr) -> Launch {
    Kernel::launch(
        "optim",
        "clip_grad_norm_partial",
        (clip_partials(n) as u32, 1, 1),
        (CLIP_THREADS, 1, 1),
        0,
        vec![Arg::Ptr(grad), size_arg(n), Arg::Ptr(partials)],
    )
}

/// Sums `count` partials into the f32 scalars `norm` and `scale` (clip_grad_norm_'s factor).
pub fn clip_grad_norm_finish(
    partials: Addr,
    count: u64,
    max_norm: f64,
    [norm, scale]: [Addr; 2],
) -> Launch {
    Kernel::launch(
        "optim",
        "clip_grad_norm_finish",
        (1, 1, 1),
        (CLIP_THREADS, 1, 1),
        0,
        vec![
            Arg::Ptr(partials),
            size_arg(count),
            Arg::F64(max_norm),
            Arg::Ptr(norm),
            Arg::Ptr(scale),
        ],
    )
}
