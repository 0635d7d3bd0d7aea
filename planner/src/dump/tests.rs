//! Tests of the JSON and CSV dumps, the shared helpers, determinism, and that no dump panics
//! on a plan the verifier would reject.

use super::fixture::tiny_plan;
use super::{
    format_bytes, live_arena_bytes, peak_step, placed_buffers, to_csv, to_json, to_svg, to_text,
};
use crate::Plan;

#[test]
fn json_reads_back_to_the_same_plan() {
    let plan = tiny_plan();
    let json = to_json(&plan);
    let back: Plan = serde_json::from_str(&json).expect("the JSON dump parses as a Plan");
    assert_eq!(back, plan);
    assert!(json.ends_with("}\n"), "pretty JSON ending in a newline");
    assert!(json.contains("\n  \"program\": \"tiny\""), "pretty-printed");
}

#[test]
fn json_has_the_required_keys() {
    let plan = tiny_plan();
    let value: serde_json::Value = serde_json::from_str(&to_json(&plan)).unwrap();
    assert_eq!(value["arena_bytes"], 3072);
    assert_eq!(value["lower_bound_bytes"], 2304);
    let buffers = value["buffers"].as_array().expect("buffers is a list");
    assert_eq!(buffers.len(), plan.buffers.len());
    for buffer in buffers {
        for key in ["name", "class", "offset", "size", "start", "end"] {
            assert!(buffer.get(key).is_some(), "buffer {buffer} lacks {key}");
        }
    }
    // Buffer 6: an activation; buffer 0: a param, outside the arena.
    assert_eq!(buffers[6]["name"], "matmul, proj %6.0");
    assert_eq!(buffers[6]["class"], "activation");
    assert_eq!(buffers[6]["offset"], 2048);
    assert_eq!(buffers[6]["size"], 512);
    assert_eq!(buffers[6]["start"], 2);
    assert_eq!(buffers[6]["end"], 4);
    assert_eq!(buffers[0]["class"], "param");
    assert!(buffers[0]["offset"].is_null());
}

#[test]
fn csv_is_exact() {
    let expected = "\
id,name,class,offset,size,start,end,uses
0,embed,param,,2048,0,5,1
1,w,param,,1024,0,5,2
2,tokens,input,,64,0,0,1
3,cache,state,,4096,0,5,0
4,embedding %4.0,activation,0,1024,0,1,1
5,rms_norm %5.0,activation,1024,1024,1,3,2
6,\"matmul, proj %6.0\",activation,2048,512,2,4,1
7,\"silu \"\"gate\"\" <&> %7.0\",activation,0,768,3,5,2
8,matmul %6 workspace,workspace,2816,256,2,2,0
9,matmul %9 workspace,workspace,1024,512,5,5,0
10,logits,output,,2048,5,5,0
";
    assert_eq!(to_csv(&tiny_plan()), expected);
}

#[test]
fn csv_quotes_line_breaks() {
    let mut plan = tiny_plan();
    plan.buffers.truncate(1);
    plan.buffers[0].name = "two\nlines".to_string();
    assert_eq!(
        to_csv(&plan),
        "id,name,class,offset,size,start,end,uses\n0,\"two\nlines\",param,,2048,0,5,1\n"
    );
}

#[test]
fn every_dump_is_the_same_on_two_calls() {
    let plan = tiny_plan();
    assert_eq!(to_json(&plan), to_json(&plan.clone()));
    assert_eq!(to_text(&plan, None), to_text(&plan.clone(), None));
    assert_eq!(to_csv(&plan), to_csv(&plan.clone()));
    assert_eq!(to_svg(&plan), to_svg(&plan.clone()));
}

#[test]
fn bytes_are_formatted_for_people() {
    assert_eq!(format_bytes(0), "0 B");
    assert_eq!(format_bytes(1023), "1023 B");
    assert_eq!(format_bytes(1024), "1.00 KiB (1024 B)");
    assert_eq!(format_bytes(1_572_864), "1.50 MiB (1572864 B)");
    assert_eq!(format_bytes(3 << 30), "3.00 GiB (3221225472 B)");
    assert_eq!(format_bytes(5 << 40), "5.00 TiB (5497558138880 B)");
}

#[test]
fn live_bytes_and_peak_match_the_hand_count() {
    let plan = tiny_plan();
    let live = live_arena_bytes(&plan);
    assert_eq!(live, [1024, 2048, 1792, 2304, 1280, 1280]);
    assert_eq!(peak_step(&live), Some(3));
    // The first of equal maxima wins.
    assert_eq!(peak_step(&[5, 9, 2, 9]), Some(1));
    assert_eq!(peak_step(&[]), None);
}

/// Everything a verifier would reject at once: lifetimes past the schedule and reversed, an
/// arena buffer without an offset, a placement past the arena, sizes at `u64::MAX`, values
/// that are not "node.port", an empty arena.
fn broken_plan() -> Plan {
    let mut plan = tiny_plan();
    plan.buffers[4].end = usize::MAX;
    plan.buffers[5].start = 4; // after its end (3)
    plan.buffers[6].offset = None;
    plan.buffers[7].size = u64::MAX;
    plan.buffers[7].offset = Some(u64::MAX - 1);
    plan.buffers[8].start = 99;
    plan.buffers[8].end = 100;
    plan.buffers[9].values = vec![
        "garbage".into(),
        ".".into(),
        "99999999999999999999.0".into(),
    ];
    plan.buffers[0].size = u64::MAX;
    plan.buffers[1].size = u64::MAX;
    plan.arena_bytes = 0;
    plan.lower_bound_bytes = 0;
    plan.offset_candidates.clear();
    plan
}

#[test]
fn broken_plans_still_dump() {
    let plan = broken_plan();
    let live = live_arena_bytes(&plan);
    // Buffer 4 clamped to steps 0..5; 5 counts nowhere; 7 saturates; 8 starts past the end.
    assert_eq!(live[0], 1024);
    assert_eq!(live[3], u64::MAX);
    let placed: Vec<usize> = placed_buffers(&plan).iter().map(|p| p.buffer.id).collect();
    assert_eq!(placed, [4, 7, 9]);

    let text = to_text(&plan, None);
    assert!(text.contains("n/a (lower bound is 0)"), "{text}");
    assert!(text.contains("n/a (empty arena)"), "{text}");
    assert!(
        text.contains("param             2  16.00 EiB"),
        "saturated sum: {text}"
    );
    let csv = to_csv(&plan);
    assert!(
        csv.contains("\n6,\"matmul, proj %6.0\",activation,,512,2,4,1\n"),
        "{csv}"
    );
    assert_eq!(serde_json::from_str::<Plan>(&to_json(&plan)).unwrap(), plan);
    assert!(to_svg(&plan).ends_with("</svg>\n"));
}

#[test]
fn an_empty_plan_dumps() {
    let mut plan = tiny_plan();
    plan.schedule.clear();
    plan.buffers.clear();
    plan.value_buffers.clear();
    plan.arena_bytes = 0;
    let text = to_text(&plan, None);
    assert!(text.contains("none: the schedule is empty"), "{text}");
    assert!(text.contains("nothing to draw"), "{text}");
    assert_eq!(to_csv(&plan), "id,name,class,offset,size,start,end,uses\n");
    assert!(to_svg(&plan).contains("no arena buffers to draw"));
}
