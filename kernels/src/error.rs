//! Errors of kiln-kernels: every kernel validates its operands and says which one is wrong.

use kiln_ir::{DType, LayoutError, Shape};

/// What went wrong when calling a kernel or building a view.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    // --- operands ---
    /// An operand has a dtype the kernel does not accept here.
    #[error("{op}: operand `{operand}` has dtype {got}, expected {expected}")]
    DType {
        op: &'static str,
        operand: &'static str,
        expected: DType,
        got: DType,
    },
    /// The kernel has no implementation for this dtype.
    #[error("{op}: dtype {dtype} is not supported (supported: {supported})")]
    UnsupportedDType {
        op: &'static str,
        dtype: DType,
        supported: &'static str,
    },
    /// An operand has the wrong shape.
    #[error("{op}: operand `{operand}` has shape {got}, expected {expected}")]
    Shape {
        op: &'static str,
        operand: &'static str,
        expected: String,
        got: Shape,
    },
    /// An operand's layout is not one the kernel handles (kernels never copy behind your back).
    #[error("{op}: operand `{operand}` must be contiguous (shape {shape}, strides {strides:?})")]
    NotContiguous {
        op: &'static str,
        operand: &'static str,
        shape: Shape,
        strides: Vec<usize>,
    },
    /// An index operand (token id, position, target) is outside its valid range.
    #[error("{op}: operand `{operand}` holds {value} at element {at}, outside 0..{bound}")]
    IndexOutOfRange {
        op: &'static str,
        operand: &'static str,
        at: usize,
        value: i64,
        bound: usize,
    },
    /// A caller-provided workspace is too small.
    #[error("{op}: workspace `{operand}` has {got} elements, needs {needed}")]
    Workspace {
        op: &'static str,
        operand: &'static str,
        needed: usize,
        got: usize,
    },
    /// A scalar argument is outside its valid range.
    #[error("{op}: argument `{argument}` is invalid: {reason}")]
    Argument {
        op: &'static str,
        argument: &'static str,
        reason: String,
    },

    // --- views ---
    /// A view's layout breaks a layout rule (it does not fit its data, or its strides do not
    /// match its rank).
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Checks that `got` equals `expected`, or returns [`Error::Shape`] naming the operand.
pub fn expect_shape(
    op: &'static str,
    operand: &'static str,
    got: &Shape,
    expected: &[usize],
) -> Result<()> {
    if got.dims() == expected {
        Ok(())
    } else {
        Err(Error::Shape {
            op,
            operand,
            expected: Shape::new(expected).to_string(),
            got: got.clone(),
        })
    }
}

/// Checks that `got` has rank `rank`, or returns [`Error::Shape`] naming the operand.
pub fn expect_rank(
    op: &'static str,
    operand: &'static str,
    got: &Shape,
    rank: usize,
) -> Result<()> {
    if got.rank() == rank {
        Ok(())
    } else {
        Err(Error::Shape {
            op,
            operand,
            expected: format!("rank {rank}"),
            got: got.clone(),
        })
    }
}
