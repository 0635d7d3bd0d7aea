//! Errors of kiln-runtime.

use kiln_ir::{DType, Shape, TensorType};

/// What went wrong with a storage or tensor.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    // --- construction ---
    /// Data given for a tensor does not have the shape's element count.
    #[error("{len} elements given for a tensor of shape {shape} ({numel} elements)")]
    DataLength {
        shape: Shape,
        numel: usize,
        len: usize,
    },
    /// A tensor of a different dtype was expected.
    #[error("{op}: expected dtype {expected}, got {got}")]
    DType {
        op: &'static str,
        expected: DType,
        got: DType,
    },

    // --- views ---
    /// A view breaks a layout rule (reshape of a strided tensor, a bad axis or slice, a view
    /// outside its storage).
    #[error(transparent)]
    Layout(#[from] kiln_ir::LayoutError),
    /// A negative offset was given.
    #[error("as_strided: offset {offset} is negative")]
    NegativeOffset { offset: i64 },

    // --- storage ---
    /// The storage is being written (or read while a write was asked): two borrows of one
    /// storage overlap, e.g. an op whose output aliases its input.
    #[error("storage is already borrowed {held}; an output may not alias an input")]
    Busy { held: &'static str },

    // --- host bytes ---
    /// Foreign host memory cannot be read or written as described (see `host_bytes`).
    #[error("host bytes: {reason}")]
    HostBytes { reason: String },

    // --- collectives ---
    /// A collective could not complete on rank `rank`: another rank failed, the ranks brought
    /// different tensors, or the others did not come in time.
    #[error("all_reduce on rank {rank}: {reason}")]
    Collective { rank: usize, reason: String },

    // --- interpreter ---
    /// A graph input has no value bound to its name.
    #[error("graph input `{name}` ({expected}) has no value bound to it")]
    MissingInput {
        name: String,
        expected: Box<TensorType>,
    },
    /// An index input (token ids, targets, positions) holds a value an op reading it cannot
    /// take.
    #[error(
        "graph input `{name}` holds {value} at element {at}, outside {valid} (read by {reader})"
    )]
    InputIndex {
        name: String,
        at: usize,
        value: i64,
        valid: String,
        reader: String,
    },
    /// The value bound to a graph input has another dtype or shape than the input. (Types are
    /// boxed to keep every `Result` of this crate small.)
    #[error("graph input `{name}` is {expected}, but the value bound to it is {found}")]
    InputType {
        name: String,
        expected: Box<TensorType>,
        found: Box<TensorType>,
    },
    /// Two programs of an executable group have a param or state input of one name (which
    /// the group shares) with different kinds or types: each program and its input's kind and
    /// type. (Boxed to keep every `Result` of this crate small.)
    #[error(
        "input `{name}` is {} in {} but {} in {}; an executable group shares it, so they must \
         agree",
        .inputs[0], .programs[0], .inputs[1], .programs[1]
    )]
    GroupInput {
        name: String,
        programs: Box<[String; 2]>,
        inputs: Box<[String; 2]>,
    },
    /// The graph cannot be run as it stands: `what` names the node, output or write at fault.
    #[error("{what}: {reason}")]
    Graph { what: String, reason: String },
    /// An op failed while running: the node's index and op, and the error underneath.
    #[error("node %{node} ({op}): {source}")]
    Node {
        node: usize,
        op: String,
        source: Box<Error>,
    },

    // --- devices ---
    /// A device backend cannot run this op on these operands (layout, dtype, size).
    #[error("{op}: the {backend} backend cannot run it: {reason}")]
    Unsupported {
        backend: &'static str,
        op: String,
        reason: String,
    },
    /// A device, its driver or one of its libraries failed or is missing.
    #[error("{backend}: {what}: {reason}")]
    Device {
        backend: &'static str,
        what: String,
        reason: String,
    },
    /// Device memory a caller described (a DLPack tensor, a C descriptor) cannot be used as
    /// described: not device memory, another device's, too small, or of the wrong size.
    #[error("{what}: {reason}")]
    DeviceMemory { what: String, reason: String },
    /// A kernel met an invalid index (a token id, target or position outside its range) that
    /// reached the device without passing the host's check.
    #[error(
        "program `{program}`, step {step} ({op}): a kernel met an invalid index (a token id, \
         target or position outside its range); its results are not to be trusted"
    )]
    DeviceFault {
        program: String,
        step: usize,
        op: String,
    },

    // --- below ---
    #[error(transparent)]
    Shape(#[from] kiln_ir::Error),
    /// A kernel refused its operands (boxed: kernel errors carry shapes and strides).
    #[error(transparent)]
    Kernel(Box<kiln_kernels::Error>),
}

impl From<kiln_kernels::Error> for Error {
    fn from(error: kiln_kernels::Error) -> Self {
        Error::Kernel(Box::new(error))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
