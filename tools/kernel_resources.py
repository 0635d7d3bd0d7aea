#!/usr/bin/env python3
"""Registers, spills and stack of every kernel of kiln's CUDA modules, as ptxas reports them
when NVRTC compiles to a cubin (no GPU needed; libnvrtc must be on LD_LIBRARY_PATH, e.g. from
the `nvidia-cuda-nvrtc` wheel). A module's text is put together as kernels/src/gpu.rs does:
common.cuh, then the files its SOURCES entry names.

Usage: tools/kernel_resources.py [MODULE ...] [--arch sm_90]   (default: every module)
"""
import ctypes
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CUDA = ROOT / "kernels" / "cuda"


def modules():
    text = (ROOT / "kernels" / "src" / "gpu.rs").read_text()
    for name, files in re.findall(r'\(\s*"(\w+)",\s*module!\(([^)]*)\),?\s*\)', text):
        yield name, re.findall(r'"([^"]+)"', files)


def compile_log(lib, name, source, arch):
    program = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), f"{name}.cu".encode(),
                                0, None, None)
    assert rc == 0, f"nvrtcCreateProgram: {rc}"
    options = [f"--gpu-architecture={arch}", "--std=c++17", "--ptxas-options=-v"]
    array = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    rc = lib.nvrtcCompileProgram(program, len(options), array)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(program, log)
    lib.nvrtcDestroyProgram(ctypes.byref(program))
    if rc != 0:
        sys.exit(f"{name}: compile failed ({rc}):\n{log.value.decode()}")
    return log.value.decode()


def main():
    args = sys.argv[1:]
    arch = "sm_90"
    if "--arch" in args:
        i = args.index("--arch")
        arch = args[i + 1]
        del args[i:i + 2]
    lib = None
    for candidate in ("libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"):
        try:
            lib = ctypes.CDLL(candidate)
            break
        except OSError:
            continue
    if lib is None:
        sys.exit("libnvrtc not found: put its directory on LD_LIBRARY_PATH")
    print(f"{'kernel':32} {'regs':>5} {'stack':>6} {'spill st':>9} {'spill ld':>9}")
    for name, files in modules():
        if args and name not in args:
            continue
        source = "\n".join((CUDA / f).read_text() for f in ["common.cuh", *files])
        log = compile_log(lib, name, source, arch)
        for block in log.split("Compiling entry function")[1:]:
            kernel = re.search(r"'(\w+)'", block).group(1)
            stack, stores, loads = re.search(
                r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                block).groups()
            registers = re.search(r"Used (\d+) registers", block).group(1)
            print(f"{name + '::' + kernel:32} {registers:>5} {stack:>6} {stores:>9} {loads:>9}")


if __name__ == "__main__":
    main()
