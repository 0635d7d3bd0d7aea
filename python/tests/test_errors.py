"""Bad calls raise exceptions carrying kiln's message; none crashes the process."""

import numpy as np
import pytest

import kiln


@pytest.fixture(scope="module")
def prefill(tiny):
    return tiny.compile("prefill", batch=1, seq=4)


def test_wrong_dtype_is_a_type_error(prefill):
    with pytest.raises(TypeError, match="expected dtype i64, got f32"):
        prefill.run(tokens=np.zeros((1, 4), dtype=np.float32))
    with pytest.raises(TypeError, match="uint8"):
        prefill.run(tokens=np.zeros((1, 4), dtype=np.uint8))
    with pytest.raises(TypeError, match="list"):
        prefill.run(tokens=[[1, 2, 3, 4]])


def test_wrong_shape_unknown_name_and_bad_ids_are_value_errors(prefill):
    with pytest.raises(ValueError, match=r"expected shape \[1,4\], got \[1,5\]"):
        prefill.run(tokens=np.zeros((1, 5), dtype=np.int64))
    with pytest.raises(ValueError, match="`token_ids` does not exist"):
        prefill.run(token_ids=np.zeros((1, 4), dtype=np.int64))
    with pytest.raises(ValueError, match="97"):
        prefill.run(tokens=np.full((1, 4), 97, dtype=np.int64))


def test_a_run_before_its_inputs_are_set_is_a_kiln_error(tiny):
    program = tiny.compile("prefill", batch=1, seq=4)
    with pytest.raises(kiln.KilnError):
        program.run()
    assert issubclass(kiln.KilnError, RuntimeError)


def test_bad_load_and_compile_arguments(tiny):
    with pytest.raises(ValueError, match="neither a model directory nor a preset"):
        kiln.load("no-such-model")
    with pytest.raises(ValueError, match="device"):
        kiln.load("tiny", device="tpu")
    with pytest.raises(ValueError, match="precision"):
        kiln.load("tiny", precision="f8")
    with pytest.raises(ValueError, match="not a program"):
        tiny.compile("sample")
    with pytest.raises(ValueError, match="--seq"):
        tiny.compile("prefill", seq=100000)
    with pytest.raises(ValueError, match="--batch"):
        tiny.compile("prefill", batch=0)
    with pytest.raises(OverflowError):
        tiny.compile("prefill", batch=-1)
    with pytest.raises(ValueError, match="bf16"):
        kiln.load("tiny", precision="bf16").eval(np.ones((1, 4), dtype=np.int64), grads=True)


def test_bad_eval_tokens(tiny):
    with pytest.raises(ValueError, match="T >= 2"):
        tiny.eval(np.ones((1, 1), dtype=np.int64))
    with pytest.raises(ValueError, match="outside"):
        tiny.eval(np.array([[1, 200]], dtype=np.int64))
    with pytest.raises(ValueError, match="mode"):
        tiny.eval(np.ones((1, 4), dtype=np.int64), mode="fast")


def test_cuda_without_a_gpu_is_an_error_not_a_crash():
    try:
        model = kiln.load("tiny", device="cuda")
    except kiln.KilnError as error:
        assert "cuda" in str(error).lower()
    else:
        assert model.device == "cuda"  # a machine with a usable GPU


def test_bfloat16_outputs_go_through_dlpack_not_numpy():
    model = kiln.load("tiny", precision="bf16")
    program = model.compile("prefill", batch=1, seq=4)
    inputs = {
        "tokens": np.ones((1, 4), dtype=np.int64),
        "positions": np.arange(4, dtype=np.int64).reshape(1, 4),
        "cache_positions": np.zeros(1, dtype=np.int64),
    }
    with pytest.raises(TypeError, match="bfloat16"):
        program.run(**inputs)  # its KV cache states are bf16
    caches = program.run_tensors(**inputs)
    assert caches["cache.k.0"].dtype == "bfloat16"


def test_generate_arguments(tiny):
    with pytest.raises(ValueError, match="tokenizer"):
        tiny.generate("text needs a tokenizer")
    with pytest.raises(ValueError, match="positions"):
        tiny.generate([1, 2], max_new_tokens=10_000)
    with pytest.raises(ValueError, match="empty"):
        tiny.generate([], max_new_tokens=2)


def test_from_dlpack_of_something_else():
    with pytest.raises(TypeError, match="__dlpack__"):
        kiln.from_dlpack([1, 2, 3])


def test_bad_sampling_parameters(tiny):
    with pytest.raises(ValueError, match="top_p"):
        tiny.generate([1, 2], max_new_tokens=2, temperature=1.0, top_p=2.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        tiny.generate([1, 2], max_new_tokens=0)


def test_a_model_and_its_programs_serve_the_thread_that_made_them(tiny):
    import threading

    program = tiny.compile("prefill", batch=1, seq=4)
    raised = []

    def elsewhere():
        for call in (lambda: program.run(), lambda: tiny.compile("prefill"), lambda: tiny.name):
            try:
                call()
            except kiln.KilnError as error:
                raised.append(str(error))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert len(raised) == 3 and all("belongs to the thread" in m for m in raised), raised
    assert tiny.name == "tiny"  # still usable on its own thread


def test_none_is_not_a_tensor(prefill):
    with pytest.raises(TypeError, match="NoneType"):
        prefill.run(tokens=None)
