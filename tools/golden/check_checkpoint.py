#!/usr/bin/env python3
"""Loads a `kiln train` checkpoint with transformers' `from_pretrained` and checks it: no
missing, unexpected or mismatched keys, every parameter equal to the file's tensor, and a
finite causal-LM loss on the first sequential batch of a u16 token file.

Usage: python3 check_checkpoint.py CHECKPOINT_DIR DATA_FILE BATCH SEQ
Prints `transformers loaded CHECKPOINT_DIR: loss L` and exits 0, or raises.
"""

import struct
import sys

import torch
import transformers
from safetensors.torch import load_file


def main():
    directory, data_path, batch, seq = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        directory, output_loading_info=True, torch_dtype=torch.float32
    )
    problems = {k: v for k, v in info.items() if v}
    assert not problems, problems
    stored = load_file(f"{directory}/model.safetensors")
    for name, param in model.named_parameters():
        if name in stored:
            assert torch.equal(param.detach(), stored[name]), name
    raw = open(data_path, "rb").read()
    ids = torch.tensor(struct.unpack(f"<{len(raw) // 2}H", raw), dtype=torch.int64)
    rows = torch.stack([ids[r * seq : r * seq + seq + 1] for r in range(batch)])
    with torch.no_grad():
        logits = model(input_ids=rows[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1)
    )
    assert torch.isfinite(loss), loss
    print(f"transformers loaded {directory}: loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
