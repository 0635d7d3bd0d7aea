#!/usr/bin/env python3
"""Where a step's kernel time goes: `ncu --metrics gpu__time_duration.sum --csv` of `kiln bench
--mode eager --warmup 0 --steps 1` (what `tools/device/gpu_check.sh profile` writes) as a table
of kernels by total time, per step.

ncu runs each kernel alone with its caches flushed, so small kernels read long and the total
exceeds the replayed step; compare kernels with each other, not with `kiln bench`.

Usage: tools/device/ncu_table.py NCU_CSV [STEPS_PROFILED]
  STEPS_PROFILED: the steps whose kernels the file holds (default 2: `kiln bench` runs its
  first step, then the timed one)
"""
import collections
import csv
import sys

US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def rows(path):
    """The (kernel name, microseconds) of each profiled launch."""
    header = None
    for row in csv.reader(open(path, newline="")):
        if "Kernel Name" in row and "Metric Value" in row:
            header = row
            continue
        if header is None or len(row) != len(header):
            continue
        entry = dict(zip(header, row))
        if entry["Metric Name"] != "gpu__time_duration.sum":
            continue
        unit = entry["Metric Unit"]
        if unit not in US:
            sys.exit(f"{path}: unknown unit {unit!r} for {entry['Kernel Name']}")
        yield entry["Kernel Name"], float(entry["Metric Value"].replace(",", "")) * US[unit]


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    steps = int(sys.argv[2]) if len(sys.argv) == 3 else 2
    if steps < 1:
        sys.exit("STEPS_PROFILED must be at least 1")
    total = collections.defaultdict(float)
    launches = collections.Counter()
    for name, us in rows(sys.argv[1]):
        # cuBLASLt's names carry template arguments; the first 60 characters tell them apart.
        name = name[:60]
        total[name] += us
        launches[name] += 1
    if not total:
        sys.exit(f"{sys.argv[1]}: no gpu__time_duration.sum rows (was ncu run with --csv?)")
    print("| kernel | launches a step | µs a step | µs each |")
    print("|---|---|---|---|")
    for name, us in sorted(total.items(), key=lambda item: -item[1]):
        count = launches[name] / steps
        print(f"| `{name}` | {count:g} | {us / steps:.1f} | {us / launches[name]:.2f} |")
    print(f"| all | {sum(launches.values()) / steps:g} | {sum(total.values()) / steps:.1f} | |")


if __name__ == "__main__":
    main()
