"""The Python interface itself: errors and their messages, dtypes, zero-copy and copies,
non-contiguous and broadcast inputs, the softmax functions, threads, and the module's metadata.
Numerical checks here compare with NumPy in float64; test_torch.py compares with PyTorch."""
import os
import subprocess
import tempfile
import threading

import numpy as np
import pytest

import sdpa
from conftest import assert_close, contract


def numpy_attention(q, k, v, mask=None, scale=None):
    """softmax(q k^T * scale + mask) v in float64 (no fully masked rows expected)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1]) if q.shape[-1] > 0 else 1.0
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def qkv(dtype=np.float32, seed=0, shape=(2, 3, 5, 4), S=7, Ev=6):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(shape).astype(dtype)
    k = rng.standard_normal(shape[:-2] + (S, shape[-1])).astype(dtype)
    v = rng.standard_normal(shape[:-2] + (S, Ev)).astype(dtype)
    return q, k, v


def test_version():
    parts = sdpa.__version__.split(".")
    assert len(parts) == 3 and all(p.isdigit() for p in parts), sdpa.__version__


def test_docstrings():
    assert "scaled dot-product attention" in sdpa.__doc__
    for f in (sdpa.scaled_dot_product_attention, sdpa.attention_forward, sdpa.attention_backward,
              sdpa.softmax, sdpa.log_softmax, sdpa.softmax_backward):
        assert f.__doc__ and len(f.__doc__) > 200, f.__name__
    # PyTorch's positional order, then our keywords.
    assert ("scaled_dot_product_attention(query: object, key: object, value: object, "
            "attn_mask: object = None, dropout_p: float = 0.0, is_causal: bool = False, "
            "scale: Optional[float] = None, enable_gqa: bool = False, *, causal"
            in sdpa.scaled_dot_product_attention.__doc__)


# What the docstrings say about dtypes, each statement with the call that shows it: (query,
# key/value, mask) dtypes -> (out, lse, dq, dk, dv) dtypes. uint16 is bfloat16's bits.
DTYPE_RULES = [
    ("float32", "float32", "float32", ("float32", "float32", "float32", "float32", "float32")),
    ("float64", "float64", "float64", ("float64", "float64", "float64", "float64", "float64")),
    ("float16", "float16", "float16", ("float16", "float32", "float16", "float16", "float16")),
    ("uint16", "uint16", "uint16", ("uint16", "float32", "uint16", "uint16", "uint16")),
    ("float32", "float16", "bool", ("float32", "float32", "float32", "float16", "float16")),
    ("float32", "uint16", "float16", ("float32", "float32", "float32", "uint16", "uint16")),
    ("uint16", "float16", "float64", ("uint16", "float32", "uint16", "float16", "float16")),
]


@pytest.mark.parametrize("q_dtype, kv_dtype, mask_dtype, results", DTYPE_RULES)
def test_documented_dtypes(q_dtype, kv_dtype, mask_dtype, results):
    rng = np.random.default_rng(1)

    def array(shape, dtype):
        x = rng.standard_normal(shape).astype(np.float32)
        return sdpa.to_bfloat16(x) if dtype == "uint16" else x.astype(dtype)

    q, k, v = array((1, 2, 3, 4), q_dtype), array((1, 2, 5, 4), kv_dtype), \
        array((1, 2, 5, 4), kv_dtype)
    mask = np.ones((3, 5), bool) if mask_dtype == "bool" else array((3, 5), mask_dtype)
    out, lse = sdpa.attention_forward(q, k, v, mask)
    got = (out, lse) + tuple(sdpa.attention_backward(q, k, v, out, lse, out, mask))
    assert tuple(str(a.dtype) for a in got) == results
    assert sdpa.scaled_dot_product_attention(q, k, v, mask).dtype == out.dtype


def test_docstrings_describe_the_16bit_dtypes():
    # The statements test_documented_dtypes checks, in the docstrings that make them.
    module = " ".join(sdpa.__doc__.split())
    assert "float32 or float64 (all the same)" not in module
    assert "float16, or uint16 arrays holding bfloat16 bit patterns" in module
    assert "lse too, but float32 for a 16-bit query" in module
    sdpa_doc = " ".join(sdpa.scaled_dot_product_attention.__doc__.split())
    assert "query: (..., Hq, L, E): float32, float64, float16, or uint16" in sdpa_doc
    assert "under a float32 or bfloat16 query also float16 or bfloat16" in sdpa_doc
    forward = " ".join(sdpa.attention_forward.__doc__.split())
    assert "but float32 for a float16 or bfloat16 query" in forward
    backward = " ".join(sdpa.attention_backward.__doc__.split())
    assert "dk and dv in the key's and value's" in backward
    assert "in the query's dtype." not in backward.split("out and lse")[0]


def test_positional_torch_order():
    q, k, v = qkv(np.float64)
    mask = np.tril(np.ones((5, 7), dtype=bool))
    a = sdpa.scaled_dot_product_attention(q, k, v, mask, 0.0, False, 0.3, False)
    assert_close("positional", a, numpy_attention(q, k, v, mask, 0.3), contract(np.float64))
    b = sdpa.scaled_dot_product_attention(q, k, v, None, 0.0, True)
    assert_close("is_causal", b, numpy_attention(q, k, v, mask), contract(np.float64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_result_dtype_and_values(dtype):
    q, k, v = qkv(dtype)
    out = sdpa.scaled_dot_product_attention(q, k, v)
    assert out.dtype == dtype and out.shape == (2, 3, 5, 6) and out.flags.c_contiguous
    assert_close("out", out, numpy_attention(q, k, v), contract(dtype))


def test_mask_dtype_independent_of_query():
    q, k, v = qkv(np.float32)
    m64 = np.random.default_rng(1).standard_normal((5, 7))
    a = sdpa.scaled_dot_product_attention(q, k, v, m64)
    b = sdpa.scaled_dot_product_attention(q, k, v, m64.astype(np.float32))
    assert a.dtype == np.float32
    assert_close("float64 mask", a, numpy_attention(q, k, v, m64), contract(np.float32))
    assert_close("float32 mask", b, numpy_attention(q, k, v, m64.astype(np.float32)),
                 contract(np.float32))


def test_inputs_not_modified():
    q, k, v = qkv(np.float32)
    copies = [a.copy() for a in (q, k, v)]
    out, lse = sdpa.attention_forward(q, k, v)
    sdpa.attention_backward(q, k, v, out, lse, np.ones_like(out))
    for a, c in zip((q, k, v), copies):
        assert np.array_equal(a, c)


# ---- zero-copy and copies ------------------------------------------------------------------


def test_zero_copy_for_contiguous_inputs():
    for dtype in (np.float32, np.float64):
        q = np.ones((2, 3, 4), dtype=dtype)
        assert sdpa._prepared(q) is q
        # A C-contiguous slice at an offset is used in place too.
        big = np.ones((5, 3, 4), dtype=dtype)
        view = big[1:3]
        assert np.shares_memory(sdpa._prepared(view), big)
    m = np.ones((4, 5), dtype=bool)
    assert sdpa._prepared(m, mask=True) is m


def test_strided_views_are_read_in_place():
    """Views whose last dimension is contiguous reach the C++ API with their strides: a
    (B, S, H, E) KV cache transposed to (B, H, S, E), strided slices, broadcast batches."""
    base = np.arange(2 * 5 * 3 * 4, dtype=np.float32).reshape(2, 5, 3, 4)
    for view in (base.transpose(0, 2, 1, 3), base[:, ::2], np.broadcast_to(base[:1], (4, 5, 3, 4))):
        got = sdpa._prepared(view)
        assert got is view or (np.shares_memory(got, base) and got.strides == view.strides)


def test_copy_for_other_layouts():
    base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for view in (base.transpose(0, 2, 1), base[:, :, ::2], base[:, ::-1, :], base.astype(">f4")):
        got = sdpa._prepared(view)
        assert got.flags.c_contiguous and got.flags.aligned and got.dtype.isnative
        assert not np.shares_memory(got, base)
        assert np.array_equal(got, view)


def test_broadcast_mask_is_not_expanded():
    """np.broadcast_to(mask, big) goes to the C++ API as the view it is (zero strides, no copy),
    which reads it in place."""
    small = np.random.default_rng(0).random((1, 5, 7)) < 0.6
    small[..., 0] = True
    wide = np.broadcast_to(small, (2, 3, 5, 7))
    got = sdpa._prepared(wide, mask=True)
    assert got.shape == (2, 3, 5, 7) and got.strides[:2] == (0, 0)
    assert np.shares_memory(got, small)
    q, k, v = qkv(np.float64)
    out = sdpa.scaled_dot_product_attention(q, k, v, wide)
    assert_close("broadcast mask", out, numpy_attention(q, k, v, wide), contract(np.float64))


@pytest.mark.parametrize("shape", [(4, 5, 7), (6, 7), (9, 2, 3, 5, 7)])
def test_broadcast_mask_of_the_wrong_shape_is_refused_as_its_dense_copy(shape):
    # Hq = 3, L = 5, S = 7: each shape has a repeated dimension that does not fit.
    q = np.zeros((2, 3, 5, 4), np.float32)
    k = np.zeros((2, 3, 7, 4), np.float32)
    view = np.broadcast_to(np.zeros((1,) * (len(shape) - 1) + (7,), np.float32), shape)
    messages = []
    for m in (view, np.ascontiguousarray(view)):
        with pytest.raises(ValueError, match="attn_mask") as e:
            sdpa.scaled_dot_product_attention(q, k, k, m)
        messages.append(str(e.value))
    assert messages[0] == messages[1] and str(shape).replace(" ", "") in messages[0].replace(" ", "")


def test_non_contiguous_and_broadcast_inputs():
    rng = np.random.default_rng(5)
    q, k, v = qkv(np.float32, seed=5)
    # Transposed storage, strided slices, a broadcast key/value over the batch.
    qt = np.ascontiguousarray(np.swapaxes(q, -1, -2)).swapaxes(-1, -2)
    kbig = rng.standard_normal((2, 3, 14, 4)).astype(np.float32)
    ks = kbig[:, :, ::2, :]
    vb = np.broadcast_to(v[:1], v.shape)
    assert not (qt.flags.c_contiguous or ks.flags.c_contiguous or vb.flags.c_contiguous)
    mask = (rng.random((7, 5)) < 0.7).T  # a transposed (L, S) mask
    mask[:, 0] = True
    dense = [np.ascontiguousarray(a) for a in (qt, ks, vb, mask)]
    out, lse = sdpa.attention_forward(qt, ks, vb, mask, impl="reference")
    out_d, lse_d = sdpa.attention_forward(*dense, impl="reference")
    assert np.array_equal(out, out_d) and np.array_equal(lse, lse_d)
    g = np.broadcast_to(np.float32(1), out.shape)
    grads = sdpa.attention_backward(qt, ks, vb, out, lse, g, mask, impl="reference")
    grads_d = sdpa.attention_backward(*dense[:3], out_d, lse_d, np.ones_like(out_d), dense[3],
                                      impl="reference")
    for a, b in zip(grads, grads_d):
        assert np.array_equal(a, b)
    assert_close("strided", out, numpy_attention(*dense), contract(np.float32))


def test_array_likes():
    """Anything numpy.asarray accepts works: nested lists of floats are float64."""
    q = [[0.5, -1.0], [2.0, 0.25]]
    out = sdpa.scaled_dot_product_attention(q, q, q)
    assert out.dtype == np.float64
    assert_close("lists", out, numpy_attention(np.array(q), np.array(q), np.array(q)),
                 contract(np.float64))


# ---- errors --------------------------------------------------------------------------------

Q, K, V = qkv(np.float32)
F64 = np.float64
ERRORS = [
    # (call, exception, message start)
    (lambda: sdpa.scaled_dot_product_attention(Q.astype(np.float16), K, V), TypeError,
     "key/value: expected the query's dtype float16 for key and value, got key float32"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K.astype(np.int64), V), TypeError,
     "key: expected dtype float32, float64, float16 or uint16 (bfloat16 bits), got int64"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V > 0), TypeError,
     "value: expected dtype float32, float64, float16 or uint16 (bfloat16 bits), got bool"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K.astype(F64), V), TypeError,
     "key/value: expected the query's dtype float32 for key and value, got key float64"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V, np.ones((5, 7), np.int32)), TypeError,
     "attn_mask: expected dtype bool, float32, float64, float16 or uint16 (bfloat16 bits), got "
     "int32"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V, np.ones((4, 7), bool)), ValueError,
     "attn_mask: expected a shape that broadcasts to (2, 3, 5, 7), got (4, 7)"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K[..., :3], V), ValueError,
     "key: expected last dimension E = 4"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V[..., :6, :]), ValueError,
     "value: expected S = 7 rows"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K[:, :1], V[:, :1]), ValueError,
     "key: expected 3 heads like query (or enable_gqa for grouped-query attention)"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K[:, :2], V[:, :2], enable_gqa=True),
     ValueError, "enable_gqa: expected query heads Hq to be a multiple of key/value heads Hkv"),
    (lambda: sdpa.scaled_dot_product_attention(Q[0, 0, 0], K[0, 0, 0], V[0, 0, 0]), ValueError,
     "query: expected rank 2 or more, got shape (4,)"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V, scale=float("nan")), ValueError,
     "scale: expected a finite number"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V, impl="fastest"), ValueError,
     "impl: expected fast, reference or naive, got 'fastest'"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V, threads=-1), ValueError,
     "threads: expected 0 (one per core) or 1..1024, got -1"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V, causal="lower_right"), ValueError,
     "causal: expected none, upper-left or lower-right, got 'lower_right'"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V, is_causal=True, causal="none"),
     ValueError, "is_causal: expected False when causal='none' is given"),
    (lambda: sdpa.scaled_dot_product_attention(Q, K, V, dropout_p=1.0), ValueError,
     "dropout_p: expected a probability in [0, 1), got 1"),
    (lambda: sdpa.attention_backward(Q, K, V, np.zeros((2, 3, 5, 5), np.float32),
                                     np.zeros((2, 3, 5), np.float32),
                                     np.zeros((2, 3, 5, 6), np.float32)), ValueError,
     "out: expected shape (2, 3, 5, 6), got (2, 3, 5, 5)"),
    (lambda: sdpa.attention_backward(Q, K, V, np.zeros((2, 3, 5, 6), np.float32),
                                     np.zeros((2, 3, 4), np.float32),
                                     np.zeros((2, 3, 5, 6), np.float32)), ValueError,
     "lse: expected shape (2, 3, 5), got (2, 3, 4)"),
    (lambda: sdpa.attention_backward(Q, K, V, np.zeros((2, 3, 5, 6), np.float32),
                                     np.zeros((2, 3, 5), np.float32),
                                     np.zeros((2, 3, 5, 6), np.float64)), TypeError,
     "grad_out: expected dtype float32, got float64"),
    (lambda: sdpa.softmax(np.arange(3)), TypeError, "x: expected dtype float32 or float64"),
    (lambda: sdpa.softmax(np.float64(1)), ValueError, "x: expected rank 1 or more"),
    (lambda: sdpa.log_softmax(np.ones((2, 3)), axis=2), ValueError,
     "axis: expected -2 to 1 for x of shape (2, 3), got 2"),
    (lambda: sdpa.softmax(np.ones(3), scale=float("inf")), ValueError,
     "scale: expected a finite number, got inf"),
    (lambda: sdpa.softmax_backward(np.ones((2, 3)), np.ones((3, 2))), ValueError,
     "grad_probabilities: expected the shape of probabilities (2, 3), got (3, 2)"),
    (lambda: sdpa.softmax_backward(np.ones(3), np.ones(3, np.float32)), TypeError,
     "grad_probabilities: expected dtype float64 like probabilities, got float32"),
]


@pytest.mark.parametrize("index", range(len(ERRORS)))
def test_error(index):
    call, kind, start = ERRORS[index]
    with pytest.raises(kind) as info:
        call()
    assert str(info.value).startswith(start), f"{str(info.value)!r} does not start with {start!r}"


def cli_path():
    # <build>/python/sdpa/__init__.py: the program is <build>/sdpa
    here = os.path.dirname(os.path.dirname(os.path.abspath(sdpa.__file__)))
    path = os.path.join(os.path.dirname(here), "sdpa")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


@pytest.mark.skipif(cli_path() is None, reason="the sdpa program is not built next to the module")
def test_messages_match_the_cli():
    """The same mistake gives the same message from Python and from `sdpa attention`, which
    names the flag and the file where Python names the argument (--mask is attn_mask here)."""
    q, k, v = qkv(np.float32)
    cases = [
        (dict(k=k[..., :3]), ValueError),
        (dict(k=k.astype(np.float64)), TypeError),
        (dict(mask=np.ones((4, 7), bool)), ValueError),
    ]
    with tempfile.TemporaryDirectory() as d:
        for change, kind in cases:
            arrays = {"q": q, "k": k, "v": v, **change}
            args = [cli_path(), "attention", "--out", os.path.join(d, "o.npy")]
            for name, flag in (("q", "--query"), ("k", "--key"), ("v", "--value"),
                               ("mask", "--mask")):
                if name in arrays:
                    np.save(os.path.join(d, name + ".npy"), arrays[name])
                    args += [flag, os.path.join(d, name + ".npy")]
            r = subprocess.run(args, capture_output=True, text=True)
            assert r.returncode == 2, r.stderr
            cli = r.stderr.strip().removeprefix("sdpa: error: ")
            with pytest.raises(kind) as info:
                sdpa.scaled_dot_product_attention(arrays["q"], arrays["k"], arrays["v"],
                                                  arrays.get("mask"))
            python = str(info.value)
            for argument, flag, file in (("query", "--query", "q"), ("key", "--key", "k"),
                                         ("value", "--value", "v"), ("attn_mask", "--mask", "mask")):
                if python.startswith(argument + ": "):
                    python = f"{flag} {os.path.join(d, file + '.npy')}" + python[len(argument):]
            assert python == cli
            assert not os.path.exists(os.path.join(d, "o.npy"))


# ---- softmax -------------------------------------------------------------------------------


def numpy_softmax(x, axis, scale):
    z = np.asarray(x, dtype=np.float64) * scale
    z = z - z.max(axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis, keepdims=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_functions(dtype, axis):
    x = (np.random.default_rng(3).standard_normal((4, 5, 6)) * 30).astype(dtype)
    p = sdpa.softmax(x, axis=axis, scale=0.7)
    assert p.dtype == dtype and p.shape == x.shape
    ref = numpy_softmax(x, axis, 0.7)
    # One rounding of a float64 result: half a unit roundoff relative to each entry, 1 at most.
    u = np.finfo(dtype).eps / 2
    assert_close("softmax", p, ref, 2 * u)
    logp = sdpa.log_softmax(x, axis=axis, scale=0.7)
    assert_close("log_softmax", logp, np.log(ref), 2 * u)
    g = np.random.default_rng(4).standard_normal(x.shape).astype(dtype)
    dx = sdpa.softmax_backward(p, g, axis=axis, scale=0.7)
    pp = p.astype(np.float64)
    ref_dx = 0.7 * pp * (g - (pp * g).sum(axis, keepdims=True))
    assert_close("softmax_backward", dx, ref_dx, 4 * u)


def test_softmax_of_the_article_example():
    # exp(1000) overflows, so a softmax without the max subtracted gives NaN; the exact answer
    # (1, e^-990, e^-995) rounds to (1, 0, 0) in float64.
    with np.errstate(over="ignore", invalid="ignore"):
        naive = np.exp([1000.0, 10.0, 5.0]) / np.exp([1000.0, 10.0, 5.0]).sum()
    assert np.isnan(naive[0])
    assert np.array_equal(sdpa.softmax(np.array([1000.0, 10.0, 5.0])), [1.0, 0.0, 0.0])
    assert np.array_equal(sdpa.log_softmax(np.array([1000.0, 10.0, 5.0])), [0.0, -990.0, -995.0])
    assert np.array_equal(sdpa.softmax(np.full((2, 3), -np.inf)), np.zeros((2, 3)))


# ---- threads -------------------------------------------------------------------------------


def test_threads_option_and_concurrent_callers():
    q, k, v = qkv(np.float64, shape=(2, 4, 33, 16), S=40, Ev=8)
    expected = numpy_attention(q, k, v)
    for threads in (0, 1, 2, 3):
        assert_close(f"threads={threads}", sdpa.scaled_dot_product_attention(q, k, v,
                                                                              threads=threads),
                     expected, contract(np.float64))
    results = [None] * 4

    def worker(i):
        results[i] = sdpa.scaled_dot_product_attention(q, k, v, threads=1 + i % 2)

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for r in results:
        assert_close("concurrent", r, expected, contract(np.float64))


@pytest.mark.parametrize("impl", ["fast", "reference", "naive"])
@pytest.mark.parametrize("L,S,E,Ev", [(0, 3, 4, 5), (3, 0, 4, 5), (3, 4, 0, 5), (3, 4, 5, 0)])
def test_zero_sizes(impl, L, S, E, Ev):
    """Empty dimensions are valid: S = 0 leaves every row without a key (zeros, lse = -inf);
    E = 0 makes every score 0 (out = mean of value rows, lse = log S)."""
    rng = np.random.default_rng(L * 1000 + S * 100 + E * 10 + Ev)
    q = rng.standard_normal((2, L, E))
    k = rng.standard_normal((2, S, E))
    v = rng.standard_normal((2, S, Ev))
    out, lse = sdpa.attention_forward(q, k, v, impl=impl)
    assert out.shape == (2, L, Ev) and lse.shape == (2, L)
    if S == 0:
        assert np.all(out == 0) and np.all(np.isneginf(lse))
    elif L > 0:
        s = q @ np.swapaxes(k, -1, -2) / (np.sqrt(E) if E else 1.0)
        m = s.max(-1, keepdims=True)
        expected_lse = (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]
        assert_close("lse", lse, expected_lse, contract(np.float64))
        if Ev > 0:
            assert_close("out", out, numpy_attention(q, k, v), contract(np.float64))
    dq, dk, dv = sdpa.attention_backward(q, k, v, out, lse, np.ones_like(out), impl=impl)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    if E == 0 and L > 0:
        # p = 1/S everywhere, so dv[s] = sum_l p * grad_out[l] = L / S for each entry.
        assert_close("dv", dv, np.full(v.shape, L / S), contract(np.float64))
    # Every case has an empty dimension that makes the scores' gradient vanish (or dq, dk empty).
    assert np.all(dq == 0) and np.all(dk == 0)
