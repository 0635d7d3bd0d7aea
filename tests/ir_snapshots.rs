//! Snapshots of the IR text of the tiny programs (reviewed like code: `cargo insta review`).

use kiln_frontend::model::{ModelConfig, Precision};
use kiln_frontend::programs::{build, ProgramKind, ProgramOptions};

fn snapshot(kind: ProgramKind) {
    snapshot_as(kind, Precision::F32, &format!("ir_tiny_{}", kind.name()));
}

fn snapshot_as(kind: ProgramKind, precision: Precision, name: &str) {
    let options = ProgramOptions {
        batch: 2,
        seq: 4,
        max_seq: Some(8),
        precision,
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
        insta::assert_snapshot!(name.to_string(), text);
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

/// The fused bf16 decode program: one `linear` each for q/k/v, o, gate/up with SwiGLU, down
/// and the head, one `rope_kv_write` per layer; bf16 weights and caches read by the f32 ops
/// directly.
#[test]
fn tiny_decode_bf16_fused() {
    snapshot_as(ProgramKind::Decode, Precision::Bf16, "ir_tiny_decode_bf16");
}

/// The fused bf16 prefill program: the same linears, one staged `rope_kv_write` per layer (the
/// caches written, q, k and v made the f16 rows of the attention), and FlashAttention rounding
/// to f16 over the prompt's own keys.
#[test]
fn tiny_prefill_bf16_fused() {
    snapshot_as(
        ProgramKind::Prefill,
        Precision::Bf16,
        "ir_tiny_prefill_bf16",
    );
}

/// The mixed-precision train program: bf16 GEMM inputs, and FlashAttention forward (`out`,
/// `lse`) and backward (from `out` and `lse`, no probabilities) in every layer.
#[test]
fn tiny_train_bf16_gemm() {
    snapshot_as(
        ProgramKind::Train,
        Precision::Bf16Gemm,
        "ir_tiny_train_bf16_gemm",
    );
}

/// Mixed precision with SwiGLU's gate and up kept in bf16: their GEMMs are `rounded_matmul`s
/// of bf16 results, `rounded_swiglu` and `rounded_swiglu_backward` read them as bf16, and no
/// cast is left between them and their gradients' GEMMs.
#[test]
fn tiny_train_bf16_swiglu() {
    snapshot_as(
        ProgramKind::Train,
        Precision::Bf16Swiglu,
        "ir_tiny_train_bf16_swiglu",
    );
}
