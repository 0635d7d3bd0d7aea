//! Builder of `optim.cu`: one AdamW step in place, the step read on the device.

use super::launch::{grid_stride_blocks, size_arg};
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

/// Updates `param`, `m`, `v` (f32, `n > 0` elements) in place from `grad` and the i64 scalar
/// `step`. The scalars the CPU rounds once on the host are rounded here the same way.
pub fn adamw_f32([param, m, v, grad, step]: [Addr; 5], n: u64, hyper: AdamWHyper) -> Launch {
    let args = vec![
        Arg::Ptr(param),
        Arg::Ptr(m),
        Arg::Ptr(v),
        Arg::Ptr(grad),
        Arg::Ptr(step),
        size_arg(n),
        Arg::F64(hyper.lr),
        Arg::F64(hyper.beta1),
        Arg::F64(hyper.beta2),
        Arg::F32((1.0 - hyper.lr * hyper.weight_decay) as f32),
        Arg::F32((1.0 - hyper.beta1) as f32),
        Arg::F32(hyper.beta2 as f32),
        Arg::F32((1.0 - hyper.beta2) as f32),
        Arg::F32(hyper.eps as f32),
    ];
    let grid = (grid_stride_blocks(n), 1, 1);
    Kernel::launch("optim", "adamw_f32", grid, (BLOCK_THREADS, 1, 1), 0, args)
}
