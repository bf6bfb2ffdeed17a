"""Shared helpers of the sdpa Python tests.

Run with the extension on the path: PYTHONPATH=<build>/python /usr/bin/python3 -m pytest python/tests
(ctest does this). Importing sdpa must work: a missing module is a failure, not a skip.
"""
import numpy as np
import pytest

# The accuracy contract of the fused kernel (issue 3, docs/python.md): for float32 inputs, the
# largest error against a float64 computation of the same inputs, relative to the largest
# magnitude of the result, is at most 2e-5.
# float64 has no published contract ("may take a slower path"); we hold it to 1e-12. That is
# (a) five orders of magnitude below float32's unit roundoff 2^-24 = 6e-8, so any float32 step
# inside the float64 path fails it, and (b) 60 times the worst difference measured between the
# float64 reference and PyTorch's float64 result on these shapes (1.6e-14, where both sides
# round), room for a tiled kernel's different summation order.
CONTRACT = {np.dtype(np.float32): 2e-5, np.dtype(np.float64): 1e-12}


def contract(dtype):
    """The relative error bound for results of this dtype."""
    return CONTRACT[np.dtype(dtype)]


def relative_error(ours, ref, valid=None):
    """max |ours - ref| / max |ref| over the entries where `valid` is true (all by default), and
    the index of the worst entry. NaN in ours or in ref counts as an infinite error."""
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert ours.shape == ref.shape, f"shape {ours.shape} != expected {ref.shape}"
    if valid is None:
        valid = np.ones(ref.shape, dtype=bool)
    valid = np.broadcast_to(valid, ref.shape)
    if not valid.any():
        return 0.0, None
    if np.isnan(ref[valid]).any():  # would make every comparison below vacuously false
        worst = np.unravel_index(int(np.argmax(np.isnan(ref) & valid)), ref.shape)
        return np.inf, worst
    with np.errstate(invalid="ignore"):  # -inf - -inf at entries outside `valid`
        diff = np.where(valid, np.abs(ours - ref), 0.0)
    diff = np.where(np.isnan(diff), np.inf, diff)
    scale = np.abs(np.where(valid, ref, 0.0)).max()
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    if scale == 0.0:
        return (0.0 if diff[worst] == 0.0 else np.inf), worst
    return float(diff[worst] / scale), worst


def assert_close(what, ours, ref, bound, valid=None):
    """Fails with the worst element, its index and both values when the relative error of
    `ours` against `ref` exceeds `bound`."""
    err, worst = relative_error(ours, ref, valid)
    if err > bound:
        raise AssertionError(
            f"{what}: relative error {err:.3g} > bound {bound:.3g}; worst at index {worst}: "
            f"ours {np.asarray(ours)[worst]!r}, expected {np.asarray(ref)[worst]!r} "
            f"(bound relative to max |expected| over the compared entries)")
    return err


def assert_raises_alike(numpy_call, torch_call, name):
    """numpy_call() and torch_call() both raise TypeError or ValueError, of one type and with one
    message, which starts by naming `name`: sdpa.torch refuses as the NumPy function does."""
    with pytest.raises((TypeError, ValueError)) as numpy_error:
        numpy_call()
    with pytest.raises((TypeError, ValueError)) as torch_error:
        torch_call()
    assert torch_error.type is numpy_error.type
    assert str(torch_error.value) == str(numpy_error.value)
    assert str(torch_error.value).startswith(name + ": expected")
