//! Errors of kiln-planner. Each names the option, value or rule that failed, so a caller can
//! tell a bad graph from bad options from a plan too large to describe.

/// What went wrong while planning.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The graph breaks an IR invariant (the IR verifier's report).
    #[error("cannot plan an invalid graph: {0}")]
    Graph(#[from] kiln_ir::Error),
    /// A plan option is out of range.
    #[error("plan option `{option}`: {detail}")]
    Option {
        option: &'static str,
        detail: String,
    },
    /// The graph passed the verifier but still breaks something the planner relies on.
    #[error("cannot plan: {rule}: {detail}")]
    Unplannable { rule: &'static str, detail: String },
    /// A byte count does not fit in 64 bits.
    #[error("{what} overflows 64-bit byte counts")]
    Overflow { what: String },
    /// The plan does not fit the memory budget even with every value that can be recomputed.
    #[error(
        "no plan fits the memory budget of {budget} arena bytes: with all {candidates} values \
         that can be recomputed recomputed the plan needs {smallest} (without recomputation \
         {unbudgeted})"
    )]
    Budget {
        budget: u64,
        smallest: u64,
        unbudgeted: u64,
        candidates: usize,
    },
    /// The plan could not be serialized for hashing.
    #[error("cannot serialize the plan for its hash: {0}")]
    Serialize(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
