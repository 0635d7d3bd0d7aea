#!/usr/bin/env python3
"""How far transformers' own bf16 inference is from its float64 golden logits.

kiln's bf16 inference is checked against the float64 logits of tests/golden
(`tests/golden.rs`); this gives the same measure for Hugging Face transformers run in
bfloat16 on the same models and tokens, so the two can be compared. For each case it prints
the relative L2 error of the logits against golden.safetensors:

  bf16 (DEVICE)        `from_pretrained(..., dtype=torch.bfloat16)`, SDPA attention: what a
                       user of transformers runs in bf16 (its norms computed in float32 inside,
                       RoPE's frequencies kept in float32), on each device given
  f64 on bf16 weights  the weights rounded to bf16, then every step in float64 but RoPE's
                       angles (float32, as transformers computes them and make_golden.py keeps
                       them): the weights' rounding alone. kiln's test prints its own measure of
                       it ("f32 on the bf16 weights": the same weights, every step in f32).

Usage: python3 bf16_reference.py GOLDEN_DIR [DEVICE ...]   (GOLDEN_DIR: tests/golden; devices
cpu and/or cuda, default cpu)
"""

import os
import sys

import torch
import transformers
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import CASES, rmsnorm_forward_keep_dtype  # noqa: E402

NORMS = [
    transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm,
    transformers.models.llama.modeling_llama.LlamaRMSNorm,
]


def rel_l2(got, want):
    got, want = got.to(torch.float64), want.to(torch.float64)
    return (torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want)).item()


def load(case_dir, dtype, device):
    """The case's model as `from_pretrained` gives it in `dtype` (older transformers call the
    argument `torch_dtype`), on `device`."""
    for argument in ("dtype", "torch_dtype"):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            case_dir, attn_implementation="sdpa", **{argument: dtype}
        )
        if next(model.parameters()).dtype == dtype:
            model.train(False)
            return model.to(device)
    raise SystemExit(f"{case_dir}: from_pretrained gave no {dtype} parameters")


def logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=tokens.to(model.device)).logits.cpu()


def rounded_weights_in_f64(case_dir, tokens):
    """Logits of the case's weights rounded to bf16, in float64 (norms kept in float64)."""
    saved = [norm.forward for norm in NORMS]
    try:
        for norm in NORMS:
            norm.forward = rmsnorm_forward_keep_dtype
        model = load(case_dir, torch.float32, "cpu")
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(param.to(torch.bfloat16).to(param.dtype))
        return logits(model.to(torch.float64), tokens)
    finally:
        for norm, forward in zip(NORMS, saved):
            norm.forward = forward


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    golden_dir = sys.argv[1]
    devices = sys.argv[2:] or ["cpu"]
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    header = ["case"] + [f"bf16 ({device})" for device in devices] + ["f64 on bf16 weights"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for case in CASES:
        case_dir = os.path.join(golden_dir, case)
        tokens = load_file(os.path.join(case_dir, "tokens.safetensors"))["tokens"]
        want = load_file(os.path.join(case_dir, "golden.safetensors"))["logits"]
        errors = [
            rel_l2(logits(load(case_dir, torch.bfloat16, device), tokens), want)
            for device in devices
        ]
        errors.append(rel_l2(rounded_weights_in_f64(case_dir, tokens), want))
        print("| " + " | ".join([case] + [f"{e:.3e}" for e in errors]) + " |")


if __name__ == "__main__":
    main()
