"""kiln's Python results equal the CLI's output files bit for bit on the tiny preset."""

import numpy as np
import pytest

import kiln
from safetensors_file import read, write


def assert_bitwise_equal(got, want):
    assert sorted(got) == sorted(want)
    for name, expected in want.items():
        actual = got[name]
        assert actual.dtype == expected.dtype, name
        assert actual.shape == expected.shape, name
        assert actual.tobytes() == expected.tobytes(), f"{name} differs from the CLI's"


def cli_eval(kiln_cli, tmp_path, tokens, *flags):
    tokens_file, out = tmp_path / "tokens.safetensors", tmp_path / "out.safetensors"
    write(tokens_file, {"tokens": tokens})
    kiln_cli("eval", "--model", "tiny", "--tokens", tokens_file, "--out", out, *flags)
    return read(out)


@pytest.mark.parametrize("mode", ["oracle", "interpret", "planned", "graph"])
def test_eval_with_grads_equals_kiln_eval(kiln_cli, tmp_path, tiny, tokens, mode):
    want = cli_eval(kiln_cli, tmp_path, tokens, "--grads", "--mode", mode)
    got = tiny.eval(tokens, grads=True, mode=mode)
    assert "logits" in got and "loss" in got and "grad.lm_head.weight" in got
    assert_bitwise_equal(got, want)


def test_eval_without_grads_and_from_int32(kiln_cli, tmp_path, tiny, tokens):
    want = cli_eval(kiln_cli, tmp_path, tokens.astype(np.int32))
    got = tiny.eval(tokens.astype(np.int32))
    assert sorted(got) == ["logits", "loss"]
    assert_bitwise_equal(got, want)


def test_eval_in_mixed_precision_and_another_seed(kiln_cli, tmp_path, tokens):
    model = kiln.load("tiny", precision="bf16-gemm", seed=3)
    want = cli_eval(kiln_cli, tmp_path, tokens, "--grads", "--precision", "bf16-gemm", "--seed", 3)
    assert_bitwise_equal(model.eval(tokens, grads=True), want)


def test_eval_from_a_strided_view(kiln_cli, tmp_path, tiny, tokens):
    # Every other column of a wider array: read through its strides, not copied first.
    wide = np.zeros((2, 12), dtype=np.int64)
    wide[:, ::2] = tokens
    want = cli_eval(kiln_cli, tmp_path, tokens)
    assert_bitwise_equal(tiny.eval(wide[:, ::2]), want)


def test_compiled_eval_program_equals_kiln_eval_planned(kiln_cli, tmp_path, tiny, tokens):
    want = cli_eval(kiln_cli, tmp_path, tokens, "--grads", "--mode", "planned")
    batch, seq = tokens.shape
    program = tiny.compile("eval", batch=batch, seq=seq)
    targets = np.full((batch, seq), -100, dtype=np.int64)
    targets[:, :-1] = tokens[:, 1:]
    positions = np.tile(np.arange(seq, dtype=np.int64), (batch, 1))
    out = program.run(
        tokens=tokens,
        positions=positions,
        targets=targets.reshape(-1),
        loss_seed=np.array(1.0, dtype=np.float32),
    )
    assert out["logits"].tobytes() == want["logits"].tobytes()
    assert out["loss"].reshape(1).tobytes() == want["loss"].tobytes()
    for name in (n for n in want if n.startswith("grad.")):
        assert out[name].tobytes() == want[name].tobytes(), name
