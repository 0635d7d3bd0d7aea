//! Errors of kiln-capi, and the status code each maps to at the C boundary.

/// What went wrong in a binding call: an argument the caller got wrong, a handle that is not
/// live, or an error of the kiln crate underneath (its message kept whole).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // --- arguments ---
    /// A pointer argument that must point somewhere is null.
    #[error("`{argument}` is a null pointer")]
    NullPointer { argument: &'static str },
    /// An argument has a value the call cannot take.
    #[error("{argument}: {reason}")]
    Argument { argument: String, reason: String },
    /// A tensor of another dtype was expected.
    #[error("{what}: expected dtype {expected}, got {got}")]
    DType {
        what: String,
        expected: String,
        got: String,
    },
    /// A tensor of another shape was expected (or its descriptor is inconsistent).
    #[error("{what}: {reason}")]
    Shape { what: String, reason: String },
    /// A tensor on a device the call cannot use.
    #[error("{what}: {reason}")]
    Device { what: String, reason: String },
    /// A program has no input or output of this name.
    #[error("{what} `{name}` does not exist (known: {known})")]
    NotFound {
        what: &'static str,
        name: String,
        known: String,
    },

    // --- handles ---
    /// A handle that was freed, or never made by kiln.
    #[error("the {kind} handle {id} is not live (freed, or never made by kiln)")]
    Handle { kind: &'static str, id: u64 },
    /// A live handle used on another thread than the one that made it.
    #[error(
        "the {kind} handle {id} belongs to another thread: a handle serves the thread that made it"
    )]
    ForeignThread { kind: &'static str, id: u64 },

    // --- below ---
    #[error(transparent)]
    Frontend(#[from] kiln_frontend::Error),
    #[error(transparent)]
    Runtime(#[from] kiln_runtime::Error),
    #[error(transparent)]
    Planner(#[from] kiln_planner::Error),
    #[error(transparent)]
    PlanVerifier(#[from] kiln_planner::PlanError),
    #[error(transparent)]
    Ir(#[from] kiln_ir::Error),
    #[error(transparent)]
    Engine(#[from] kiln_engine::Error),
    /// kiln panicked inside the call: a bug in kiln, reported instead of unwinding into C.
    #[error("internal error (a bug in kiln): {0}")]
    Panic(String),
}

impl Error {
    /// An [`Error::Argument`].
    pub fn argument(argument: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Argument {
            argument: argument.into(),
            reason: reason.into(),
        }
    }

    /// Whether the caller passed something wrong (rather than kiln failing at its work): a
    /// binding raises these as its language's argument errors.
    pub fn is_argument(&self) -> bool {
        matches!(
            self,
            Error::NullPointer { .. }
                | Error::Argument { .. }
                | Error::DType { .. }
                | Error::Shape { .. }
                | Error::Device { .. }
                | Error::NotFound { .. }
                | Error::Handle { .. }
                | Error::ForeignThread { .. }
                | Error::Runtime(kiln_runtime::Error::InputType { .. })
                | Error::Runtime(kiln_runtime::Error::InputIndex { .. })
                | Error::Runtime(kiln_runtime::Error::DeviceMemory { .. })
                | Error::Frontend(kiln_frontend::Error::Tokens { .. })
                | Error::Frontend(kiln_frontend::Error::TokenOutOfRange { .. })
                | Error::Frontend(kiln_frontend::Error::ProgramOption { .. })
                | Error::Frontend(kiln_frontend::Error::ProgramPrecision { .. })
                | Error::Frontend(kiln_frontend::Error::ModelSource { .. })
                | Error::Engine(kiln_engine::Error::Request { .. })
                | Error::Engine(kiln_engine::Error::SamplingParameter { .. })
                | Error::Engine(kiln_engine::Error::StopCriteria { .. })
        )
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
