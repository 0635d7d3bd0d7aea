//! Errors of kiln-ir.

/// What went wrong in kiln-ir.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A dimension was negative.
    #[error("dimension {axis} is negative ({value}); dimensions must be >= 0")]
    NegativeDim { axis: usize, value: i64 },
    /// A stride was negative.
    #[error("stride {axis} is negative ({value}); strides must be >= 0")]
    NegativeStride { axis: usize, value: i64 },
    /// The number of elements does not fit in `usize`.
    #[error("shape {dims:?} has more elements than fit in memory")]
    TooLarge { dims: Vec<i64> },
    /// Strides and shape disagree in rank.
    #[error("shape has rank {shape_rank} but strides have rank {strides_rank}")]
    RankMismatch {
        shape_rank: usize,
        strides_rank: usize,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
