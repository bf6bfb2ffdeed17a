"""Exact scaled dot-product attention on the CPU (see docs/python.md).

The compiled extension is sdpa._sdpa; everything it defines is re-exported here, so
``sdpa.scaled_dot_product_attention`` and the other NumPy functions work as before.
``sdpa.torch`` (torch tensors, autograd) is imported on first use, when PyTorch is installed,
so that ``import sdpa`` stays fast for NumPy users.
"""
import importlib.util as _importlib_util

from . import _sdpa
from ._sdpa import *  # noqa: F401,F403
from ._sdpa import __doc__, __version__, _prepared  # noqa: F401


def to_bfloat16(x):
    """x rounded to bfloat16 (to nearest, ties to even; NaN stays NaN), as the uint16 bit
    patterns sdpa reads and writes for bfloat16 (NumPy has none; see docs/precision.md)."""
    import numpy as np

    a = np.asarray(x, dtype=np.float32)
    flat = np.ascontiguousarray(a).reshape(-1)  # 1-d, so that 0-d inputs keep their shape
    u = flat.view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(flat)
    bits[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return bits.reshape(a.shape)


def from_bfloat16(bits):
    """The float32 values of bfloat16 bit patterns (a uint16 array), exactly."""
    import numpy as np

    b = np.asarray(bits)
    if b.dtype != np.uint16:
        raise TypeError(f"bits: expected dtype uint16 (bfloat16 bit patterns), got {b.dtype}")
    return (b.astype(np.uint32).reshape(-1) << 16).view(np.float32).reshape(b.shape)


if hasattr(_sdpa, "lab"):
    lab = _sdpa.lab


def __getattr__(name):
    if name == "torch" and _importlib_util.find_spec("torch") is not None:
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'sdpa' has no attribute '{name}'"
                         + (" (PyTorch is not installed)" if name == "torch" else ""))
