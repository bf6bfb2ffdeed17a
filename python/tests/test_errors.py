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
