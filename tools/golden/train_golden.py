#!/usr/bin/env python3
"""Golden training run for `kiln train`'s parity test, computed by Hugging Face transformers
and torch.optim.AdamW in float64.

The model is make_golden.py's `qwen2_gqa_bias` case (Qwen2, grouped-query attention, q/k/v
biases, untied head), saved in float32 as `save_pretrained` writes it. The data is a flat u16
file of token ids. The run reads its batches as kiln's `--sampling sequential` does (llm.c's
loader: batch k takes the B*T + 1 ids from k*B*T on, row b the T + 1 from k*B*T + b*T) and
trains for STEPS steps:

  loss       mean cross-entropy of logits [B*T, V] against each row's next ids
  clipping   torch.nn.utils.clip_grad_norm_(params, CLIP)
  optimizer  torch.optim.AdamW(foreach=False), weight decay on parameters of 2+ dims only
  schedule   transformers.get_cosine_schedule_with_warmup(WARMUP, STEPS), stepped after the
             optimizer (so step 1 runs at rate 0)

in float64 end to end (RMSNorm kept in the input dtype, as make_golden.py does).

Usage: python3 train_golden.py OUT_DIR   (writes OUT_DIR/train_qwen2/{config.json,
model.safetensors, data.bin, train.json, golden.safetensors}; golden holds `loss`, `lr` and
`grad_norm` per step and `final.<parameter name>`, all float64)
"""

import json
import os
import struct
import sys

import torch
import transformers
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import CASES, build_model, randomize  # noqa: E402

OPTIONS = dict(
    batch=2,
    seq=8,
    steps=20,
    lr=3e-3,
    warmup=3,
    clip_grad_norm=1.0,
    weight_decay=0.1,
    beta1=0.9,
    beta2=0.95,
    eps=1e-8,
    tokens=600,
)


def main():
    out_dir = os.path.join(sys.argv[1], "train_qwen2")
    os.makedirs(out_dir, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    case = CASES["qwen2_gqa_bias"]
    generator = torch.Generator().manual_seed(11)
    model = build_model(case)
    randomize(model, generator)
    model.save_pretrained(out_dir, safe_serialization=True)

    o = OPTIONS
    vocab = case["vocab_size"]
    # Ids with structure to learn (each mostly follows from the one before) and some noise.
    ids = [0]
    noise = torch.randint(0, vocab, (o["tokens"],), generator=generator).tolist()
    for i in range(1, o["tokens"]):
        ids.append(noise[i] if i % 5 == 0 else (ids[-1] * 3 + 1) % vocab)
    data = torch.tensor(ids, dtype=torch.int64)
    with open(os.path.join(out_dir, "data.bin"), "wb") as f:
        f.write(struct.pack(f"<{len(ids)}H", *ids))

    model = model.to(torch.float64)
    model.train(True)
    params = list(model.named_parameters())
    groups = [
        {"params": [p for _, p in params if p.dim() >= 2], "weight_decay": o["weight_decay"]},
        {"params": [p for _, p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(
        groups, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"], foreach=False
    )
    scheduler = transformers.get_cosine_schedule_with_warmup(optimizer, o["warmup"], o["steps"])
    b, t = o["batch"], o["seq"]
    batches = (len(ids) - 1) // (b * t)
    losses, lrs, norms = [], [], []
    for step in range(o["steps"]):
        start = (step % batches) * b * t
        rows = torch.stack([data[start + r * t : start + r * t + t + 1] for r in range(b)])
        x, y = rows[:, :-1], rows[:, 1:]
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), o["clip_grad_norm"])
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        norms.append(norm.item())
        print(f"step {step + 1}: loss {loss.item():.12f} lr {lrs[-1]:.6g} norm {norm.item():.6f}")

    golden = {
        "loss": torch.tensor(losses, dtype=torch.float64),
        "lr": torch.tensor(lrs, dtype=torch.float64),
        "grad_norm": torch.tensor(norms, dtype=torch.float64),
    }
    for name, param in model.named_parameters():
        golden[f"final.{name}"] = param.detach().contiguous()
    save_file(golden, os.path.join(out_dir, "golden.safetensors"))
    with open(os.path.join(out_dir, "train.json"), "w") as f:
        json.dump(OPTIONS, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
