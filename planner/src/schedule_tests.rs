use super::*;
use crate::buffers::Buffers;
use crate::offsets::{align_up, lower_bound, ArenaItem};
use crate::test_graphs::{train_like, two_branches};

/// Peak live arena bytes (256-aligned) of `order`.
fn peak(program: &Program, order: &[usize]) -> u64 {
    let buffers = Buffers::build(program, order).unwrap();
    let items: Vec<ArenaItem> = buffers
        .list
        .iter()
        .filter(|b| b.class.in_arena())
        .map(|b| ArenaItem::serial(align_up(b.size, 256).unwrap(), b.start, b.end))
        .collect();
    lower_bound(&items).unwrap()
}

#[test]
fn adamw_early_comes_first_in_train_graphs_and_node_order_first_elsewhere() {
    let g = two_branches();
    let program = Program::new(&g)
        .unwrap()
        .with_workspaces(&crate::testing::TestWorkspaces);
    let names: Vec<_> = candidates(&program).iter().map(|c| c.name).collect();
    assert_eq!(names, [NODE_ORDER, LIST]);
    assert_eq!(candidates(&program)[0].order, [0, 1, 2, 3, 4]);

    let g = train_like();
    let program = Program::new(&g)
        .unwrap()
        .with_workspaces(&crate::testing::TestWorkspaces);
    let names: Vec<_> = candidates(&program).iter().map(|c| c.name).collect();
    assert_eq!(names, [ADAMW_EARLY, NODE_ORDER, LIST]);
    for c in candidates(&program) {
        check_order(&program, c.name, &c.order).unwrap();
    }
}

#[test]
fn list_scheduler_reduces_each_branch_before_starting_the_next() {
    let g = two_branches();
    let program = Program::new(&g)
        .unwrap()
        .with_workspaces(&crate::testing::TestWorkspaces);
    let order = list_schedule(&program);
    // t1, r1, t2, r2, z
    assert_eq!(order, [0, 2, 1, 3, 4]);
    let node_order: Vec<usize> = (0..5).collect();
    // z = r1 + r2 is an output computed in r1's buffer, so r1 is not in the arena.
    assert_eq!(peak(&program, &node_order), 2 * 4096);
    assert_eq!(peak(&program, &order), 4096 + 256);
}

#[test]
fn adamw_early_updates_right_after_the_gradient_and_has_the_lowest_peak() {
    let g = train_like();
    let program = Program::new(&g)
        .unwrap()
        .with_workspaces(&crate::testing::TestWorkspaces);
    let order = adamw_early(&program);
    assert_eq!(order, [0, 1, 5, 2, 3, 4, 6, 7]);
    let node_order: Vec<usize> = (0..8).collect();
    let list = list_schedule(&program);
    // The list scheduler takes the small long-lived broadcast (op 2) first.
    assert_eq!(list[0], 2);
    assert_eq!(peak(&program, &order), 16384 + 1024);
    assert_eq!(peak(&program, &node_order), 16384 + 1024 + 256);
    assert_eq!(peak(&program, &list), 16384 + 1024 + 256);
}

#[test]
fn check_order_rejects_duplicates_missing_ops_and_early_consumers() {
    let g = two_branches();
    let program = Program::new(&g)
        .unwrap()
        .with_workspaces(&crate::testing::TestWorkspaces);
    let rule = |order: &[usize]| match check_order(&program, "test", order) {
        Err(Error::Unplannable { rule, detail }) => format!("{rule}: {detail}"),
        other => panic!("expected an error, got {other:?}"),
    };
    assert!(rule(&[0, 0, 1, 2, 3, 4]).contains("runs twice"));
    assert!(rule(&[0, 1, 2, 3]).contains("never runs"));
    assert!(rule(&[2, 0, 1, 3, 4]).contains("before the producer"));
    assert!(rule(&[0, 1, 2, 3, 9]).contains("does not exist"));
    check_order(&program, "test", &[1, 3, 0, 2, 4]).unwrap();
}
