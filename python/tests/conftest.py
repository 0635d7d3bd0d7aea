"""Fixtures of kiln's Python tests: the `kiln` CLI whose output files the results must equal
bit for bit, and the tiny preset loaded once."""

import os
import pathlib
import subprocess

import numpy as np
import pytest

import kiln

REPO = pathlib.Path(__file__).resolve().parents[2]


def _cli_path():
    given = os.environ.get("KILN_BIN")
    if given:
        return pathlib.Path(given), True
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return target / "release" / "kiln", False


@pytest.fixture(scope="session")
def kiln_cli():
    """Runs the `kiln` CLI (KILN_BIN, else target/release/kiln) with the given arguments."""
    path, required = _cli_path()
    if not path.exists():
        if required:
            pytest.fail(f"KILN_BIN={path} does not exist")
        pytest.skip(f"no kiln binary at {path} (cargo build --release, or set KILN_BIN)")

    def run(*args):
        done = subprocess.run([str(path), *map(str, args)], capture_output=True, text=True)
        assert done.returncode == 0, f"kiln {' '.join(map(str, args))} failed:\n{done.stderr}"
        return done.stdout

    return run


@pytest.fixture(scope="session")
def tiny():
    return kiln.load("tiny")


@pytest.fixture
def tokens():
    """A [2,6] batch of token ids of the tiny preset (vocabulary 97)."""
    return np.array([[1, 5, 9, 2, 96, 3], [7, 7, 0, 41, 12, 8]], dtype=np.int64)
