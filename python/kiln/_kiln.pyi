"""Type stubs of kiln's native module (kiln._kiln); see the docstrings for behaviour."""

from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Union

import numpy as np

__version__: str
ABI_VERSION: int

Device = Literal["cpu", "cuda"]
Precision = Literal["f32", "bf16-gemm", "bf16-swiglu", "bf16"]
ProgramName = Literal["prefill", "decode", "train", "eval"]
RunMode = Literal["eager", "graph"]
EvalMode = Literal["oracle", "interpret", "planned", "graph"]
Shape = Tuple[int, ...]

class KilnError(RuntimeError):
    """kiln failed at the work itself (a model file, a kernel, a device)."""

class Tensor:
    """Memory shared through DLPack: a program's output or another library's tensor."""

    @property
    def shape(self) -> Shape: ...
    @property
    def strides(self) -> Shape:
        """Strides in elements, not bytes."""
    @property
    def dtype(self) -> str: ...
    @property
    def device(self) -> str:
        """"cpu" or "cuda:N"."""
    @property
    def data_ptr(self) -> int:
        """Address of the first element."""
    def numpy(self) -> np.ndarray:
        """A copy of the elements (host tensors and kiln's CUDA outputs)."""
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...

def from_dlpack(obj: Any) -> Tensor:
    """Shares the memory of any DLPack producer (torch, NumPy, kiln) without copying."""

InputValue = Union[np.ndarray, Tensor, Any]

class Program:
    """A compiled program; states (KV caches, optimizer moments) carry between runs."""

    @property
    def name(self) -> ProgramName: ...
    @property
    def device(self) -> str: ...
    @property
    def arena_bytes(self) -> int: ...
    @property
    def inputs(self) -> Dict[str, Tuple[Shape, str, Literal["input", "state"]]]: ...
    @property
    def outputs(self) -> Dict[str, Tuple[Shape, str]]: ...
    def run(self, **inputs: InputValue) -> Dict[str, np.ndarray]:
        """Sets the given inputs (copied; on the device from CUDA tensors of the program's
        device), runs once, returns every output as NumPy."""
    def run_tensors(self, **inputs: InputValue) -> Dict[str, Tensor]:
        """As run, returning kiln.Tensors for torch.from_dlpack / numpy.from_dlpack: CUDA
        memory of the program's device on a GPU (complete on return), host memory on the CPU."""

class Plan:
    """A program's plan: arena, buffers, streams."""

    @property
    def arena_bytes(self) -> int: ...
    @property
    def lower_bound_bytes(self) -> int: ...
    def as_dict(self) -> Dict[str, Any]: ...
    def dump(self, format: Literal["text", "json", "csv", "svg"] = "text") -> str: ...

class Model:
    """A loaded model."""

    @property
    def name(self) -> str: ...
    @property
    def device(self) -> Device: ...
    @property
    def precision(self) -> Precision: ...
    @property
    def config(self) -> Dict[str, Union[int, bool]]: ...
    def compile(
        self,
        program: ProgramName,
        batch: int = 1,
        seq: int = 16,
        max_seq: Optional[int] = None,
        mode: RunMode = "eager",
        fusion: bool = True,
    ) -> Program: ...
    def eval(
        self, tokens: InputValue, grads: bool = False, mode: EvalMode = "oracle"
    ) -> Dict[str, np.ndarray]:
        """logits, loss and grad.<parameter>, as `kiln eval` writes them."""
    def plan(
        self,
        program: ProgramName,
        batch: int = 1,
        seq: int = 16,
        max_seq: Optional[int] = None,
        streams: int = 1,
        backend: Literal["cpu", "cuda", "any"] = "any",
        fusion: bool = True,
    ) -> Plan: ...
    def generate(
        self,
        prompt: Union[str, Sequence[int]],
        max_new_tokens: int = 16,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        seed: int = 0,
        stop: Optional[List[str]] = None,
        mode: RunMode = "eager",
    ) -> Dict[str, Any]: ...

def load(
    model: str, device: Device = "cpu", precision: Precision = "f32", seed: int = 0
) -> Model:
    """Loads a Hugging Face directory or a preset, exactly as `kiln eval --model` does."""
