#!/usr/bin/env python3
"""BENCHMARKS.md's tables from one device run: `kiln bench --json` lines (bench.jsonl) and the
PyTorch anchor's JSON lines (anchor.log), both written by tools/device/gpu_check.sh.

Usage: tools/device/bench_table.py OUT_DIR
"""
import json
import sys

out = sys.argv[1]
kiln = [json.loads(line) for line in open(f"{out}/bench.jsonl") if line.startswith("{")]
torch = [json.loads(line) for line in open(f"{out}/anchor.log") if line.startswith("{")]
torch_names = {"qwen2.5-0.5b": "qwen2.5-0.5b", "deepseek-r1-distill-qwen-1.5b": "ds-r1-qwen-1.5b"}
GIB = 2 ** 30


def anchor(model, case):
    for row in torch:
        if row["model"] == torch_names[model] and row["case"] == case:
            return row
    return None


def kiln_row(model, program, precision, mode, gemv=False):
    for row in kiln:
        if (row["model"], row["program"], row["precision"], row["mode"]) == (model, program, precision, mode) \
                and row.get("gemv", False) == gemv:
            return row
    return None


def fmt_kiln(row):
    if row is None:
        return "not run"
    text = f"{row['median_ms']:.2f} ms (p95 {row['p95_ms']:.2f}), {row['launches_per_step']} launches"
    if row["program"] == "train":
        text += f"; beyond {row['beyond_params_and_state_bytes'] / GIB:.2f} GiB"
    if row.get("floor_fraction"):
        text += f"; {100 * row['floor_fraction']:.0f}% of the {row['hbm_floor_ms']:.3f} ms HBM floor"
    if row.get("capture_ms"):
        text += f"; capture {row['capture_ms']:.1f} ms"
    return text


def fmt_torch(row, what):
    if row is None:
        return "not run"
    text = f"{what}: {row['ms']:.2f} ms"
    if "peak_gib" in row:
        text += f"; beyond {row['peak_gib'] - row['weights_gib']:.2f} GiB"
    return text


def ratio(k, t):
    if k is None or t is None:
        return ""
    r = t["ms"] / k["median_ms"]
    return f"{r:.2f}× {'faster' if r > 1 else 'SLOWER'}"


for model in ["qwen2.5-0.5b", "deepseek-r1-distill-qwen-1.5b"]:
    print(f"\n### {model}\n")
    print("| program | kiln | PyTorch, same run | kiln vs PyTorch |")
    print("|---|---|---|---|")
    rows = [
        ("decode B=1 ctx 512, replayed graph", kiln_row(model, "decode", "F32", "graph"),
         anchor(model, "decode_b1_ctx512_bf16_cudagraph"), "CUDA graph, bf16"),
        ("decode B=1 ctx 512, eager", kiln_row(model, "decode", "F32", "eager"),
         anchor(model, "decode_b1_ctx512_bf16_eager"), "eager, bf16"),
        ("prefill B=1 T=512, f32", kiln_row(model, "prefill", "F32", "graph"),
         anchor(model, "prefill_b1_t512_bf16_eager"), "eager, bf16"),
        ("prefill B=1 T=512, bf16 GEMM inputs", kiln_row(model, "prefill", "Bf16Gemm", "graph"),
         anchor(model, "prefill_b1_t512_bf16_eager"), "eager, bf16"),
        ("train step B=1 T=512, f32", kiln_row(model, "train", "F32", "graph"),
         anchor(model, "train_fwd_bwd_b1_t512_fp32"), "fwd+bwd fp32"),
        ("train step B=1 T=512, bf16 GEMM inputs", kiln_row(model, "train", "Bf16Gemm", "graph"),
         anchor(model, "train_fwd_bwd_b1_t512_bf16autocast"), "fwd+bwd bf16 autocast"),
    ]
    for name, k, t, what in rows:
        print(f"| {name} | {fmt_kiln(k)} | {fmt_torch(t, what)} | {ratio(k, t)} |")
