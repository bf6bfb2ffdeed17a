"""sdpa.torch on inputs at the edges of what it takes, each against PyTorch's own float64 maths:

- the gradient of a mask whose rows are one huge constant (finfo.min, HF-style padding), where
  the library's lse rounds to the scores themselves;
- tensors whose negative bit is set (x.conj().imag, torch._neg_view): their values, not their
  memory, count, for every tensor argument and for grad_out;
- alibi_slopes and sinks of every accepted shape, and the refused ones;
- the variant keywords checked by name as the NumPy functions check them;
- sinks that require grad on 16-bit inputs, refused at the forward call.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import sdpa  # noqa: E402
import sdpa.torch as st  # noqa: E402
from conftest import assert_close, assert_raises_alike, contract  # noqa: E402


def composite(q, k, v, mask=None, slopes=None, sinks=None):
    """softmax(q k^T / sqrt(E) + ALiBi + mask [, sink]) v in torch operations."""
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    s = q @ k.transpose(-2, -1) / math.sqrt(E)
    if slopes is not None:
        i = torch.arange(L, dtype=s.dtype)[:, None]
        j = torch.arange(S, dtype=s.dtype)[None, :]
        s = s - slopes[..., None, None] * (i + (S - L) - j).abs()
    if mask is not None:
        s = s + mask
    if sinks is None:
        return torch.softmax(s, -1) @ v
    sink = sinks.reshape(-1, 1, 1).expand(*s.shape[:-1], 1)
    return torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1] @ v


def randn(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ---- the mask's gradient where the mask is a huge constant -----------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_mask_gradient_of_a_row_masked_with_finfo_min(dtype, with_sinks):
    # Query row 0 of batch 0 gives every key finfo.min (and, with sinks, the sink of head 0 is
    # finfo.min too): PyTorch's softmax spreads that row evenly, P = 1 / S (1 / (S + 1)), and
    # so must the mask's gradient. The other rows are ordinary.
    B, H, L, S, E = 2, 2, 4, 5, 8
    q, k, v = randn(B, H, L, E, dtype=dtype, seed=1), randn(B, H, S, E, dtype=dtype, seed=2), \
        randn(B, H, S, 3, dtype=dtype, seed=3)
    g = randn(B, H, L, 3, dtype=dtype, seed=4)
    tiny = torch.finfo(dtype).min
    base = 0.5 * randn(B, H, L, S, dtype=dtype, seed=5)
    base[0, :, 0] = tiny
    sinks = None
    if with_sinks:
        sinks = torch.tensor([tiny, 0.25], dtype=dtype)
    mask = base.clone().requires_grad_(True)
    out = st.scaled_dot_product_attention(q, k, v, mask, sinks=sinks)
    out.backward(g)
    # PyTorch's composite in float64 on the same values.
    ref_mask = base.double().requires_grad_(True)
    ref = composite(q.double(), k.double(), v.double(), ref_mask,
                    sinks=None if sinks is None else sinks.double())
    ref.backward(g.double())
    bound = contract(np.float64 if dtype == torch.float64 else np.float32)
    assert_close("out", out.detach().numpy(), ref.detach().numpy(), bound)
    assert ref_mask.grad[0, 0, 0].abs().max() > 1e-3  # the row does have a gradient
    assert_close("d mask", mask.grad.numpy(), ref_mask.grad.numpy(), bound)


def test_mask_gradient_of_a_row_masked_with_a_large_constant():
    # Any constant c with |c| * eps > log S rounds lse to c: -1e18 in float64.
    q, k, v = randn(1, 1, 3, 4, seed=6), randn(1, 1, 6, 4, seed=7), randn(1, 1, 6, 2, seed=8)
    base = torch.zeros(1, 1, 3, 6, dtype=torch.float64)
    base[..., 1, :] = -1e18
    mask, ref_mask = base.clone().requires_grad_(True), base.clone().requires_grad_(True)
    st.scaled_dot_product_attention(q, k, v, mask).sum().backward()
    composite(q, k, v, ref_mask).sum().backward()
    assert_close("d mask", mask.grad.numpy(), ref_mask.grad.numpy(), contract(np.float64))


# ---- lazy negation -----------------------------------------------------------------------------

def test_query_with_the_negative_bit_and_a_last_dimension_of_one():
    z = randn(1, 2, 3, 1, dtype=torch.complex128, seed=9)
    q = z.conj().imag
    assert q.is_neg()
    k, v = randn(1, 2, 5, 1, seed=10), randn(1, 2, 5, 4, seed=11)
    ours = st.scaled_dot_product_attention(q, k, v)
    ref = composite(q.resolve_neg(), k, v)
    assert_close("out", ours.numpy(), ref.numpy(), contract(np.float64))


@pytest.mark.parametrize("which", ["query", "key", "value", "attn_mask", "grad_out", "sinks"])
def test_every_tensor_argument_with_the_negative_bit(which):
    # One argument at a time is a torch._neg_view of x (values -x, memory x): out and every
    # gradient are those of the same call given -x as an ordinary tensor.
    q, k, v = randn(2, 2, 4, 8, seed=12), randn(2, 2, 6, 8, seed=13), randn(2, 2, 6, 3, seed=14)
    mask, g, sinks = randn(4, 6, seed=15), randn(2, 2, 4, 3, seed=16), randn(2, seed=17)
    names = ("query", "key", "value", "attn_mask", "sinks")

    def run(values, neg_view):
        leaves = {n: values[n].detach().clone().requires_grad_(True) for n in names}
        given = dict(leaves)
        grad_out = values["grad_out"]
        if neg_view:
            if which == "grad_out":
                grad_out = torch._neg_view(grad_out)
            else:
                given[which] = torch._neg_view(leaves[which])
            assert (grad_out if which == "grad_out" else given[which]).is_neg()
        out = st.scaled_dot_product_attention(given["query"], given["key"], given["value"],
                                              given["attn_mask"], sinks=given["sinks"])
        out.backward(grad_out)
        return out.detach(), {n: leaves[n].grad for n in names}

    values = dict(query=q, key=k, value=v, attn_mask=mask, grad_out=g, sinks=sinks)
    out, grads = run(values, neg_view=True)
    values[which] = -values[which]
    want_out, want_grads = run(values, neg_view=False)
    assert torch.equal(out, want_out)
    for n in names:
        want = -want_grads[n] if n == which else want_grads[n]  # d/dx f(-x) = -f'(-x)
        assert_close(f"d {n}", grads[n].numpy(), want.numpy(), contract(np.float64))
        assert grads[n].abs().max() > 0


def test_varlen_with_the_negative_bit():
    q, k, v = randn(7, 2, 4, seed=18), randn(9, 2, 4, seed=19), randn(9, 2, 3, seed=20)
    g = randn(7, 2, 3, seed=21)
    cu_q, cu_k = [0, 3, 7], [0, 4, 9]
    leaf = q.clone().requires_grad_(True)
    out = st.attention_varlen(torch._neg_view(leaf), k, v, cu_q, cu_k, 4, 5)
    out.backward(torch._neg_view(g))
    want_leaf = (-q).requires_grad_(True)
    want = st.attention_varlen(want_leaf, k, v, cu_q, cu_k, 4, 5)
    want.backward(-g)
    assert torch.equal(out.detach(), want.detach())
    assert torch.equal(leaf.grad, -want_leaf.grad)


# ---- alibi_slopes and sinks: shapes ----------------------------------------------------------

@pytest.mark.parametrize("shape", [(3,), (2, 3)], ids=["(Hq,)", "(B, Hq)"])
def test_alibi_shapes_with_a_mask_gradient(shape):
    B, Hq, L, S, E = 2, 3, 4, 5, 8
    q, k, v = randn(B, Hq, L, E, seed=22), randn(B, Hq, S, E, seed=23), randn(B, Hq, S, E, seed=24)
    slopes = torch.arange(1, 1 + math.prod(shape), dtype=torch.float64).reshape(shape) / 10
    mask = (0.3 * randn(L, S, seed=25)).requires_grad_(True)
    ref_mask = mask.detach().clone().requires_grad_(True)
    st.scaled_dot_product_attention(q, k, v, mask, alibi_slopes=slopes).sum().backward()
    composite(q, k, v, ref_mask, slopes=slopes).sum().backward()
    assert_close("d mask", mask.grad.numpy(), ref_mask.grad.numpy(), contract(np.float64))


def test_alibi_with_the_leading_dimensions_of_a_rank_5_query():
    # (N1, N2, Hq, L, E): slopes (N1, N2, Hq) are the composite's slopes[..., None, None]; the
    # same values as (N1 * N2, Hq).
    q, k, v = randn(2, 2, 3, 4, 8, seed=26), randn(2, 2, 3, 5, 8, seed=27), \
        randn(2, 2, 3, 5, 2, seed=28)
    slopes = torch.arange(1, 13, dtype=torch.float64).reshape(2, 2, 3) / 20
    mask = torch.zeros(4, 5, dtype=torch.float64, requires_grad=True)
    ref_mask = mask.detach().clone().requires_grad_(True)
    out = st.scaled_dot_product_attention(q, k, v, mask, alibi_slopes=slopes)
    out.sum().backward()
    flat = st.scaled_dot_product_attention(q, k, v, alibi_slopes=slopes.reshape(4, 3))
    ref = composite(q, k, v, ref_mask, slopes=slopes)
    ref.sum().backward()
    assert torch.equal(out.detach(), flat)
    assert_close("out", out.detach().numpy(), ref.detach().numpy(), contract(np.float64))
    assert_close("d mask", mask.grad.numpy(), ref_mask.grad.numpy(), contract(np.float64))


@pytest.mark.parametrize("kwargs, message", [
    (dict(alibi_slopes=np.ones((3, 2))),
     "alibi_slopes: expected shape (Hq,) = (3,) or (B, Hq) = (2, 3), got (3, 2)"),
    (dict(alibi_slopes=np.ones(6)),
     "alibi_slopes: expected shape (Hq,) = (3,) or (B, Hq) = (2, 3), got (6,)"),
    (dict(alibi_slopes=np.ones((1, 1, 6))),
     "alibi_slopes: expected shape (Hq,) = (3,) or (B, Hq) = (2, 3), got (1, 1, 6)"),
    (dict(alibi_slopes=np.ones(2)),
     "alibi_slopes: expected shape (Hq,) = (3,) or (B, Hq) = (2, 3), got (2,)"),
    (dict(sinks=np.ones((1, 3))), "sinks: expected shape (Hq,) = (3,), got (1, 3)"),
    (dict(sinks=np.ones(6)), "sinks: expected shape (Hq,) = (3,), got (6,)"),
], ids=["(Hq, B)", "(B * Hq,)", "(1, 1, B * Hq)", "too few", "sinks (1, Hq)", "sinks (B * Hq,)"])
def test_wrong_shapes_are_refused_by_name(kwargs, message):
    B, Hq, L, S, E = 2, 3, 4, 4, 8
    q, k, v = randn(B, Hq, L, E, seed=29), randn(B, Hq, S, E, seed=30), randn(B, Hq, S, E, seed=31)
    with pytest.raises(ValueError) as numpy_error:
        sdpa.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), **kwargs)
    assert str(numpy_error.value) == message
    with pytest.raises(ValueError) as numpy_forward_error:
        sdpa.attention_forward(q.numpy(), k.numpy(), v.numpy(), **kwargs)
    assert str(numpy_forward_error.value) == message
    torch_kwargs = {n: torch.tensor(a, requires_grad=n == "sinks") for n, a in kwargs.items()}
    with pytest.raises(ValueError) as torch_error:
        st.scaled_dot_product_attention(q, k, v, **torch_kwargs)
    assert str(torch_error.value) == message


def test_varlen_shapes_follow_the_number_of_sequences():
    q = randn(9, 3, 4, seed=32).numpy()
    cu = [0, 2, 9]
    a = sdpa.attention_varlen(q, q, q, cu, cu, 7, 7, alibi_slopes=np.array([[0.1, 0.2, 0.3],
                                                                             [0.4, 0.5, 0.6]]))
    assert a.shape == (9, 3, 4)
    with pytest.raises(ValueError) as e:
        sdpa.attention_varlen(q, q, q, cu, cu, 7, 7, alibi_slopes=np.ones((3, 2)))
    assert str(e.value) == ("alibi_slopes: expected shape (Hq,) = (3,) or (B, Hq) = (2, 3), "
                            "got (3, 2)")
    with pytest.raises(ValueError, match=r"^sinks: expected shape \(Hq,\) = \(3,\), got \(1, 3\)"):
        st.attention_varlen(torch.from_numpy(q), torch.from_numpy(q), torch.from_numpy(q), cu,
                            cu, 7, 7, sinks=torch.zeros(1, 3, dtype=torch.float64))


# ---- variant keywords checked as the NumPy functions check them ------------------------------

BAD_VARIANTS = {
    "window_size int": {"window_size": 3},
    "window_size str": {"window_size": "ab"},
    "window_size floats": {"window_size": (1.0, 2.0)},
    "alibi_slopes str": {"alibi_slopes": "abc"},
    "alibi_slopes None inside": {"alibi_slopes": [[0.1, None, 0.3]]},
    "alibi_slopes ragged": {"alibi_slopes": [[0.1], [0.2, 0.3]]},
    "sinks str": {"sinks": "abc"},
    "sinks with a str": {"sinks": [1, "a", 2]},
    "seed str, no dropout": {"seed": "x"},
    "seed float, no dropout": {"seed": 1.5},
    "seed negative, no dropout": {"seed": -1},
    "softcap str": {"softcap": "x"},
    # Complex values are refused, not read as their real parts; several values are no number.
    "alibi_slopes complex": {"alibi_slopes": [1j, 1, 1]},
    "alibi_slopes complex tensor": {"alibi_slopes": torch.tensor([1j, 1, 1])},
    "sinks complex": {"sinks": np.array([0.5j, 0, 0])},
    "softcap complex": {"softcap": np.complex128(1 + 1j)},
    "softcap of two values": {"softcap": np.ones(2)},
}


@pytest.mark.parametrize("name", list(BAD_VARIANTS))
def test_bad_variant_keywords_raise_as_numpy(name):
    kwargs = BAD_VARIANTS[name]
    q, k, v = randn(2, 3, 5, 8, seed=33), randn(2, 3, 6, 8, seed=34), randn(2, 3, 6, 4, seed=35)
    name = next(iter(kwargs))
    assert_raises_alike(
        lambda: sdpa.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), **kwargs),
        lambda: st.scaled_dot_product_attention(q, k, v, **kwargs), name)
    # attention_varlen, NumPy and torch alike.
    packed = [t[0].transpose(0, 1).contiguous() for t in (q, k, v)]
    assert_raises_alike(
        lambda: sdpa.attention_varlen(*(t.numpy() for t in packed), [0, 5], [0, 6], 5, 6,
                                      **kwargs),
        lambda: st.attention_varlen(*packed, [0, 5], [0, 6], 5, 6, **kwargs), name)


def test_window_size_of_other_sequence_types():
    # A list or NumPy integers are a pair too, with the mask's gradient as for a tuple.
    q, k, v = randn(1, 2, 6, 4, seed=36), randn(1, 2, 6, 4, seed=37), randn(1, 2, 6, 4, seed=38)
    grads = []
    for window in ((2, 1), [2, 1], np.array([2, 1])):
        mask = torch.zeros(6, 6, dtype=torch.float64, requires_grad=True)
        st.scaled_dot_product_attention(q, k, v, mask, window_size=window).sum().backward()
        grads.append(mask.grad)
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])


def test_varlen_float_offsets_are_refused():
    q, k, v = randn(7, 2, 8, seed=39), randn(7, 2, 8, seed=40), randn(7, 2, 4, seed=41)
    for cu, name, dtype in ((torch.tensor([0.0, 3.9, 7.0]), "cu_seqlens_q", "float32"),
                            ([0.0, 3.0, 7.0], "cu_seqlens_q", "float64")):
        with pytest.raises(TypeError) as torch_error:
            st.attention_varlen(q, k, v, cu, [0, 3, 7], 4, 4)
        assert str(torch_error.value) == (f"{name}: expected an integer array of B + 1 offsets, "
                                          f"got dtype {dtype}")
    with pytest.raises(TypeError, match="^cu_seqlens_k: expected an integer array"):
        st.attention_varlen(q, k, v, [0, 3, 7], torch.tensor([0.0, 3.0, 7.0]), 4, 4)
    # Integer tensors and NumPy arrays are taken as before.
    a = st.attention_varlen(q, k, v, torch.tensor([0, 3, 7]), np.array([0, 3, 7]), 4, 4)
    b = st.attention_varlen(q, k, v, [0, 3, 7], [0, 3, 7], 4, 4)
    assert torch.equal(a, b)


# ---- 16-bit inputs with sinks that require grad ----------------------------------------------

@pytest.mark.parametrize("q_dtype, kv_dtype", [(torch.float16, torch.float16),
                                               (torch.bfloat16, torch.bfloat16),
                                               (torch.float32, torch.float16)])
def test_16bit_inputs_with_sinks_requiring_grad_are_refused_at_the_call(q_dtype, kv_dtype):
    q = randn(1, 2, 3, 4, dtype=q_dtype, seed=42).requires_grad_(True)
    k, v = randn(1, 2, 5, 4, dtype=kv_dtype, seed=43), randn(1, 2, 5, 4, dtype=kv_dtype, seed=44)
    sinks = torch.zeros(2, requires_grad=True)
    with pytest.raises(TypeError) as e:
        st.scaled_dot_product_attention(q, k, v, sinks=sinks)
    assert str(e.value) == ("grad_sinks: expected float32 or float64 inputs, got a "
                            "half-precision query, key or value")
    # Sinks without a gradient, or no gradient wanted at all: served.
    out = st.scaled_dot_product_attention(q, k, v, sinks=sinks.detach())
    out.float().sum().backward()
    assert q.grad is not None
    with torch.no_grad():
        assert st.scaled_dot_product_attention(q, k, v, sinks=sinks).dtype == q_dtype
