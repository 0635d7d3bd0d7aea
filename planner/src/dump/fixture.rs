//! A small hand-made plan for the dump tests, with its facts worked out by hand.
//!
//! Program "tiny", 2 streams, 6 steps, 2 events; buffers of every class: 2 params, an input,
//! a state, an output, 4 activations (one in-place pair: silu then add write buffer 7) and 2
//! workspaces. Arena 3072 B (24 map rows of 128 B), lower bound 2304 B.
//!
//! ```text
//! step:                   0     1     2     3     4     5
//! 4 act  [0, 1024)       ###   ###
//! 5 act  [1024, 2048)          ###   ###   ###
//! 6 act  [2048, 2560)                ###   ###   ###
//! 7 act  [0, 768)                          ###   ###   ###
//! 8 ws   [2816, 3072)                www
//! 9 ws   [1024, 1536)                                  www
//! live arena bytes:     1024  2048  1792  2304  1280  1280
//! ```
//!
//! So the peak is step 3 (2304 B = the lower bound), ratio 3072 / 2304 = 1.3333,
//! fragmentation 1 - 2304 / 3072 = 25.00 %, and the buffers live there by size are 5 (1024 B,
//! written by step 1), 7 (768 B, steps 3 and 4), 6 (512 B, step 2).

use crate::{Buffer, BufferClass, Plan, PlanOptions, Step};

fn step(node: usize, op: &str, stream: usize, waits: &[usize], records: &[usize]) -> Step {
    Step {
        node,
        op: op.to_string(),
        stream,
        waits: waits.to_vec(),
        records: records.to_vec(),
    }
}

#[allow(clippy::too_many_arguments)]
fn buffer(
    id: usize,
    name: &str,
    class: BufferClass,
    size: u64,
    offset: Option<u64>,
    (start, end): (usize, usize),
    stream: usize,
    values: &[&str],
    uses: usize,
) -> Buffer {
    Buffer {
        id,
        name: name.to_string(),
        class,
        size,
        offset,
        start,
        end,
        stream,
        values: values.iter().map(|v| v.to_string()).collect(),
        uses,
    }
}

/// The tiny plan (see the module doc).
pub(super) fn tiny_plan() -> Plan {
    use BufferClass::*;
    Plan {
        program: "tiny".to_string(),
        options: PlanOptions {
            streams: 2,
            alignment: 256,
        },
        schedule: vec![
            step(4, "embedding", 0, &[], &[]),
            step(5, "rms_norm(eps=1e-05)", 0, &[], &[0]),
            step(6, "matmul", 1, &[0], &[1]),
            step(7, "silu", 0, &[], &[]),
            step(8, "add", 0, &[1], &[]),
            step(9, "matmul", 0, &[], &[]),
        ],
        buffers: vec![
            buffer(0, "embed", Param, 2048, None, (0, 5), 0, &["0.0"], 1),
            buffer(1, "w", Param, 1024, None, (0, 5), 0, &["1.0"], 2),
            buffer(2, "tokens", Input, 64, None, (0, 0), 0, &["2.0"], 1),
            buffer(3, "cache", State, 4096, None, (0, 5), 0, &["3.0"], 0),
            buffer(
                4,
                "embedding %4.0",
                Activation,
                1024,
                Some(0),
                (0, 1),
                0,
                &["4.0"],
                1,
            ),
            buffer(
                5,
                "rms_norm %5.0",
                Activation,
                1024,
                Some(1024),
                (1, 3),
                0,
                &["5.0"],
                2,
            ),
            buffer(
                6,
                "matmul, proj %6.0",
                Activation,
                512,
                Some(2048),
                (2, 4),
                1,
                &["6.0"],
                1,
            ),
            buffer(
                7,
                "silu \"gate\" <&> %7.0",
                Activation,
                768,
                Some(0),
                (3, 5),
                0,
                &["7.0", "8.0"],
                2,
            ),
            buffer(
                8,
                "matmul %6 workspace",
                Workspace,
                256,
                Some(2816),
                (2, 2),
                1,
                &[],
                0,
            ),
            buffer(
                9,
                "matmul %9 workspace",
                Workspace,
                512,
                Some(1024),
                (5, 5),
                0,
                &[],
                0,
            ),
            buffer(10, "logits", Output, 2048, None, (5, 5), 0, &["9.0"], 0),
        ],
        value_buffers: [
            ("0.0", 0),
            ("1.0", 1),
            ("2.0", 2),
            ("3.0", 3),
            ("4.0", 4),
            ("5.0", 5),
            ("6.0", 6),
            ("7.0", 7),
            ("8.0", 7),
            ("9.0", 10),
        ]
        .map(|(value, buffer)| (value.to_string(), buffer))
        .to_vec(),
        arena_bytes: 3072,
        lower_bound_bytes: 2304,
        schedule_strategy: "memory-greedy".to_string(),
        offset_strategy: "first-fit".to_string(),
        offset_candidates: vec![
            ("first-fit".to_string(), 3072),
            ("best-fit".to_string(), 3328),
        ],
        events: 2,
        in_place_writes: Vec::new(),
        recomputed: Vec::new(),
        communication_stream: None,
        hash: "0123456789abcdef".to_string(),
    }
}
