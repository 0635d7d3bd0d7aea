//! Builders of `rope.cu`: split-half RoPE `[B,T,H,D] → [B,H,T,D]` and its backward, a block
//! per token at a time (the token's angles computed once into shared memory), a thread per
//! pair of rotated elements.

use super::launch::{size_arg, BLOCK_THREADS, MAX_GRID_X};
use super::{Addr, Arg, Forms, Kernel, Launch, Stored};

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
    /// A launch of `function` over the tokens: a block per token (up to the grid's limit,
    /// past which blocks loop), a warp per 32 of its pairs up to [`BLOCK_THREADS`], the
    /// token's `head_dim` angles (cos and sin) in dynamic shared memory.
    fn by_token(&self, function: &'static str, args: Vec<Arg>) -> Launch {
        let blocks = (self.batch * self.seq).clamp(1, MAX_GRID_X) as u32;
        let pairs = self.heads * (self.head_dim / 2);
        let threads = pairs
            .next_multiple_of(32)
            .clamp(32, u64::from(BLOCK_THREADS)) as u32;
        let shared = (self.head_dim * 4) as u32;
        Kernel::launch(
            MODULE,
            function,
            (blocks, 1, 1),
            (threads, 1, 1),
            shared,
            args,
        )
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
    dims.by_token(function, args)
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
    dims.by_token("rope_backward_f32", args)
}
