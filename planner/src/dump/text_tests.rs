//! Tests of the text dump on the hand-made plan (see `fixture` for the hand count) and on
//! plans built to exercise the map's scaling.

use std::time::Duration;

use super::to_text;
use crate::dump::fixture::tiny_plan;
use crate::{Buffer, BufferClass, Plan};

/// The text from the line starting with `heading` to the next blank line or the end.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text
        .find(&format!("\n{heading}"))
        .map(|at| at + 1)
        .unwrap_or_else(|| panic!("no section {heading:?} in\n{text}"));
    let rest = &text[start..];
    rest.find("\n\n").map_or(rest, |end| &rest[..end + 1])
}

#[test]
fn summary_has_the_hand_computed_numbers() {
    let text = to_text(&tiny_plan(), None);
    for line in [
        "plan tiny\n",
        "\n  streams                2\n",
        "\n  steps                  6\n",
        "\n  buffers                11\n",
        "\n    param             2  3.00 KiB (3072 B)\n",
        "\n    input             1  64 B\n",
        "\n    output            1  2.00 KiB (2048 B)\n",
        "\n    state             1  4.00 KiB (4096 B)\n",
        "\n    activation        4  3.25 KiB (3328 B)\n",
        "\n    workspace         2  768 B\n",
        "\n  arena                  3.00 KiB (3072 B)\n",
        "\n  lower bound            2.25 KiB (2304 B)\n",
        // 3072 / 2304 = 4 / 3; 1 - 2304 / 3072 = 1 / 4.
        "\n  arena / lower bound    1.3333\n",
        "\n  fragmentation          25.00 % (1 - lower bound / arena)\n",
        "\n  events                 2\n",
        "\n  schedule strategy      memory-greedy\n",
        "\n  offset strategy        first-fit\n",
        "\n    first-fit  3.00 KiB (3072 B)  (chosen)\n",
        "\n    best-fit   3.25 KiB (3328 B)\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(!text.contains("planning time"), "no time unless given");
}

#[test]
fn planning_time_is_printed_when_given() {
    let text = to_text(&tiny_plan(), Some(Duration::from_micros(12_500)));
    assert!(
        text.contains("\n  planning time          12.500 ms\n"),
        "{text}"
    );
}

#[test]
fn buffer_table_is_aligned() {
    let text = to_text(&tiny_plan(), None);
    let table = section(&text, "buffers\n");
    let expected = "\
buffers
  id  class       offset  size  start  end  stream  uses  name
   0  param            -  2048      0    5       0     1  embed
   1  param            -  1024      0    5       0     2  w
   2  input            -    64      0    0       0     1  tokens
   3  state            -  4096      0    5       0     0  cache
   4  activation       0  1024      0    1       0     1  embedding %4.0
   5  activation    1024  1024      1    3       0     2  rms_norm %5.0
   6  activation    2048   512      2    4       1     1  matmul, proj %6.0
   7  activation       0   768      3    5       0     2  silu \"gate\" <&> %7.0
   8  workspace     2816   256      2    2       1     0  matmul %6 workspace
   9  workspace     1024   512      5    5       0     0  matmul %9 workspace
  10  output           -  2048      5    5       0     0  logits
";
    assert_eq!(table, expected);
}

#[test]
fn peak_section_lists_live_buffers_by_size_with_writers() {
    let text = to_text(&tiny_plan(), None);
    // Step 3 holds 5 (1024 B), 7 (768 B), 6 (512 B): size order, not id order. Buffer 7 is
    // written in place by two steps.
    let expected = "\
at the peak step
  step 3 (node 7, stream 0): silu
  live arena bytes 2.25 KiB (2304 B) in 3 buffers
  rank  id  class                    size  steps  name                  written by
     1   5  activation  1.00 KiB (1024 B)  1..3   rms_norm %5.0         step 1 rms_norm(eps=1e-05)
     2   7  activation              768 B  3..5   silu \"gate\" <&> %7.0  step 3 silu; step 4 add
     3   6  activation              512 B  2..4   matmul, proj %6.0     step 2 matmul
";
    assert_eq!(section(&text, "at the peak step"), expected);
}

#[test]
fn ascii_map_is_exact() {
    let text = to_text(&tiny_plan(), None);
    // 24 rows of 3072 / 24 = 128 B, highest first; one column per step; '^' under step 3.
    let expected = "\
time x offset map: 24 rows of 128 B (offset 0 at the bottom), 6 columns of 1 step(s); '#' activation, 'w' workspace, '.' free
  2944 |..w...|
  2816 |..w...|
  2688 |......|
  2560 |......|
  2432 |..###.|
  2304 |..###.|
  2176 |..###.|
  2048 |..###.|
  1920 |.###..|
  1792 |.###..|
  1664 |.###..|
  1536 |.###..|
  1408 |.###.w|
  1280 |.###.w|
  1152 |.###.w|
  1024 |.###.w|
   896 |##....|
   768 |##....|
   640 |##.###|
   512 |##.###|
   384 |##.###|
   256 |##.###|
   128 |##.###|
     0 |##.###|
           ^ peak step 3
";
    assert_eq!(section(&text, "time x offset map"), expected);
    assert!(text.ends_with(expected), "the map is the last section");
}

fn activation(id: usize, size: u64, offset: u64, (start, end): (usize, usize)) -> Buffer {
    Buffer {
        id,
        name: format!("a{id}"),
        class: BufferClass::Activation,
        size,
        offset: Some(offset),
        start,
        end,
        stream: 0,
        values: vec![],
        uses: 1,
    }
}

/// `tiny_plan`'s header with `steps` copies of one step and the given buffers.
fn plan_with(steps: usize, buffers: Vec<Buffer>, arena_bytes: u64) -> Plan {
    let mut plan = tiny_plan();
    let step = plan.schedule[0].clone();
    plan.schedule = vec![step; steps];
    plan.buffers = buffers;
    plan.value_buffers.clear();
    plan.arena_bytes = arena_bytes;
    plan
}

#[test]
fn long_schedules_are_downsampled_to_100_columns() {
    // 250 steps in 100 columns of 2 or 3 steps; a 2400 B arena in 24 rows of 100 B. One
    // buffer over steps 0..=99 (columns 0..=39) in the low half; the peak at step 100 (column
    // 40, steps 100..102) where a second buffer fills the top row only.
    let plan = plan_with(
        250,
        vec![
            activation(0, 1200, 0, (0, 99)),
            activation(1, 100, 2300, (100, 100)),
            activation(2, 1250, 0, (100, 100)),
        ],
        2400,
    );
    let text = to_text(&plan, None);
    let map = section(&text, "time x offset map");
    let lines: Vec<&str> = map.lines().collect();
    assert!(
        lines[0].contains("24 rows of 100 B")
            && lines[0].contains("100 columns of about 2 step(s)"),
        "{}",
        lines[0]
    );
    let row = |cells: &str| format!("|{cells}|");
    let top = format!("{}#{}", ".".repeat(40), ".".repeat(59));
    let low = format!("{}{}", "#".repeat(41), ".".repeat(59));
    assert_eq!(lines[1], format!("  2300 {}", row(&top)));
    // Row 12 (1200..1300) holds only the peak buffer's last 50 bytes: still drawn.
    assert_eq!(
        lines[12],
        format!(
            "  1200 {}",
            row(&format!("{}#{}", ".".repeat(40), ".".repeat(59)))
        )
    );
    assert_eq!(lines[24], format!("     0 {}", row(&low)));
    assert_eq!(
        lines[25],
        format!("{}^ peak step 100", " ".repeat(2 + 4 + 2 + 40))
    );
    assert_eq!(lines.len(), 26);
}

fn workspace(id: usize, size: u64, offset: u64, lifetime: (usize, usize)) -> Buffer {
    Buffer {
        class: BufferClass::Workspace,
        ..activation(id, size, offset, lifetime)
    }
}

#[test]
fn small_arenas_get_one_row_per_byte() {
    // Row 4 at step 1 holds one byte of each class (a bad plan): a tie, drawn '#'. Live bytes
    // are 5 at step 0 and 4 at step 1, so the peak is step 0.
    let plan = plan_with(
        2,
        vec![
            activation(0, 2, 0, (0, 0)),
            workspace(1, 3, 2, (0, 1)),
            activation(2, 1, 4, (1, 1)),
        ],
        5,
    );
    let text = to_text(&plan, None);
    let expected = "\
time x offset map: 5 rows of 1 B (offset 0 at the bottom), 2 columns of 1 step(s); '#' activation, 'w' workspace, '.' free
  4 |w#|
  3 |ww|
  2 |ww|
  1 |#.|
  0 |#.|
     ^ peak step 0
";
    assert_eq!(section(&text, "time x offset map"), expected);
}

#[test]
fn a_shared_cell_shows_the_class_that_covers_more_of_it() {
    // Rows of 96 / 24 = 4 B. Row 0: 1 B activation, 3 B workspace; row 1: 3 B activation,
    // 1 B workspace.
    let plan = plan_with(
        1,
        vec![
            activation(0, 1, 0, (0, 0)),
            workspace(1, 3, 1, (0, 0)),
            activation(2, 3, 4, (0, 0)),
            workspace(3, 1, 7, (0, 0)),
        ],
        96,
    );
    let text = to_text(&plan, None);
    let lines: Vec<&str> = section(&text, "time x offset map").lines().collect();
    assert_eq!(lines[22], "   8 |.|");
    assert_eq!(lines[23], "   4 |#|");
    assert_eq!(lines[24], "   0 |w|");
}

#[test]
fn at_most_ten_buffers_are_listed_at_the_peak() {
    let buffers = (0..12)
        .map(|id| activation(id, 100 + id as u64, 200 * id as u64, (0, 0)))
        .collect();
    let text = to_text(&plan_with(1, buffers, 2400), None);
    let peak = section(&text, "at the peak step");
    assert!(
        peak.contains("\n     1  11  activation"),
        "largest first: {peak}"
    );
    assert!(peak.contains("\n    10   2  activation"), "{peak}");
    assert!(!peak.contains("\n    11 "), "{peak}");
    // Buffers 0 and 1 are left: 100 + 101 bytes.
    assert!(
        peak.ends_with("  ... and 2 more buffers, 201 B\n"),
        "{peak}"
    );
}
