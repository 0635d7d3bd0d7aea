//! Builders of `norm.cu`: RMSNorm, fused add + RMSNorm, and the backward (a row pass that also
//! saves each row's rstd, then a column pass for grad_weight, split over chunks of rows with a
//! finish launch where the rows are many: `columns.rs`).

use super::launch::{grid_dim, size_arg, BLOCK_THREADS, MAX_GRID_X};
use super::{Addr, Arg, Forms, Kernel, Launch, Stored};
use crate::Result;

const MODULE: &str = "norm";

/// Values of a row each thread holds in registers (the C header's `KILN_NORM_HELD`).
const HELD: u64 = 8;

/// A launch of a row kernel of `norm.cu`: a block per row (`rows > 0`), of as few warps as hold
/// the row at [`HELD`] values a thread (896 columns: 128 threads, 7 values each), at most
/// [`BLOCK_THREADS`] (longer rows loop). Fewer threads a row leave room on each SM for more
/// rows at once, and give each thread more loads in flight before the row's barriers.
fn rows_launch(function: &'static str, rows: u64, hidden: u64, args: Vec<Arg>) -> Result<Launch> {
    let blocks = grid_dim(function, "rows", rows, MAX_GRID_X)?;
    let threads = (hidden.div_ceil(HELD).next_multiple_of(32)).clamp(32, u64::from(BLOCK_THREADS));
    Ok(Kernel::launch(
        MODULE,
        function,
        (blocks, 1, 1),
        (threads as u32, 1, 1),
        0,
        args,
    ))
}

/// The kernel of a norm (`add`: with the residual add) for a weight and normed rows of these
/// storages (`_bf16`: a bf16 weight; `_bf16_out`: bf16 rows rounded as written).
fn function(add: bool, weight: Stored, out: Stored) -> &'static str {
    match (add, weight, out) {
        (false, Stored::F32, Stored::F32) => "rmsnorm_f32",
        (false, Stored::BF16, Stored::F32) => "rmsnorm_f32_bf16",
        (false, Stored::F32, Stored::BF16) => "rmsnorm_f32_bf16_out",
        (false, Stored::BF16, Stored::BF16) => "rmsnorm_f32_bf16_bf16_out",
        (true, Stored::F32, Stored::F32) => "add_rmsnorm_f32",
        (true, Stored::BF16, Stored::F32) => "add_rmsnorm_f32_bf16",
        (true, Stored::F32, Stored::BF16) => "add_rmsnorm_f32_bf16_out",
        (true, Stored::BF16, Stored::BF16) => "add_rmsnorm_f32_bf16_bf16_out",
    }
}

/// `out = rmsnorm(x) · weight` over `rows > 0` rows of `hidden`: `out` f32, or bf16 rounded as
/// written (`out_stored`).
pub fn rmsnorm_f32(
    (out, out_stored): (Addr, Stored),
    x: Addr,
    (weight, stored): (Addr, Stored),
    rows: u64,
    hidden: u64,
    eps: f32,
) -> Result<Launch> {
    let args = vec![
        Arg::Ptr(out),
        Arg::Ptr(x),
        Arg::Ptr(weight),
        size_arg(rows),
        size_arg(hidden),
        Arg::F32(eps),
    ];
    rows_launch(function(false, stored, out_stored), rows, hidden, args)
}

/// `sum = x + residual`, `out = rmsnorm(sum) · weight` (`rows > 0`): `sum` f32, `out` f32 or
/// bf16 rounded as written (`out_stored`).
#[allow(clippy::too_many_arguments)]
pub fn add_rmsnorm_f32(
    sum: Addr,
    (out, out_stored): (Addr, Stored),
    x: Addr,
    residual: Addr,
    (weight, stored): (Addr, Stored),
    rows: u64,
    hidden: u64,
    eps: f32,
) -> Result<Launch> {
    let args = vec![
        Arg::Ptr(sum),
        Arg::Ptr(out),
        Arg::Ptr(x),
        Arg::Ptr(residual),
        Arg::Ptr(weight),
        size_arg(rows),
        size_arg(hidden),
        Arg::F32(eps),
    ];
    rows_launch(function(true, stored, out_stored), rows, hidden, args)
}

/// Where the backward's row pass reads and writes.
#[derive(Clone, Copy, Debug)]
pub struct RmsNormBackwardRows {
    /// In f32, rounded to bf16 (the GEMMs' input in mixed precision), or both.
    pub grad_x: Forms,
    /// `rows` f32: each row's rstd, for [`rmsnorm_backward_weight_f32`].
    pub rstd: Addr,
    pub x: Addr,
    pub weight: Addr,
    pub grad_out: Addr,
    /// Added to grad_x when given (add_rmsnorm_backward's gradient of the sum).
    pub grad_sum: Option<Addr>,
}

/// The row pass of the backward (`rows > 0`).
pub fn rmsnorm_backward_rows_f32(
    at: RmsNormBackwardRows,
    rows: u64,
    hidden: u64,
    eps: f32,
) -> Result<Launch> {
    const FUNCTION: &str = "rmsnorm_backward_rows_f32";
    // Without grad_sum the kernel never reads its pointer; pass a valid one all the same.
    let grad_sum = at.grad_sum.unwrap_or(at.grad_out);
    let mut args = at.grad_x.args().to_vec();
    args.extend([
        Arg::Ptr(at.rstd),
        Arg::Ptr(at.x),
        Arg::Ptr(at.weight),
        Arg::Ptr(at.grad_out),
        Arg::Ptr(grad_sum),
        Arg::I32(i32::from(at.grad_sum.is_some())),
        size_arg(rows),
        size_arg(hidden),
        Arg::F32(eps),
    ]);
    rows_launch(FUNCTION, rows, hidden, args)
}

/// Where the column pass's partials start in the norm backwards' workspace (after each row's
/// rstd, aligned), and the workspace's bytes: `rows` f32 alone where the column pass has one
/// chunk of rows.
pub fn backward_workspace(rows: u64, hidden: u64) -> (u64, u64) {
    match super::columns::partials_bytes(rows, hidden) {
        0 => (rows * 4, rows * 4),
        partials => {
            let start = (rows * 4).next_multiple_of(super::SLOT_ALIGN);
            (start, start + partials)
        }
    }
}

/// `grad_weight[j] = Σ_r grad_out[r,j] · (x[r,j] · rstd[r])` (`hidden > 0`; `rows` may be 0),
/// split over chunks of rows with the partials in `workspace` (of
/// [`columns::partials_bytes`](super::columns::partials_bytes)).
pub fn rmsnorm_backward_weight_f32(
    grad_weight: Addr,
    [x, grad_out, rstd]: [Addr; 3],
    [rows, hidden]: [u64; 2],
    workspace: Addr,
) -> Result<Vec<Launch>> {
    let args = [x, grad_out, rstd].map(Arg::Ptr).to_vec();
    let function = (MODULE, "rmsnorm_backward_weight_f32");
    super::columns::column_sums(function, grad_weight, args, [rows, hidden], workspace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(launch: Launch) -> ((u32, u32, u32), (u32, u32, u32)) {
        let Launch::Kernel(kernel) = launch else {
            panic!("{launch:?}")
        };
        (kernel.grid, kernel.block)
    }

    #[test]
    fn a_row_takes_the_warps_that_hold_it_at_eight_values_a_thread() {
        let at = Addr { slot: 0, offset: 0 };
        let norm = |rows, hidden| {
            let launch = rmsnorm_f32((at, Stored::F32), at, (at, Stored::F32), rows, hidden, 1e-6);
            shape(launch.unwrap())
        };
        assert_eq!(norm(2048, 896), ((2048, 1, 1), (128, 1, 1)));
        assert_eq!(norm(3, 1536), ((3, 1, 1), (192, 1, 1)));
        assert_eq!(norm(1, 8), ((1, 1, 1), (32, 1, 1)));
        // Past 2048 columns a block of 256 loops over the row.
        assert_eq!(norm(2, 2049), ((2, 1, 1), (256, 1, 1)));
        let rows = RmsNormBackwardRows {
            grad_x: Forms::f32(at),
            rstd: at,
            x: at,
            weight: at,
            grad_out: at,
            grad_sum: None,
        };
        let backward = rmsnorm_backward_rows_f32(rows, 9, 1000, 1e-6).unwrap();
        assert_eq!(shape(backward), ((9, 1, 1), (128, 1, 1)));
    }
}
