"""DLPack: kiln.Tensor shares memory (checked by pointer) with NumPy and, where installed,
PyTorch — on the CPU always, on a CUDA GPU where one can be used."""

import numpy as np
import pytest

import kiln


def pointer(array):
    return array.__array_interface__["data"][0]


def test_numpy_round_trip_shares_memory():
    source = np.arange(12, dtype=np.float32).reshape(3, 4)
    shared = kiln.from_dlpack(source)
    assert shared.data_ptr == pointer(source)
    assert shared.shape == (3, 4) and shared.strides == (4, 1)
    assert shared.dtype == "float32" and shared.device == "cpu"
    back = np.from_dlpack(shared)
    assert pointer(back) == pointer(source)
    source[1, 2] = -7.0  # one memory: the write shows through both
    assert back[1, 2] == -7.0
    assert shared.numpy()[1, 2] == -7.0


def test_strided_views_keep_their_strides():
    source = np.arange(24, dtype=np.int64).reshape(4, 6)[:, ::2]
    shared = kiln.from_dlpack(source)
    assert shared.strides == (6, 2)
    assert np.array_equal(np.from_dlpack(shared), source)
    assert pointer(np.from_dlpack(shared)) == pointer(source)


def test_program_outputs_are_shared_not_copied(tiny, tokens):
    program = tiny.compile("prefill", batch=2, seq=6)
    inputs = {
        "tokens": tokens,
        "positions": np.tile(np.arange(6, dtype=np.int64), (2, 1)),
        "cache_positions": np.zeros(2, dtype=np.int64),
    }
    outputs = program.run_tensors(**inputs)
    logits = outputs["logits"]
    assert isinstance(logits, kiln.Tensor)
    viewed = np.from_dlpack(logits)
    assert pointer(viewed) == logits.data_ptr
    assert viewed.tobytes() == program.run(**inputs)["logits"].tobytes()
    # A kiln.Tensor is also an input: fed back without a copy on kiln's side.
    again = program.run_tensors(**{**inputs, "tokens": kiln.from_dlpack(tokens)})
    assert np.from_dlpack(again["logits"]).tobytes() == viewed.tobytes()


def test_a_capsule_is_taken_once_and_freed_when_dropped():
    source = np.ones(3, dtype=np.float64)
    shared = kiln.from_dlpack(source)
    capsule = shared.__dlpack__()
    np.from_dlpack(type("Producer", (), {
        "__dlpack__": lambda self, **_: capsule,
        "__dlpack_device__": lambda self: (1, 0),
    })())
    with pytest.raises(TypeError, match="capsule"):
        kiln.from_dlpack(type("Stale", (), {"__dlpack__": lambda self, **_: capsule})())
    del shared, capsule  # the unused export and the used one both release cleanly
    for _ in range(100):
        shared = kiln.from_dlpack(source)
        _ = shared.__dlpack__(max_version=(1, 0)), shared.__dlpack__()


def test_export_refuses_copies_and_other_devices():
    shared = kiln.from_dlpack(np.zeros(2, dtype=np.float32))
    with pytest.raises(BufferError, match="without copying"):
        shared.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="device"):
        shared.__dlpack__(dl_device=(2, 0))
    assert shared.__dlpack_device__() == (1, 0)


def test_torch_round_trip_shares_memory_on_the_cpu():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    source = torch.arange(10, dtype=torch.float32)
    shared = kiln.from_dlpack(source)
    assert shared.data_ptr == source.data_ptr()
    back = torch.from_dlpack(shared)
    assert back.data_ptr() == source.data_ptr()
    source[3] = 42.0
    assert back[3].item() == 42.0


def test_torch_round_trip_shares_memory_on_cuda():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for PyTorch on this machine")
    source = torch.arange(1024, dtype=torch.float32, device="cuda")
    shared = kiln.from_dlpack(source)
    assert shared.device == f"cuda:{source.device.index or 0}"
    assert shared.data_ptr == source.data_ptr()
    back = torch.from_dlpack(shared)
    assert back.device == source.device
    assert back.data_ptr() == source.data_ptr()
    source[5] = -1.0
    torch.cuda.synchronize()
    assert back[5].item() == -1.0
    # A program on the CPU takes host inputs: a CUDA tensor is refused with a message.
    program = kiln.load("tiny").compile("prefill", batch=1, seq=4)
    with pytest.raises(ValueError, match="host inputs"):
        program.run(tokens=torch.zeros((1, 4), dtype=torch.int64, device="cuda"))


def test_a_cuda_program_takes_and_gives_cuda_tensors(tokens):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for PyTorch on this machine")
    program = kiln.load("tiny", device="cuda").compile("prefill", batch=2, seq=6)
    inputs = {
        "tokens": tokens,
        "positions": np.tile(np.arange(6, dtype=np.int64), (2, 1)),
        "cache_positions": np.zeros(2, dtype=np.int64),
    }
    want = program.run(**inputs)["logits"]
    on_gpu = {name: torch.from_numpy(value).cuda() for name, value in inputs.items()}
    # Written on a side stream: DLPack's stream handshake orders kiln's copies after it.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        on_gpu["positions"] = torch.arange(6, device="cuda").repeat(2, 1)
        outputs = program.run_tensors(**on_gpu)
    logits = outputs["logits"]
    assert logits.device == "cuda:0"
    shared = torch.from_dlpack(logits)
    assert shared.is_cuda and shared.data_ptr() == logits.data_ptr
    assert shared.cpu().numpy().tobytes() == want.tobytes()
    assert logits.numpy().tobytes() == want.tobytes()
    # CUDA inputs into host results, and kiln's own CUDA outputs fed back as inputs.
    assert program.run(**on_gpu)["logits"].tobytes() == want.tobytes()
    again = program.run_tensors(tokens=kiln.from_dlpack(on_gpu["tokens"]))
    assert again["logits"].numpy().tobytes() == want.tobytes()
    # Bad device inputs are refused with their reason.
    with pytest.raises(ValueError, match="contiguous"):
        program.run(tokens=on_gpu["tokens"].t().contiguous().t())
    with pytest.raises(ValueError, match="outside"):
        program.run(tokens=torch.full((2, 6), 10**6, dtype=torch.int64, device="cuda"))
    with pytest.raises(TypeError, match="dtype"):
        program.run(tokens=on_gpu["tokens"].to(torch.int32))
