"""The Python module's errors: the exception type follows sdpa::Error's kind (TypeError for a bad
type, ValueError for a bad value or shape, OSError for I/O, MemoryError for resources), and a
wrong-type option is a clear error naming the argument, never pybind11's overload dump."""
import numpy as np
import pytest

import sdpa

Q = np.zeros((1, 2, 4, 8), np.float32)
K = np.zeros((1, 2, 7, 8), np.float32)
V = np.zeros((1, 2, 7, 3), np.float32)


def message_of(excinfo):
    text = str(excinfo.value)
    assert "incompatible function arguments" not in text, text
    return text


@pytest.mark.parametrize("kwargs, error, fragment", [
    ({"threads": 10**12}, ValueError, "threads: expected 0 (one per core) or 1..1024, got 1000000000000"),
    ({"threads": 1.5}, TypeError, "threads: expected an int"),
    ({"threads": True}, TypeError, "threads: expected an int"),
    ({"scale": "1"}, TypeError, "scale: expected None or a real number, got '1' (str)"),
    ({"enable_gqa": "no"}, TypeError, "enable_gqa: expected True or False, got 'no' (str)"),
    ({"is_causal": 1}, TypeError, "is_causal: expected True or False"),
    ({"impl": 3}, TypeError, "impl: expected a str"),
    ({"causal": True}, TypeError, "causal: expected a str"),
    ({"dropout_p": "0"}, TypeError, "dropout_p: expected a real number"),
])
def test_wrong_type_options_name_the_argument(kwargs, error, fragment):
    with pytest.raises(error) as e:
        sdpa.scaled_dot_product_attention(Q, K, V, **kwargs)
    assert fragment in message_of(e)


def test_right_types_still_work():
    out = sdpa.scaled_dot_product_attention(Q, K, V, scale=np.float32(0.5), enable_gqa=np.bool_(False),
                                            threads=np.int64(1))
    assert out.shape == (1, 2, 4, 3)
    out, lse = sdpa.attention_forward(Q, K, V, scale=1, return_lse=True)
    assert lse.shape == (1, 2, 4)
    with pytest.raises(TypeError) as e:
        sdpa.attention_backward(Q, K, V, out, lse, out, threads="2")
    assert "threads: expected an int" in message_of(e)
    with pytest.raises(TypeError) as e:
        sdpa.softmax(np.ones(3), scale="1")
    assert "scale: expected a real number" in message_of(e)


def test_empty_mask_reports_its_real_shape():
    with pytest.raises(ValueError) as e:
        sdpa.scaled_dot_product_attention(Q, K, V, attn_mask=np.zeros((0, 7), bool))
    text = message_of(e)
    assert "got (0, 7)" in text, text


def test_mask_message_never_says_one_or_one():
    with pytest.raises(ValueError) as e:
        sdpa.scaled_dot_product_attention(Q[:, :, :1], K, V, attn_mask=np.zeros((2, 7), bool))
    text = message_of(e)
    assert "1 or 1" not in text and "expected 1)" in text, text


def test_kind_chooses_the_exception_not_the_message():
    # bad_type: a dtype; bad_shape: shapes; resources: naive's L x S scratch (4 TiB here).
    with pytest.raises(TypeError):
        sdpa.scaled_dot_product_attention(Q.astype(np.float64), K, V)
    with pytest.raises(ValueError):
        sdpa.scaled_dot_product_attention(Q, K[..., :3], V)
    n = 1 << 20
    big = np.zeros((1, 1, n, 1), np.float32)
    with pytest.raises(MemoryError) as e:
        sdpa.scaled_dot_product_attention(big, big, big, impl="naive", threads=1)
    assert "L x S scratch" in str(e.value)


@pytest.mark.skipif(not hasattr(sdpa, "lab"), reason="built without the lab")
def test_lab_arguments():
    with pytest.raises(TypeError) as e:
        sdpa.lab.text(None)
    assert "result: expected the dict sdpa.lab.run returned, got None (NoneType)" in message_of(e)
    for bad in ({"claims": [], "x": float("nan")}, {"claims": [], "x": object()}):
        with pytest.raises(ValueError) as e:
            sdpa.lab.text(bad)
        assert "result: expected the dict sdpa.lab.run returned, got one it cannot" in \
            message_of(e)
    for seed in (-1, 2**64):
        with pytest.raises(ValueError) as e:
            sdpa.lab.run("softmax", seed=seed)
        assert "seed: expected an int in [0, 2^64-1]" in message_of(e)
    for seed in ("1", 1e23, -1e23):
        with pytest.raises(TypeError) as e:
            sdpa.lab.run("softmax", seed=seed)
        assert "seed: expected an int in [0, 2^64-1]" in message_of(e)
    with pytest.raises(TypeError) as e:
        sdpa.lab.run("softmax", quick="yes")
    assert "quick: expected True or False" in message_of(e)


# ---- attention_varlen: options checked by name, like the other functions --------------------

VQ = np.random.default_rng(0).standard_normal((11, 2, 8)).astype(np.float32)
VCU = [0, 5, 11]


def varlen_calls(args, kwargs):
    """attention_varlen and attention_varlen_backward with the same arguments."""
    out, lse = sdpa.attention_varlen(VQ, VQ, VQ, VCU, VCU, 6, 6, return_lse=True)
    yield lambda: sdpa.attention_varlen(*args, **kwargs)
    yield lambda: sdpa.attention_varlen_backward(*args, out, lse, np.ones_like(out), **kwargs)


@pytest.mark.parametrize("change, error, message", [
    ({"max_seqlen_q": 400.0}, TypeError, "max_seqlen_q: expected an int, got 400.0 (float)"),
    ({"max_seqlen_k": "6"}, TypeError, "max_seqlen_k: expected an int, got '6' (str)"),
    ({"max_seqlen_q": True}, TypeError, "max_seqlen_q: expected an int, got True (bool)"),
    ({"impl": 3}, TypeError, "impl: expected a str, got 3 (int)"),
    ({"softmax_scale": float("nan")}, ValueError, "softmax_scale: expected a finite number, got nan"),
    ({"softmax_scale": "1"}, TypeError,
     "softmax_scale: expected None or a real number, got '1' (str)"),
    ({"threads": 1.5}, TypeError, "threads: expected an int, 0 (one per core) or 1..1024, got 1.5 (float)"),
    ({"return_lse": 1}, TypeError, "return_lse: expected True or False, got 1 (int)"),
    ({"key": VQ.astype(np.float64)}, TypeError,
     "key/value: expected the query's dtype float32, got key float64 and value float32"),
    ({"value": VQ.astype(np.float64)}, TypeError,
     "key/value: expected the query's dtype float32, got key float32 and value float64"),
])
def test_varlen_options_name_the_argument(change, error, message):
    positional = dict(query=VQ, key=VQ, value=VQ, cu_seqlens_q=VCU, cu_seqlens_k=VCU,
                      max_seqlen_q=6, max_seqlen_k=6)
    keywords = {}
    for name, value in change.items():
        (positional if name in positional else keywords)[name] = value
    for n, call in enumerate(varlen_calls(list(positional.values()), keywords)):
        if n == 1 and "return_lse" in keywords:
            continue  # the backward has no return_lse
        with pytest.raises(error) as e:
            call()
        assert message_of(e) == message


def test_varlen_good_options_of_other_types():
    a = sdpa.attention_varlen(VQ, VQ, VQ, VCU, VCU, 6, 6, softmax_scale=0.5, threads=1)
    b = sdpa.attention_varlen(VQ, VQ, VQ, np.array(VCU, np.int32), VCU, np.int64(6), np.uint8(6),
                              softmax_scale=np.float32(0.5), threads=np.int64(1))
    assert np.array_equal(a, b)


def test_varlen_resources_error_keeps_its_message():
    # A resources error is a MemoryError that says what did not fit, not a bare one.
    n = 1 << 20
    q = np.zeros((n, 1, 1), np.float32)
    with pytest.raises(MemoryError) as e:
        sdpa.attention_varlen(q, q, q, [0, n], [0, n], n, n, impl="naive")
    assert message_of(e).startswith("impl naive: its L x S scratch (L = 1048576, S = 1048576")


# ---- array arguments numpy.asarray refuses, and real numbers that are not one ----------------

RAGGED = [[1.0, 2.0], [1.0]]


def refused_array_calls():
    """(argument, call) pairs, each passing RAGGED as that argument."""
    out, lse = sdpa.attention_forward(Q, K, V)
    kc = np.zeros((1, 7, 2, 8), np.float32)
    yield "query", lambda: sdpa.scaled_dot_product_attention(RAGGED, K, V)
    yield "key", lambda: sdpa.attention_forward(Q, RAGGED, V)
    yield "value", lambda: sdpa.scaled_dot_product_attention(Q, K, RAGGED)
    yield "attn_mask", lambda: sdpa.scaled_dot_product_attention(Q, K, V, RAGGED)
    yield "grad_out", lambda: sdpa.attention_backward(Q, K, V, out, lse, RAGGED)
    yield "x", lambda: sdpa.softmax(RAGGED)
    yield "q", lambda: sdpa.attention_with_kvcache(RAGGED, kc, kc.copy())
    yield "cache_seqlens", lambda: sdpa.attention_with_kvcache(Q, kc, kc.copy(),
                                                               cache_seqlens=RAGGED)
    yield "query", lambda: sdpa.attention_varlen(RAGGED, VQ, VQ, VCU, VCU, 6, 6)
    yield "cu_seqlens_k", lambda: sdpa.attention_varlen(VQ, VQ, VQ, VCU, RAGGED, 6, 6)


@pytest.mark.parametrize("index", range(10))
def test_arrays_numpy_refuses_name_the_argument(index):
    # numpy.asarray's own ValueError ("setting an array element with a sequence") named no
    # argument.
    what, call = list(refused_array_calls())[index]
    with pytest.raises(ValueError) as e:
        call()
    assert message_of(e).startswith(what + ": expected an array (anything numpy.asarray takes), "
                                    "got a list that numpy.asarray refused ("), message_of(e)
    assert e.value.__cause__ is not None


def test_objects_whose_array_conversion_fails_are_a_type_error_naming_the_argument():
    class Broken:
        def __array__(self, dtype=None):
            raise RuntimeError("no array here")

    with pytest.raises(TypeError) as e:
        sdpa.scaled_dot_product_attention(Q, Broken(), V)
    assert message_of(e) == ("key: expected an array (anything numpy.asarray takes), got a Broken "
                             "that numpy.asarray refused (no array here)")


@pytest.mark.parametrize("kwargs, fragment", [
    ({"softcap": np.ones(2)}, "softcap: expected a real number, got array([1., 1.]) (ndarray)"),
    ({"softcap": np.complex128(1 + 1j)}, "softcap: expected a real number, got (1+1j) (complex128)"),
    ({"dropout_p": np.array([0.1, 0.2])}, "dropout_p: expected a real number, got array("),
    ({"dropout_p": np.complex64(0.5)}, "dropout_p: expected a real number, got (0.5+0j) (complex64)"),
    ({"alibi_slopes": np.array([1j, 1, 1])},
     "alibi_slopes: expected an array of floats, got dtype complex128"),
    ({"sinks": [0.5j, 0]}, "sinks: expected an array of floats, got dtype complex128"),
])
def test_variant_numbers_that_are_not_real_are_refused(kwargs, fragment):
    # An array of several values raised pybind11's RuntimeError ("Unable to cast Python instance
    # to C++ type"), and complex numbers lost their imaginary parts (a ComplexWarning).
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError) as e:
            sdpa.scaled_dot_product_attention(Q, K, V, seed=1, **kwargs)
    assert message_of(e).startswith(fragment), message_of(e)
    # One-element arrays and NumPy scalars are numbers, as before.
    out = sdpa.scaled_dot_product_attention(Q, K, V, softcap=np.array([2.0]),
                                            dropout_p=np.float32(0.25), seed=1)
    assert out.shape == (1, 2, 4, 3)


@pytest.mark.parametrize("scale, shown", [
    (np.array([1.0, 2.0]), "array([1., 2.]) (ndarray)"),
    (np.complex128(0.5 + 2j), "(0.5+2j) (complex128)"),
    (True, "True (bool)"),
    ("0.5", "'0.5' (str)"),
])
def test_kvcache_scale_is_checked_like_the_other_scales(scale, shown):
    # An array of two values raised NumPy's unnamed TypeError; a complex scale was read as its
    # real part.
    import warnings

    q = np.ones((1, 1, 2, 8), np.float32)
    kc = np.ones((1, 5, 2, 8), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError) as e:
            sdpa.attention_with_kvcache(q, kc, kc.copy(), scale=scale)
    assert message_of(e) == "scale: expected None or a real number, got " + shown
    assert sdpa.attention_with_kvcache(q, kc, kc.copy(), scale=np.float32(0.5)).shape == (1, 1, 2, 8)
