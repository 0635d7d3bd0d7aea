#!/usr/bin/env python3
"""Where a step's kernel time goes: `ncu --metrics gpu__time_duration.sum,dram__bytes.sum --csv`
of `kiln bench --mode eager --warmup 0 --steps 1` (what `tools/device/gpu_check.sh profile`
writes) as a table of kernels by total time, per step, with the DRAM bytes each moved and the
bandwidth that makes (where the file has dram__bytes.sum).

ncu serializes kernels and times each one alone, so short kernels read a little long and the
total exceeds the replayed step; compare kernels with each other, not with `kiln bench`.

Usage: tools/device/ncu_table.py NCU_CSV [STEPS_PROFILED]
  STEPS_PROFILED: the steps whose kernels the file holds (default 2: `kiln bench` runs its
  first step, then the timed one)
"""
import collections
import csv
import sys

US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
TIME = "gpu__time_duration.sum"
DRAM = "dram__bytes.sum"


def launches(path):
    """Each profiled launch as (kernel name, microseconds, DRAM bytes or None), in order."""
    header = None
    current = {}
    order = []
    for row in csv.reader(open(path, newline="")):
        if "Kernel Name" in row and "Metric Value" in row:
            header = row
            continue
        if header is None or len(row) != len(header):
            continue
        entry = dict(zip(header, row))
        metric, unit = entry["Metric Name"], entry["Metric Unit"]
        value = float(entry["Metric Value"].replace(",", ""))
        key = entry["ID"]
        if key not in current:
            current[key] = {"name": entry["Kernel Name"]}
            order.append(key)
        if metric == TIME:
            if unit not in US:
                sys.exit(f"{path}: unknown unit {unit!r} for {entry['Kernel Name']}")
            current[key]["us"] = value * US[unit]
        elif metric == DRAM:
            if unit not in BYTES:
                sys.exit(f"{path}: unknown unit {unit!r} for {entry['Kernel Name']}")
            current[key]["bytes"] = value * BYTES[unit]
    for key in order:
        launch = current[key]
        if "us" in launch:
            yield launch["name"], launch["us"], launch.get("bytes")


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    steps = int(sys.argv[2]) if len(sys.argv) == 3 else 2
    if steps < 1:
        sys.exit("STEPS_PROFILED must be at least 1")
    total = collections.defaultdict(float)
    moved = collections.defaultdict(float)
    count = collections.Counter()
    with_bytes = False
    for name, us, nbytes in launches(sys.argv[1]):
        # cuBLASLt's names carry template arguments; the first 60 characters tell them apart.
        name = name[:60]
        total[name] += us
        count[name] += 1
        if nbytes is not None:
            with_bytes = True
            moved[name] += nbytes
    if not total:
        sys.exit(f"{sys.argv[1]}: no {TIME} rows (was ncu run with --csv?)")
    head = "| kernel | launches a step | µs a step | µs each |"
    rule = "|---|---|---|---|"
    if with_bytes:
        head += " MB a step | GB/s |"
        rule += "---|---|"
    print(head)
    print(rule)

    def line(name, launched, us, nbytes):
        text = f"| `{name}` | {launched / steps:g} | {us / steps:.1f} |"
        text += f" {us / launched:.2f} |" if name != "all" else " |"
        if with_bytes:
            text += f" {nbytes / steps / 1e6:.2f} | {nbytes / us / 1e3:.0f} |"
        print(text)

    for name, us in sorted(total.items(), key=lambda item: -item[1]):
        line(name, count[name], us, moved[name])
    line("all", sum(count.values()), sum(total.values()), sum(moved.values()))


if __name__ == "__main__":
    main()
