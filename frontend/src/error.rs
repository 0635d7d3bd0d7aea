//! Errors of kiln-frontend.

use kiln_ir::{DType, Shape};

/// What went wrong in the eager oracle or a model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    // --- autograd ---
    /// Gradients exist only for floating-point leaves.
    #[error("a {dtype} tensor cannot require a gradient (only float tensors can)")]
    NotDifferentiable { dtype: DType },
    /// `backward` was called on a value no gradient flows to.
    #[error(
        "backward: the value does not require a gradient (no leaf that requires one is behind it)"
    )]
    NoGradient,
    /// The seed gradient does not match the value.
    #[error("backward: seed gradient is {got}, the value is {expected}")]
    Seed { expected: String, got: String },
    /// `backward()` without a seed needs a one-element value.
    #[error(
        "backward: the value has shape {shape}; without a seed gradient it must have one element"
    )]
    NotScalar { shape: Shape },
    /// An operation that only leaves support was asked of a computed value.
    #[error("{op}: the value is not a leaf (it was computed by `{producer}`)")]
    NotLeaf {
        op: &'static str,
        producer: &'static str,
    },
    /// A gradient buffer is already bound to this leaf.
    #[error("bind_grad_buffer: the leaf already has a bound gradient buffer; unbind it first")]
    AlreadyBound,
    /// Unbinding a leaf that has no bound buffer.
    #[error("unbind_grad_buffer: the leaf has no bound gradient buffer")]
    NotBound,
    /// A bound gradient may not be replaced (it would move the address others rely on).
    #[error("set_grad: the leaf's gradient is a bound buffer; unbind it before replacing it")]
    ReplaceBound,
    /// The leaf already holds a gradient that binding would silently drop.
    #[error("bind_grad_buffer: the leaf already has a gradient; call zero_grad() first")]
    GradientPresent,
    /// A gradient buffer or gradient of the wrong kind.
    #[error("{op}: {reason}")]
    GradBuffer { op: &'static str, reason: String },
    /// An op's backward returned a gradient that does not match its input (a bug in that op).
    #[error("backward of `{op}`: gradient for input {input} is {got}, expected {expected}")]
    GradientMismatch {
        op: &'static str,
        input: usize,
        expected: String,
        got: String,
    },

    // --- ops ---
    /// An op was given operands it cannot combine.
    #[error("{op}: {reason}")]
    Operand { op: &'static str, reason: String },

    // --- model files ---
    /// A config field is missing or malformed.
    #[error("{path}: field `{field}`: {reason}")]
    Config {
        path: String,
        field: String,
        reason: String,
    },
    /// A config asks for something kiln does not implement.
    #[error("{path}: unsupported {field} = {value}: {reason}")]
    Unsupported {
        path: String,
        field: String,
        value: String,
        reason: String,
    },
    /// Something is already at a path kiln writes; kiln never replaces it.
    #[error("{path} already exists ({what}); kiln never replaces an existing path")]
    AlreadyExists { path: String, what: String },
    /// A file could not be read, written or renamed.
    #[error("{path}: {reason}")]
    Io { path: String, reason: String },
    /// A safetensors file (or shard index) is malformed: truncated, header offsets outside the
    /// file, overlapping data ranges, a bad header.
    #[error("{path}: {reason}")]
    Safetensors { path: String, reason: String },
    /// A tensor the config needs is not in the weights.
    #[error("{path}: missing tensor `{name}` (expected shape {expected})")]
    MissingTensor {
        path: String,
        name: String,
        expected: String,
    },
    /// The weights hold a tensor the config does not use.
    #[error("{path}: unexpected tensor `{name}` (the config has no such parameter)")]
    UnexpectedTensor { path: String, name: String },
    /// A tensor has the wrong shape for the config.
    #[error("{path}: tensor `{name}` has shape {found}, expected {expected}")]
    TensorShape {
        path: String,
        name: String,
        expected: String,
        found: String,
    },
    /// A tensor has a dtype kiln cannot use there.
    #[error("{path}: tensor `{name}` has dtype {found}, expected {expected}")]
    TensorDType {
        path: String,
        name: String,
        expected: String,
        found: String,
    },
    /// A preset name kiln does not know.
    #[error("unknown preset `{name}` (known: {known})")]
    UnknownPreset { name: String, known: String },

    /// `--model` named neither a model directory nor a preset.
    #[error("`{arg}` is neither a model directory nor a preset (presets: {known})")]
    ModelSource { arg: String, known: String },
    /// A token id outside the model's vocabulary.
    #[error("token id {id} at [{row}, {column}] is outside the vocabulary 0..{vocab}")]
    TokenOutOfRange {
        row: usize,
        column: usize,
        id: i64,
        vocab: usize,
    },
    /// A token batch of the wrong shape or dtype.
    #[error("tokens: {reason}")]
    Tokens { reason: String },

    // --- programs ---
    /// A program option no program of the model can be built with; `flag` is the option as
    /// every kiln command spells it (`--batch`, `--seq`, `--max-seq`, `--context`).
    #[error("{flag} {value}: {reason}")]
    ProgramOption {
        flag: &'static str,
        value: usize,
        reason: String,
    },
    /// A precision the program cannot be built in.
    #[error("--precision {precision} cannot build the {program} program: {reason}")]
    ProgramPrecision {
        precision: &'static str,
        program: &'static str,
        reason: &'static str,
    },

    /// A `--trace` pattern that is malformed or names no value of the program.
    #[error("--trace {pattern}: {reason}")]
    Trace { pattern: String, reason: String },

    // --- below ---
    /// An IR error while tracing a program (boxed: it carries op text).
    #[error(transparent)]
    Ir(Box<kiln_ir::Error>),
    /// A tensor or kernel error (boxed: they carry shapes and strides).
    #[error(transparent)]
    Runtime(Box<kiln_runtime::Error>),
    /// The planner refused a program.
    #[error(transparent)]
    Plan(Box<kiln_planner::Error>),
}

impl From<kiln_planner::Error> for Error {
    fn from(error: kiln_planner::Error) -> Self {
        Error::Plan(Box::new(error))
    }
}

impl From<kiln_runtime::Error> for Error {
    fn from(error: kiln_runtime::Error) -> Self {
        Error::Runtime(Box::new(error))
    }
}

impl From<kiln_kernels::Error> for Error {
    fn from(error: kiln_kernels::Error) -> Self {
        Error::Runtime(Box::new(error.into()))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `"f32 [2,3]"`: how errors name a value's type.
pub(crate) fn type_name(dtype: DType, shape: &Shape) -> String {
    format!("{dtype} {shape}")
}
