#!/usr/bin/env python3
"""How far transformers' own bf16 inference is from its float64 golden logits.

kiln's bf16 inference is checked against the float64 logits of tests/golden
(`tests/golden.rs`); this gives the same measure for Hugging Face transformers run in
bfloat16 on the same models and tokens, so the two can be compared. For each case it prints
the relative L2 error of the logits against golden.safetensors:

  f64 on bf16 weights  the weights rounded to bf16, every step in float64 (the weights'
                       rounding alone: kiln's test prints the same measure as "f32 on the bf16
                       weights")
  bf16 (DEVICE)        `from_pretrained` then `.to(torch.bfloat16)`, SDPA attention: what a
                       user of transformers runs in bf16 (norms upcast inside, as transformers
                       does), on each device given

Usage: python3 bf16_reference.py GOLDEN_DIR [DEVICE ...]   (GOLDEN_DIR: tests/golden; devices
cpu and/or cuda, default cpu)
"""

import os
import sys

import torch
import transformers
from safetensors.torch import load_file

CASES = ["qwen2_gqa_bias", "llama_mha_tied", "llama_bias_headdim"]


def rel_l2(got, want):
    got, want = got.to(torch.float64), want.to(torch.float64)
    return (torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want)).item()


def rmsnorm_forward_keep_dtype(self, hidden_states):
    # As make_golden.py: transformers' RMSNorm computes in float32, which would round a
    # float64 model.
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states


def load(case_dir, dtype, device):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        case_dir, attn_implementation="sdpa"
    )
    model.train(False)
    return model.to(device=device, dtype=dtype)


def logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=tokens.to(model.device)).logits.cpu()


def main():
    golden_dir = sys.argv[1]
    devices = sys.argv[2:] or ["cpu"]
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    rows = []
    for case in CASES:
        case_dir = os.path.join(golden_dir, case)
        tokens = load_file(os.path.join(case_dir, "tokens.safetensors"))["tokens"]
        want = load_file(os.path.join(case_dir, "golden.safetensors"))["logits"]
        row = [case]
        for device in devices:
            row.append(rel_l2(logits(load(case_dir, torch.bfloat16, device), tokens), want))
        # The bf16 weights in float64, norms kept in float64.
        families = [transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm,
                    transformers.models.llama.modeling_llama.LlamaRMSNorm]
        saved = [family.forward for family in families]
        for family in families:
            family.forward = rmsnorm_forward_keep_dtype
        model = load(case_dir, torch.float32, "cpu")
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(param.to(torch.bfloat16).to(param.dtype))
        row.append(rel_l2(logits(model.to(torch.float64), tokens), want))
        for family, forward in zip(families, saved):
            family.forward = forward
        rows.append(row)
    header = ["case"] + [f"bf16 ({device})" for device in devices] + ["f64 on bf16 weights"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join([row[0]] + [f"{e:.3e}" for e in row[1:]]) + " |")


if __name__ == "__main__":
    main()
