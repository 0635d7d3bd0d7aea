"""Compiled programs: inputs, outputs, states carried between runs, plans and generation
equal to the CLI's."""

import json

import numpy as np
import pytest


def prefill_inputs(tokens):
    batch, seq = tokens.shape
    return {
        "tokens": tokens,
        "positions": np.tile(np.arange(seq, dtype=np.int64), (batch, 1)),
        "cache_positions": np.zeros(batch, dtype=np.int64),
    }


def test_program_describes_its_inputs_and_outputs(tiny):
    program = tiny.compile("prefill", batch=2, seq=6)
    assert program.name == "prefill"
    assert program.inputs["tokens"] == ((2, 6), "int64", "input")
    assert program.inputs["cache.k.0"][2] == "state"
    assert program.outputs["logits"] == ((2, 97), "float32")
    assert program.arena_bytes > 0


def test_decode_continues_the_prefill_cache_as_the_full_forward_does(tiny, tokens):
    # Prefill the first five tokens, decode the sixth: its logits are the last position's
    # logits of the whole sequence (the oracle's eval), up to the programs' rounding.
    batch, seq = tokens.shape
    prefill = tiny.compile("prefill", batch=batch, seq=seq - 1, max_seq=seq)
    states = prefill.run(**prefill_inputs(tokens[:, :-1]))
    decode = tiny.compile("decode", batch=batch, max_seq=seq)
    caches = {name: value for name, value in states.items() if name.startswith("cache.")}
    out = decode.run(
        tokens=tokens[:, -1:],
        positions=np.full(batch, seq - 1, dtype=np.int64),
        **caches,
    )
    full = tiny.eval(tokens)["logits"][:, -1, :]
    np.testing.assert_allclose(out["logits"], full, rtol=1e-5, atol=1e-5)
    # The run wrote the new position into the cache states it returns.
    assert not np.array_equal(out["cache.k.0"], caches["cache.k.0"])


def test_runs_are_deterministic_and_inputs_persist(tiny, tokens):
    program = tiny.compile("prefill", batch=2, seq=6, mode="graph")
    first = program.run(**prefill_inputs(tokens))["logits"]
    again = program.run()["logits"]  # every input keeps its last value
    assert first.tobytes() == again.tobytes()


def test_plan_dumps_equal_kiln_plan(kiln_cli, tiny):
    plan = tiny.plan("train", batch=2, seq=8)
    cli = kiln_cli(
        "plan", "--model", "tiny", "--program", "train", "--batch", 2, "--seq", 8,
        "--format", "json",
    )
    assert plan.dump("json").strip() == cli.strip()
    as_dict = plan.as_dict()
    assert as_dict == json.loads(cli)
    assert plan.arena_bytes >= plan.lower_bound_bytes > 0
    for fmt in ("text", "csv", "svg"):
        assert plan.dump(fmt)
    with pytest.raises(ValueError, match="format"):
        plan.dump("png")


def test_generate_equals_kiln_generate(kiln_cli, tmp_path, tiny):
    out = tmp_path / "generated.json"
    kiln_cli(
        "generate", "--model", "tiny", "--prompt-ids", "1,2,3", "--max-new-tokens", 6,
        "--temperature", 0, "--scheduler", "reference", "--json", out,
    )
    want = json.loads(out.read_text())["requests"][0]
    got = tiny.generate([1, 2, 3], max_new_tokens=6)
    assert got["tokens"] == want["tokens"]
    assert got["prompt"] == [1, 2, 3]
    assert got["finish_reason"] == "length"
    assert got["text"] is None  # a preset has no tokenizer
