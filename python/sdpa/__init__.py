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

if hasattr(_sdpa, "lab"):
    lab = _sdpa.lab


def __getattr__(name):
    if name == "torch" and _importlib_util.find_spec("torch") is not None:
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'sdpa' has no attribute '{name}'"
                         + (" (PyTorch is not installed)" if name == "torch" else ""))
