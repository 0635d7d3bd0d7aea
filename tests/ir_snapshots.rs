//! Snapshots of the IR text of the tiny programs (reviewed like code: `cargo insta review`).

use kiln_frontend::model::ModelConfig;
use kiln_frontend::programs::{build, ProgramKind, ProgramOptions};

fn snapshot(kind: ProgramKind) {
    let options = ProgramOptions {
        batch: 2,
        seq: 4,
        max_seq: Some(8),
        ..Default::default()
    };
    let graph = build(kind, &ModelConfig::tiny(), &options).unwrap();
    kiln_ir::verify(&graph).unwrap();
    let text = kiln_ir::print(&graph);
    assert_eq!(
        text,
        kiln_ir::print(&build(kind, &ModelConfig::tiny(), &options).unwrap()),
        "deterministic"
    );
    insta::with_settings!({ snapshot_path => "../snapshots", prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!(format!("ir_tiny_{}", kind.name()), text);
    });
}

#[test]
fn tiny_prefill() {
    snapshot(ProgramKind::Prefill);
}

#[test]
fn tiny_decode() {
    snapshot(ProgramKind::Decode);
}

#[test]
fn tiny_train() {
    snapshot(ProgramKind::Train);
}
