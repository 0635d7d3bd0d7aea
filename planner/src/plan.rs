//! The plan: what the planner decided, as plain serializable data.
//!
//! Units: sizes and offsets in bytes; lifetimes in schedule steps (index into `schedule`),
//! inclusive at both ends. Every list is in a fixed order (schedule order, buffer id), so the
//! same program and options give the same plan byte for byte, and `hash` is stable.

use serde::{Deserialize, Serialize};

/// Options the plan was made with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanOptions {
    /// Number of streams (1 = serial).
    pub streams: usize,
    /// Alignment of arena offsets, bytes.
    pub alignment: u64,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            streams: 1,
            alignment: 256,
        }
    }
}

/// One op in execution order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// IR node index of the op.
    pub node: usize,
    /// Op text (name and attributes).
    pub op: String,
    pub stream: usize,
    /// Events this step waits for before it runs.
    pub waits: Vec<usize>,
    /// Events recorded right after this step.
    pub records: Vec<usize>,
}

/// Where a buffer's storage comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BufferClass {
    /// Weights (allocated once, outside the arena).
    Param,
    /// Per-run inputs (static I/O slots, outside the arena).
    Input,
    /// Program outputs (static I/O slots, outside the arena).
    Output,
    /// Persistent state (outside the arena).
    State,
    /// Intermediate values: slices of the arena.
    Activation,
    /// Scratch an op needs while it runs: slices of the arena.
    Workspace,
}

impl BufferClass {
    /// Whether buffers of this class live in the arena.
    pub fn in_arena(self) -> bool {
        matches!(self, BufferClass::Activation | BufferClass::Workspace)
    }
}

/// One buffer: one or more IR values (views and in-place results share their operand's
/// buffer), or one op's workspace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Buffer {
    /// Index in `Plan::buffers`.
    pub id: usize,
    /// A readable name: the input/output name, or the op and value of its first writer.
    pub name: String,
    pub class: BufferClass,
    /// Bytes.
    pub size: u64,
    /// Byte offset in the arena (`Some` exactly for activations and workspaces).
    pub offset: Option<u64>,
    /// First schedule step that writes it (0 for buffers that exist before the run).
    pub start: usize,
    /// Last schedule step that reads or writes it (the last step for buffers that outlive
    /// the run).
    pub end: usize,
    /// Stream of the step that first writes it.
    pub stream: usize,
    /// IR values stored in it, as `"node.port"`, in order.
    pub values: Vec<String>,
    /// Number of operand reads of its values.
    pub uses: usize,
}

/// A value recomputed in the backward: what it frees and what it costs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recomputed {
    /// The value the forward makes, as `"node.port"` of the planned graph.
    pub value: String,
    /// Its clone, which the backward reads.
    pub clone: String,
    /// The ops cloned, by name, in order (its own producer last).
    pub op: String,
    /// Bytes no longer kept from the forward to the backward.
    pub bytes: u64,
    /// Ops cloned (its producer and the chain it needs).
    pub ops: usize,
    /// The clones' estimated time ([`kiln_ir::recompute::Candidate::estimated_us`]), ns.
    pub estimated_ns: u64,
}

/// A planned program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub program: String,
    pub options: PlanOptions,
    pub schedule: Vec<Step>,
    pub buffers: Vec<Buffer>,
    /// For every IR value `"node.port"`, its buffer id; sorted by node then port.
    pub value_buffers: Vec<(String, usize)>,
    /// Size of the one arena, bytes.
    pub arena_bytes: u64,
    /// The exact lower bound for this schedule: the peak over steps of live arena bytes.
    pub lower_bound_bytes: u64,
    /// Schedule and offset heuristics that won.
    pub schedule_strategy: String,
    pub offset_strategy: String,
    /// Every offset heuristic tried, with the arena it gave (bytes), in a fixed order.
    pub offset_candidates: Vec<(String, u64)>,
    /// Number of events.
    pub events: usize,
    /// Writes of persistent inputs computed directly in the input's storage (no output buffer
    /// is used, nothing is copied back), in the graph's order; the other writes are copied
    /// into their input after the last step. The rules are in `in_place.rs`.
    pub in_place_writes: Vec<String>,
    /// Values the backward recomputes instead of keeping them from the forward, chosen to fit
    /// a memory budget (`budget.rs`); empty, and absent from the JSON, without one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recomputed: Vec<Recomputed>,
    /// The stream every `all_reduce` runs on, and nothing else: `options.streams`, one past the
    /// compute streams, so collectives overlap the compute they do not wait for; absent from
    /// the JSON (and `None`) for a program without collectives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub communication_stream: Option<usize>,
    /// Stable hash (hex) of everything above.
    pub hash: String,
}

impl Plan {
    /// The streams a device backend creates for this plan: the compute streams, and the
    /// communication stream where there is one.
    pub fn streams(&self) -> usize {
        self.options.streams + usize::from(self.communication_stream.is_some())
    }
}
