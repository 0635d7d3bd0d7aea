"""kiln: a graph-compiled execution engine for Transformer models.

Load a model (a Hugging Face directory or a preset), compile its programs and run them with
NumPy arrays or, through DLPack, PyTorch tensors; evaluate it exactly as ``kiln eval`` does;
plan its programs; generate text.

>>> import kiln, numpy as np
>>> model = kiln.load("tiny")
>>> out = model.eval(np.array([[1, 2, 3, 4]]), grads=True)
>>> sorted(out)[:2]
['grad.lm_head.weight', 'grad.model.embed_tokens.weight']
"""

from ._kiln import (
    ABI_VERSION,
    KilnError,
    Model,
    Plan,
    Program,
    Tensor,
    __version__,
    from_dlpack,
    load,
)

__all__ = [
    "ABI_VERSION",
    "KilnError",
    "Model",
    "Plan",
    "Program",
    "Tensor",
    "__version__",
    "from_dlpack",
    "load",
]
