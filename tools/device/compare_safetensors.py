#!/usr/bin/env python3
"""Relative L2 error of every tensor of B against A (two safetensors files of `kiln eval`).

Usage: compare_safetensors.py A B LIMIT   (exit 1 when any tensor is off by more than LIMIT)
"""
import sys

import numpy as np
from safetensors.numpy import load_file

a, b, limit = load_file(sys.argv[1]), load_file(sys.argv[2]), float(sys.argv[3])
worst = 0.0
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
for name in sorted(a):
    want, got = a[name].astype(np.float64), b[name].astype(np.float64)
    error = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300)
    worst = max(worst, error)
    if not error <= limit:
        print(f"{name}: relative error {error:.3e} > {limit:.0e}")
        sys.exit(1)
print(f"{len(a)} tensors within {limit:.0e} (worst {worst:.3e})")
