//! Builder of `optim.cu`: one AdamW step in place, the step read on the device.

use super::launch::{all_aligned, size_arg};
use super::{Addr, Arg, Kernel, Launch, BLOCK_THREADS};

/// AdamW hyper-parameters as the IR holds them (f64).
#[derive(Clone, Copy, Debug)]
pub struct AdamWHyper {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

/// The most blocks of an AdamW launch: 8 blocks of 256 threads on each of an H200's 132 SMs,
/// one full wave. Past it threads loop, so the per-thread f64 bias corrections are paid once
/// per thread, not once per element (the element count alone decides the grid).
const MAX_BLOCKS: u64 = 8 * 132;

/// Updates `param`, `m`, `v` (f32, `n > 0` elements) in place from `grad` and the i64 scalar
/// `step`. The scalars the CPU rounds once on the host are rounded here the same way. Four
/// floats per access when `n` is a multiple of 4 and every pointer but `step` is 16-byte
/// aligned.
pub fn adamw_f32([param, m, v, grad, step]: [Addr; 5], n: u64, hyper: AdamWHyper) -> Launch {
    let vector = n.is_multiple_of(4) && all_aligned(&[param, m, v, grad], 16);
    let (function, items) = if vector {
        ("adamw_f32_vec4", n / 4)
    } else {
        ("adamw_f32", n)
    };
    let args = vec![
        Arg::Ptr(param),
        Arg::Ptr(m),
        Arg::Ptr(v),
        Arg::Ptr(grad),
        Arg::Ptr(step),
        size_arg(items),
        Arg::F64(hyper.lr),
        Arg::F64(hyper.beta1),
        Arg::F64(hyper.beta2),
        Arg::F32((1.0 - hyper.lr * hyper.weight_decay) as f32),
        Arg::F32((1.0 - hyper.beta1) as f32),
        Arg::F32(hyper.beta2 as f32),
        Arg::F32((1.0 - hyper.beta2) as f32),
        Arg::F32(hyper.eps as f32),
    ];
    let blocks = items
        .div_ceil(u64::from(BLOCK_THREADS))
        .clamp(1, MAX_BLOCKS) as u32;
    Kernel::launch(
        "optim",
        function,
        (blocks, 1, 1),
        (BLOCK_THREADS, 1, 1),
        0,
        args,
    )
}
