//! Errors of kiln-ir.

/// What went wrong in kiln-ir: shapes, op typing, graph construction and verification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    // --- shapes ---
    /// A dimension was negative.
    #[error("dimension {axis} is negative ({value}); dimensions must be >= 0")]
    NegativeDim { axis: usize, value: i64 },
    /// A stride was negative.
    #[error("stride {axis} is negative ({value}); strides must be >= 0")]
    NegativeStride { axis: usize, value: i64 },
    /// A shape whose element count overflows `usize`, or a type whose bytes exceed
    /// `isize::MAX` (the most one allocation can hold).
    #[error("{what} is too large: {detail}")]
    TooLarge { what: String, detail: String },
    /// Strides and shape disagree in rank.
    #[error("shape has rank {shape_rank} but strides have rank {strides_rank}")]
    RankMismatch {
        shape_rank: usize,
        strides_rank: usize,
    },

    // --- op typing ---
    /// An op got the wrong number of operands.
    #[error("{op}: takes {expected} operands, got {got}")]
    Arity {
        op: String,
        expected: String,
        got: usize,
    },
    /// An operand's type breaks the op's type rule.
    #[error("{op}: operand {port} is {got}, expected {expected}")]
    Type {
        op: String,
        port: usize,
        expected: String,
        got: String,
    },
    /// An attribute is invalid for the operands.
    #[error("{op}: {reason}")]
    Attribute { op: String, reason: String },

    // --- graphs ---
    /// A value id that names no value of the graph.
    #[error("value {value} does not exist in the graph")]
    NoSuchValue { value: String },
    /// Two graph inputs, or two outputs, share a name.
    #[error("duplicate {what} name `{name}`")]
    DuplicateName { what: &'static str, name: String },
    /// A graph that breaks one of the verifier's rules.
    #[error("invalid graph: {rule}: {detail}")]
    Invalid { rule: &'static str, detail: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
