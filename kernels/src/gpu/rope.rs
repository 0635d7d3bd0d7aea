//! Builders of `rope.cu`: split-half RoPE `[B,T,H,D] → [B,H,T,D]` and its backward, one thread
//! per pair of rotated elements.

use super::launch::{grid_stride, size_arg};
use super::{Addr, Arg, Forms, Launch, Stored};

const MODULE: &str = "rope";

/// The sizes of one RoPE call: `[batch, seq, heads, head_dim]` with `head_dim` even.
#[derive(Clone, Copy, Debug)]
pub struct RopeDims {
    pub batch: u64,
    pub seq: u64,
    pub heads: u64,
    pub head_dim: u64,
}

impl RopeDims {
    fn pairs(&self) -> u64 {
        self.batch * self.seq * self.heads * (self.head_dim / 2)
    }

    fn args(&self) -> [Arg; 4] {
        [
            size_arg(self.batch),
            size_arg(self.seq),
            size_arg(self.heads),
            size_arg(self.head_dim),
        ]
    }
}

/// `out [B,H,T,D] = rope(x [B,T,H,D] + bias [H·D])` at `positions [B,T]` (i64), `theta`
/// rounded to f32 as the CPU; `out` f32, or bf16 rounded as written (`out_stored`). Some pair
/// must exist. A negative position raises the `fault` word.
pub fn rope_f32(
    (out, out_stored): (Addr, Stored),
    [x, positions]: [Addr; 2],
    (bias, stored): (Option<Addr>, Stored),
    (dims, theta): (RopeDims, f32),
    fault: Addr,
) -> Launch {
    // Without a bias the kernel never reads its pointer; pass a valid one all the same.
    let mut args = vec![
        Arg::Ptr(out),
        Arg::Ptr(x),
        Arg::Ptr(positions),
        Arg::Ptr(bias.unwrap_or(x)),
        Arg::I32(i32::from(bias.is_some())),
    ];
    args.extend(dims.args());
    args.extend([Arg::F32(theta), Arg::Ptr(fault)]);
    let function = match (stored, out_stored) {
        (Stored::F32, Stored::F32) => "rope_f32",
        (Stored::BF16, Stored::F32) => "rope_f32_bf16",
        (Stored::F32, Stored::BF16) => "rope_f32_bf16_out",
        (Stored::BF16, Stored::BF16) => "rope_f32_bf16_bf16_out",
    };
    grid_stride(MODULE, function, dims.pairs(), args)
}

/// `grad_x [B,T,H,D]` from `grad_out [B,H,T,D]`, in f32, rounded to bf16, or both; `dims`
/// are grad_x's. A negative position raises the `fault` word.
pub fn rope_backward_f32(
    grad_x: Forms,
    [grad_out, positions]: [Addr; 2],
    (dims, theta): (RopeDims, f32),
    fault: Addr,
) -> Launch {
    let mut args = grad_x.args().to_vec();
    args.extend([Arg::Ptr(grad_out), Arg::Ptr(positions)]);
    args.extend(dims.args());
    args.extend([Arg::F32(theta), Arg::Ptr(fault)]);
    grid_stride(MODULE, "rope_backward_f32", dims.pairs(), args)
}
