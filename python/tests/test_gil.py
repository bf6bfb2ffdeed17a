"""A long call releases the GIL: another Python thread keeps running while it computes."""
import threading
import time

import numpy as np
import pytest

import sdpa


def timestamps_during(call):
    """Runs call() while a second thread records time stamps about every millisecond; returns
    the call's start and end and the stamps."""
    stamps = []
    stop = threading.Event()

    def counter():
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0.001)

    thread = threading.Thread(target=counter)
    thread.start()
    time.sleep(0.02)  # let the counter run first
    t0 = time.perf_counter()
    call()
    t1 = time.perf_counter()
    stop.set()
    thread.join()
    return t0, t1, stamps


@pytest.mark.parametrize("what", ["forward", "backward"])
def test_long_call_does_not_hold_the_gil(what):
    # The reference implementation on one thread (float64 accumulation, one query row at a time)
    # on a moderate shape: L = S doubles from 128 until one call lasts 0.2 s or more.
    rng = np.random.default_rng(0)
    n = 128
    while True:
        q, k, v = (rng.standard_normal((1, 2, n, 64)) for _ in range(3))
        if what == "forward":
            def call():
                sdpa.attention_forward(q, k, v, impl="reference", threads=1)
        else:
            out, lse = sdpa.attention_forward(q, k, v, impl="reference", threads=1)

            def call():
                sdpa.attention_backward(q, k, v, out, lse, out, impl="reference", threads=1)
        t0, t1, stamps = timestamps_during(call)
        if t1 - t0 >= 0.2 or n >= 4096:
            break
        n *= 2
    # If the GIL were held, the counter could not run a single bytecode between t0 and t1 (the
    # call is one C++ function). Look only at the middle 80% so that switches just before the
    # call starts or just after it ends do not count.
    margin = 0.1 * (t1 - t0)
    inside = [s for s in stamps if t0 + margin < s < t1 - margin]
    assert t1 - t0 >= 0.2, f"the call took only {t1 - t0:.3f} s at L = S = {n}"
    # ~1 stamp per ms is expected (>= 160); 5 leaves room for a heavily loaded machine.
    assert len(inside) >= 5, (f"only {len(inside)} counter steps during a {t1 - t0:.3f} s call "
                              f"(L = S = {n}): the GIL is held")


def test_the_counter_stops_while_the_gil_is_held():
    """The control: a call that holds the GIL (the regular-expression engine backtracking on
    (a+)+b never releases it) leaves no counter step inside it, so the test above can fail."""
    import re

    n = 16
    while True:
        t0, t1, stamps = timestamps_during(lambda: re.match(r"(a+)+b", "a" * n))
        if t1 - t0 >= 0.2 or n >= 30:
            break
        n += 1
    margin = 0.1 * (t1 - t0)
    inside = [s for s in stamps if t0 + margin < s < t1 - margin]
    assert t1 - t0 >= 0.2 and len(inside) == 0, (t1 - t0, len(inside))
