#!/usr/bin/env python3
"""Golden outputs for kiln's parity tests, computed by Hugging Face transformers in float64.

For each case this builds a small random Hugging Face model, saves it as a model directory
(config.json + model.safetensors in float32, exactly as `save_pretrained` writes them), draws
random token ids, and computes in float64 on the CPU:

  logits [B,T,V], the causal-LM loss (mean cross-entropy of logits[:, :-1] against
  tokens[:, 1:]), and the gradient of that loss for every parameter under its Hugging Face name.

float64 is kept end to end: RMSNorm is patched to stay in the input dtype (transformers upcasts
to float32 and back, which would round a float64 model to float32), and attention runs through
SDPA (the eager path computes its softmax in float32). RoPE angles stay as transformers computes
them, in float32; kiln's kernel reproduces exactly that.

Usage: python3 make_golden.py OUT_DIR   (writes OUT_DIR/<case>/{config.json, model.safetensors,
tokens.safetensors, golden.safetensors})
"""

import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

CASES = {
    # Qwen2 with grouped-query attention (4 query heads per 2 kv heads) and q/k/v biases,
    # untied output head, a large rope theta.
    "qwen2_gqa_bias": dict(
        family="qwen2",
        hidden_size=32,
        intermediate_size=56,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=61,
        max_position_embeddings=64,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        batch=3,
        seq=9,
        seed=1,
    ),
    # Llama with multi-head attention (kv heads = query heads), tied embeddings, no biases.
    "llama_mha_tied": dict(
        family="llama",
        hidden_size=24,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=3,
        vocab_size=53,
        max_position_embeddings=64,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        batch=2,
        seq=8,
        seed=2,
    ),
    # Llama with every bias switched on and a head_dim that is not hidden/heads.
    "llama_bias_headdim": dict(
        family="llama",
        hidden_size=24,
        intermediate_size=36,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=10,
        vocab_size=47,
        max_position_embeddings=64,
        rope_theta=500000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attention_bias=True,
        mlp_bias=True,
        batch=2,
        seq=6,
        seed=3,
    ),
}


def rmsnorm_forward_keep_dtype(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states


def build_model(case):
    spec = dict(case)
    family = spec.pop("family")
    for key in ("batch", "seq", "seed"):
        spec.pop(key)
    if family == "qwen2":
        config = transformers.Qwen2Config(use_sliding_window=False, **spec)
        norm_class = transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm
    else:
        config = transformers.LlamaConfig(**spec)
        norm_class = transformers.models.llama.modeling_llama.LlamaRMSNorm
    norm_class.forward = rmsnorm_forward_keep_dtype
    config._attn_implementation = "sdpa"
    model = transformers.AutoModelForCausalLM.from_config(config)
    return model.to(torch.float32)


def randomize(model, generator):
    """Weights large enough that the logits are far from uniform (a sharper test than the
    default 0.02 initialization); norm weights near 1; biases small."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float64)
            if "norm" in name:
                value = 1.0 + 0.2 * noise
            elif name.endswith("bias"):
                value = 0.1 * noise
            else:
                value = 0.3 * noise
            param.copy_(value.to(param.dtype))


def main():
    out_dir = sys.argv[1]
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for name, case in CASES.items():
        generator = torch.Generator().manual_seed(case["seed"])
        model = build_model(case)
        randomize(model, generator)
        case_dir = os.path.join(out_dir, name)
        os.makedirs(case_dir, exist_ok=True)
        model.save_pretrained(case_dir, safe_serialization=True)

        tokens = torch.randint(
            0, case["vocab_size"], (case["batch"], case["seq"]), generator=generator
        )
        save_file({"tokens": tokens.to(torch.int64)}, os.path.join(case_dir, "tokens.safetensors"))

        model = model.to(torch.float64)
        model.train(False)
        out = model(input_ids=tokens, labels=tokens)
        # transformers' loss upcasts the logits with .float() (to float32); recompute the same
        # causal-LM loss in float64 and use that, checking the two agree.
        vocab = out.logits.shape[-1]
        loss = torch.nn.functional.cross_entropy(
            out.logits[:, :-1].reshape(-1, vocab), tokens[:, 1:].reshape(-1)
        )
        assert abs(loss.item() - out.loss.item()) < 1e-5 * abs(loss.item()), (loss, out.loss)
        loss.backward()
        golden = {
            "logits": out.logits.detach().contiguous(),
            "loss": loss.detach().reshape(1),
        }
        for param_name, param in model.named_parameters():
            golden[f"grad.{param_name}"] = param.grad.detach().contiguous()
        save_file(golden, os.path.join(case_dir, "golden.safetensors"))
        with open(os.path.join(case_dir, "config.json")) as f:
            saved = json.load(f)
        print(
            f"{name}: loss {loss.item():.12f} (transformers' float32 loss "
            f"{out.loss.item():.12f}), logits {tuple(out.logits.shape)}, "
            f"{len(golden) - 2} gradients"
        )
        print(json.dumps(saved, sort_keys=True))


if __name__ == "__main__":
    main()
