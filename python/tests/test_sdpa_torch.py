"""sdpa.torch: PyTorch 2.x's scaled_dot_product_attention on torch tensors, with autograd.

- torch.autograd.gradcheck in float64 on every option (bool and float masks, both causal
  alignments, GQA, scale, strided layouts): the fused backward is the derivative of the forward;
- float32 results and gradients agree with a torch composite computed in float64 within the
  accuracy contract (conftest.CONTRACT);
- the additive mask's gradient is dS summed over its broadcast dimensions, as PyTorch's autograd
  gives it;
- use() routes torch.nn.functional.scaled_dot_product_attention, patch() routes
  nn.MultiheadAttention, and both agree with PyTorch's own module;
- bad input raises a clear error naming the argument.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import sdpa  # noqa: E402
import sdpa.torch as st  # noqa: E402
from conftest import assert_close, assert_raises_alike, contract  # noqa: E402


def composite(q, k, v, mask=None, causal="none", scale=None, gqa=False):
    """Attention written out in torch operations (what a user would write)."""
    if gqa:
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(E) if scale is None else scale)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask
    if causal != "none":
        allowed = torch.ones(L, S, dtype=torch.bool).tril(0 if causal == "upper-left" else S - L)
        s = s.masked_fill(~allowed, -math.inf)
    return torch.matmul(torch.softmax(s, dim=-1), v)


def tensors(shapes, dtype, seed, grad=True):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, dtype=dtype, generator=gen).requires_grad_(grad) for s in shapes]


# name: (q shape, k shape, v shape, mask kind, mask shape, options)
CASES = {
    "plain": ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 3), None, None, {}),
    "rank 2": ((5, 4), (6, 4), (6, 2), None, None, {}),
    "bool mask (L, S)": ((2, 2, 5, 4), (2, 2, 7, 4), (2, 2, 7, 4), "bool", (5, 7), {}),
    "bool key padding (N, 1, 1, S)": ((2, 2, 5, 4), (2, 2, 7, 4), (2, 2, 7, 4), "bool",
                                      (2, 1, 1, 7), {}),
    "float mask, full": ((2, 2, 5, 4), (2, 2, 7, 4), (2, 2, 7, 4), "float", (2, 2, 5, 7), {}),
    "float mask (H, 1, S)": ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4), "float", (3, 1, 7), {}),
    "float mask (1, S) + is_causal": ((1, 2, 6, 4), (1, 2, 6, 4), (1, 2, 6, 4), "float",
                                      (1, 6), {"is_causal": True}),
    "is_causal L < S (upper-left)": ((1, 2, 4, 4), (1, 2, 7, 4), (1, 2, 7, 4), None, None,
                                     {"is_causal": True}),
    "is_causal L > S": ((1, 2, 7, 4), (1, 2, 4, 4), (1, 2, 4, 4), None, None,
                        {"is_causal": True}),
    "lower-right L < S": ((1, 2, 4, 4), (1, 2, 7, 4), (1, 2, 7, 4), None, None,
                          {"causal": "lower-right"}),
    "scale 0.3": ((1, 2, 5, 4), (1, 2, 6, 4), (1, 2, 6, 4), None, None, {"scale": 0.3}),
    "scale -1.5 + bool mask": ((1, 2, 5, 4), (1, 2, 6, 4), (1, 2, 6, 4), "bool", (5, 6),
                               {"scale": -1.5}),
    "gqa 4/2": ((1, 4, 5, 4), (1, 2, 6, 4), (1, 2, 6, 3), None, None, {"enable_gqa": True}),
    "gqa 6/3 + float mask + lower-right": ((1, 6, 5, 4), (1, 3, 8, 4), (1, 3, 8, 4), "float",
                                           (6, 5, 8), {"enable_gqa": True,
                                                       "causal": "lower-right"}),
}


def make_case(name, dtype, seed=1, mask_grad=True):
    qs, ks, vs, kind, ms, opts = CASES[name]
    q, k, v = tensors((qs, ks, vs), dtype, seed)
    mask = None
    gen = torch.Generator().manual_seed(seed + 100)
    if kind == "bool":
        mask = torch.rand(ms, generator=gen) < 0.8
        mask[..., 0] = True  # every row sees a key
    elif kind == "float":
        mask = torch.randn(ms, dtype=dtype, generator=gen)
        mask = mask.masked_fill(torch.rand(ms, generator=gen) < 0.2, -math.inf)
        mask[..., 0] = 0.5  # every row sees a key
        mask.requires_grad_(mask_grad)
    return q, k, v, mask, opts


def causal_of(opts):
    return "upper-left" if opts.get("is_causal") else opts.get("causal", "none")


@pytest.mark.parametrize("name", list(CASES))
def test_gradcheck_float64(name):
    q, k, v, mask, opts = make_case(name, torch.float64)
    inputs = (q, k, v) + ((mask,) if mask is not None else ())

    def f(*a):
        return st.scaled_dot_product_attention(a[0], a[1], a[2], a[3] if len(a) > 3 else None,
                                               **opts)

    # A float mask holds -inf entries: gradcheck's finite differences leave them -inf (no
    # change, zero derivative), matching the analytic zero there.
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_float32_against_composite(name):
    """float32 out and gradients against the float64 composite, within the float32 contract."""
    q, k, v, mask, opts = make_case(name, torch.float32, seed=2)
    out = st.scaled_dot_product_attention(q, k, v, mask, **opts)
    assert out.dtype == torch.float32
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    out.backward(g)
    ref_in = [t.detach().double().requires_grad_(t.requires_grad) for t in (q, k, v)]
    ref_mask = None
    if mask is not None:
        ref_mask = mask.detach() if mask.dtype == torch.bool else mask.detach().double()
        ref_mask.requires_grad_(mask.requires_grad)
    ref = composite(*ref_in, ref_mask, causal=causal_of(opts), scale=opts.get("scale"),
                    gqa=opts.get("enable_gqa", False))
    ref.backward(g.double())
    bound = contract(np.float32)
    assert_close(f"out ({name})", out.detach().numpy(), ref.detach().numpy(), bound)
    for what, ours, theirs in (("dq", q, ref_in[0]), ("dk", k, ref_in[1]), ("dv", v, ref_in[2])):
        assert_close(f"{what} ({name})", ours.grad.numpy(), theirs.grad.numpy(), bound)
    if mask is not None and mask.requires_grad:
        assert mask.grad.shape == mask.shape
        finite = torch.isfinite(mask.detach()).numpy()
        assert_close(f"dmask ({name})", mask.grad.numpy(), ref_mask.grad.numpy(), bound,
                     valid=finite)
        assert np.all(mask.grad.numpy()[~finite] == 0), "gradient at -inf mask entries"


def test_strided_layouts_go_in_as_views():
    """(N, L, H, E) tensors viewed as (N, H, L, E), slices of a packed QKV projection and an
    expanded mask give the results of their contiguous copies, forward and backward."""
    N, L, H, E = 2, 9, 3, 8
    x = torch.randn(N, L, 3 * H * E, dtype=torch.float64)
    qkv = x.view(N, L, 3, H, E)  # packed projection
    views = [qkv[:, :, i].transpose(1, 2) for i in range(3)]  # (N, H, L, E), strided
    assert not views[0].is_contiguous() and views[0].stride(-1) == 1
    mask = (torch.rand(L, L) < 0.8).logical_or(torch.eye(L, dtype=torch.bool))
    mask = mask.expand(N, H, L, L)  # stride 0 over N and H
    leaves = [t.detach().clone().requires_grad_(True) for t in views]
    strided = [t.detach().requires_grad_(True) for t in views]
    a = st.scaled_dot_product_attention(*strided, mask, is_causal=True)
    b = st.scaled_dot_product_attention(*(t.contiguous() for t in leaves), mask.contiguous(),
                                        is_causal=True)
    c = composite(*(t.detach() for t in views), mask, causal="upper-left")
    assert_close("strided vs composite", a.detach().numpy(), c.numpy(), contract(np.float64))
    assert torch.equal(a, b), "a strided view gives another result than its contiguous copy"
    g = torch.randn(a.shape, dtype=torch.float64)
    a.backward(g)
    b.backward(g)
    for s, c_ in zip(strided, leaves):
        assert torch.equal(s.grad, c_.grad)
    # gradcheck straight through the packed projection
    w = torch.randn(N, L, 3 * H * E, dtype=torch.float64, requires_grad=True)

    def f(w):
        p = w.view(N, L, 3, H, E)
        return st.scaled_dot_product_attention(*(p[:, :, i].transpose(1, 2) for i in range(3)))

    assert torch.autograd.gradcheck(f, (w,), eps=1e-6, atol=1e-7)


def test_fully_masked_rows_are_zero_with_zero_gradients():
    q, k, v = tensors(((1, 2, 4, 4), (1, 2, 5, 4), (1, 2, 5, 4)), torch.float64, 3)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[2] = False
    out = st.scaled_dot_product_attention(q, k, v, mask)
    out.sum().backward()
    assert torch.all(out[..., 2, :] == 0)
    assert torch.all(q.grad[..., 2, :] == 0)
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()


def test_matches_torch_private_sdpa():
    """torch 1.13's own (private) fused function, where it exists, on a bool mask."""
    if not hasattr(F, "_scaled_dot_product_attention"):
        pytest.skip("no F._scaled_dot_product_attention in this torch")
    q, k, v = tensors(((2, 2, 6, 8), (2, 2, 6, 8), (2, 2, 6, 8)), torch.float64, 4, grad=False)
    mask = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    theirs = F._scaled_dot_product_attention(q, k, v, mask, 0.0, False, False)[0]
    ours = st.scaled_dot_product_attention(q, k, v, mask)
    assert_close("vs torch", ours.numpy(), theirs.numpy(), contract(np.float64))


def test_bad_input():
    q, k, v = tensors(((1, 2, 4, 4), (1, 2, 5, 4), (1, 2, 5, 4)), torch.float32, 5, grad=False)
    with pytest.raises(ValueError, match="dropout_p"):
        st.scaled_dot_product_attention(q, k, v, dropout_p=1.5)
    with pytest.raises(TypeError, match="query: expected dtype"):
        st.scaled_dot_product_attention(q.int(), k, v)
    with pytest.raises(TypeError, match="key/value: expected the query's dtype float16"):
        st.scaled_dot_product_attention(q.half(), k, v)
    with pytest.raises(TypeError, match="key/value"):
        st.scaled_dot_product_attention(q, k.double(), v)
    with pytest.raises(TypeError, match="query: expected a torch.Tensor"):
        st.scaled_dot_product_attention(q.numpy(), k, v)
    with pytest.raises(TypeError, match="attn_mask: expected dtype"):
        st.scaled_dot_product_attention(q, k, v, torch.ones(4, 5, dtype=torch.int32))
    with pytest.raises(ValueError, match="key: expected last dimension"):
        st.scaled_dot_product_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="attn_mask: expected a shape that broadcasts"):
        st.scaled_dot_product_attention(q, k, v, torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="enable_gqa"):
        st.scaled_dot_product_attention(q, k[:, :1].expand(1, 2, 5, 4)[:, :1].repeat(1, 3, 1, 1)
                                        [:, :3], v[:, :1].repeat(1, 3, 1, 1), enable_gqa=True)
    with pytest.raises(ValueError, match="scale: expected a finite number"):
        st.scaled_dot_product_attention(q, k, v, scale=math.inf)
    with pytest.raises(ValueError, match="is_causal"):
        st.scaled_dot_product_attention(q, k, v, is_causal=True, causal="lower-right")


def test_mask_gradient_rank_2_with_dropout():
    """Rank-2 (L, E) inputs have no head dimension: the mask's gradient under dropout draws the
    library's factors for one batch and one head."""
    q, k, v = tensors(((5, 4), (6, 4), (6, 3)), torch.float64, 9)
    mask = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)

    def f(q, k, v, mask):
        return st.scaled_dot_product_attention(q, k, v, mask, dropout_p=0.3, seed=11)

    assert torch.autograd.gradcheck(f, (q, k, v, mask), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("shapes", [((0, 2, 3, 4), (0, 2, 5, 4), (0, 2, 5, 3)),
                                    ((1, 2, 0, 4), (1, 2, 5, 4), (1, 2, 5, 3)),
                                    ((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 0))],
                         ids=["batch 0", "L 0", "Ev 0"])
def test_empty_out_gives_zero_gradients(shapes):
    """An empty out (autograd passes its gradient as expanded zeros, every stride 0): zero
    gradients of the inputs' shapes, the mask's included."""
    q, k, v = tensors(shapes, torch.float32, 10)
    mask = torch.zeros(shapes[0][-2], shapes[1][-2], requires_grad=True)
    out = st.scaled_dot_product_attention(q, k, v, mask)
    assert out.shape == shapes[0][:-1] + shapes[2][-1:]
    out.sum().backward()
    for t in (q, k, v, mask):
        assert t.grad.shape == t.shape and torch.all(t.grad == 0)


def test_empty_query_with_strided_last_dimension():
    """An empty tensor whose last dimension is strided: torch calls it contiguous, so
    contiguous() keeps its strides; it goes in as a C-order clone, gradient included."""
    q = torch.zeros(0, 2, 4, 3, requires_grad=True)
    k = torch.zeros(0, 2, 5, 4, requires_grad=True)
    out = st.scaled_dot_product_attention(q.transpose(-1, -2), k, k)
    assert out.shape == (0, 2, 3, 4)
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


# Options that both the NumPy functions and sdpa.torch refuse, with the same error.
BAD_OPTIONS = {
    "is_causal str": {"is_causal": "no"},
    "is_causal int": {"is_causal": 1},
    "enable_gqa str": {"enable_gqa": "no"},
    "scale str": {"scale": "0.5"},
    "scale not a number": {"scale": "abc"},
    "scale bool": {"scale": True},
    "threads bool": {"threads": True},
    "threads float": {"threads": 2.0},
    "threads too many": {"threads": 2**40},
    "threads negative": {"threads": -1},
    "dropout_p None": {"dropout_p": None},
    "dropout_p str": {"dropout_p": "0.1"},
    "impl int": {"impl": 1},
    "causal bool": {"causal": True},
}


@pytest.mark.parametrize("name", list(BAD_OPTIONS))
def test_bad_options_raise_as_numpy(name):
    kwargs = BAD_OPTIONS[name]
    q, k, v = tensors(((1, 2, 4, 4), (1, 2, 5, 4), (1, 2, 5, 4)), torch.float32, 5, grad=False)
    assert_raises_alike(
        lambda: sdpa.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), **kwargs),
        lambda: st.scaled_dot_product_attention(q, k, v, **kwargs), next(iter(kwargs)))


def test_good_options_of_other_types():
    """NumPy's bool and integer scalars, and any real number as scale."""
    q, k, v = tensors(((1, 2, 4, 4), (1, 2, 5, 4), (1, 2, 5, 4)), torch.float64, 5, grad=False)
    ref = st.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5, threads=1)
    out = st.scaled_dot_product_attention(q, k, v, is_causal=np.bool_(True),
                                          scale=np.float32(0.5), threads=np.int64(1),
                                          enable_gqa=np.bool_(False), dropout_p=0)
    assert torch.equal(out, ref)


def test_use_routes_functional():
    q, k, v = tensors(((1, 2, 6, 8), (1, 2, 6, 8), (1, 2, 6, 8)), torch.float64, 6)
    had = hasattr(F, "scaled_dot_product_attention")
    before = getattr(F, "scaled_dot_product_attention", None)
    with st.use():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert out.grad_fn is not None and "_Attention" in type(out.grad_fn).__name__
    assert hasattr(F, "scaled_dot_product_attention") == had
    assert getattr(F, "scaled_dot_product_attention", None) is before
    ref = composite(q, k, v, causal="upper-left")
    assert_close("use()", out.detach().numpy(), ref.detach().numpy(), contract(np.float64))


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("masks", ["none", "bool", "float+padding", "float with inf and nan+padding"])
def test_patch_multihead_attention(batch_first, masks):
    torch.manual_seed(7)
    E, H, N, L = 16, 4, 2, 6
    mha = torch.nn.MultiheadAttention(E, H, batch_first=batch_first).double()
    x = torch.randn((N, L, E) if batch_first else (L, N, E), dtype=torch.float64)
    kwargs = {"need_weights": False}
    if masks == "bool":
        kwargs["attn_mask"] = ~torch.tril(torch.ones(L, L, dtype=torch.bool))  # True = blocked
    elif masks.endswith("+padding"):
        kwargs["attn_mask"] = torch.randn(L, L, dtype=torch.float64)
        if "inf" in masks:  # +inf and NaN at keys the padding removes: -inf there all the same
            kwargs["attn_mask"][:, -1] = math.inf
            kwargs["attn_mask"][0, -2] = math.nan
        pad = torch.zeros(N, L, dtype=torch.bool)
        pad[:, -2:] = True
        kwargs["key_padding_mask"] = pad
    theirs = mha(x, x, x, **kwargs)[0]
    g_theirs = torch.autograd.grad(theirs.sum(), mha.in_proj_weight)[0]
    assert st.patch(mha) == 1
    ours, weights = mha(x, x, x, **kwargs)
    assert weights is None
    g_ours = torch.autograd.grad(ours.sum(), mha.in_proj_weight)[0]
    assert_close("patched MHA", ours.detach().numpy(), theirs.detach().numpy(),
                 contract(np.float64))
    assert_close("patched MHA grad", g_ours.numpy(), g_theirs.numpy(), contract(np.float64))
    assert st.unpatch(mha) == 1
    assert "forward" not in mha.__dict__


@pytest.mark.parametrize("which", ["attn_mask", "key_padding_mask", "float padding + bool mask",
                                   "float padding + float mask"])
def test_patch_falls_back_on_masks_sdpa_does_not_take(which):
    """uint8 masks, which sdpa does not take, run PyTorch's own code in a patched module: the
    same result (PyTorch 1.13 takes a uint8 attn_mask, deprecated, with a warning) or the same
    error (it refuses a uint8 key_padding_mask). So does a float key_padding_mask beside an
    attn_mask, which PyTorch versions merge differently: the installed one's bits."""
    import warnings

    torch.manual_seed(8)
    E, H, N, L = 16, 4, 2, 5
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True).double()
    x = torch.randn(N, L, E, dtype=torch.float64)
    if which == "attn_mask":
        mask = (torch.rand(L, L) < 0.3).to(torch.uint8)  # 1 = do not attend
        mask.fill_diagonal_(0)
        masks = {"attn_mask": mask}
    elif which == "key_padding_mask":
        mask = torch.zeros(N, L, dtype=torch.uint8)
        mask[1, -2:] = 1
        masks = {"key_padding_mask": mask}
    else:
        padding = torch.zeros(N, L, dtype=torch.float64)
        padding[1, -2:] = -3.0
        masks = {"key_padding_mask": padding,
                 "attn_mask": (~torch.tril(torch.ones(L, L, dtype=torch.bool))
                               if "bool" in which else torch.randn(L, L, dtype=torch.float64))}

    def outcome():
        try:
            return mha(x, x, x, need_weights=False, **masks)[0]
        except Exception as e:  # noqa: BLE001 (compared below)
            return e

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = outcome()
        assert st.patch(mha) == 1
        ours = outcome()
    st.unpatch(mha)
    if isinstance(theirs, Exception):
        assert type(ours) is type(theirs) and str(ours) == str(theirs), (ours, theirs)
    else:
        assert isinstance(ours, torch.Tensor), ours
        assert torch.equal(ours, theirs)


def test_module_is_loaded_with_torch():
    assert sdpa.torch is st
    assert st.scaled_dot_product_attention.__doc__


@pytest.mark.parametrize("what", ["forward", "backward"])
def test_gil_released(what):
    """Another Python thread runs while sdpa.torch computes (forward, and backward through
    autograd); the control that the counter stops under a held GIL is in test_gil.py."""
    from test_gil import timestamps_during

    n = 128
    while True:
        q, k, v = tensors(((1, 2, n, 64),) * 3, torch.float64, 8, grad=(what == "backward"))
        if what == "forward":
            def call():
                st.scaled_dot_product_attention(q, k, v, impl="reference", threads=1)
        else:
            out = st.scaled_dot_product_attention(q, k, v, impl="reference", threads=1)

            def call():
                out.sum().backward()
        t0, t1, stamps = timestamps_during(call)
        if t1 - t0 >= 0.2 or n >= 4096:
            break
        n *= 2
    margin = 0.1 * (t1 - t0)
    inside = [s for s in stamps if t0 + margin < s < t1 - margin]
    assert t1 - t0 >= 0.2, f"the call took only {t1 - t0:.3f} s at L = S = {n}"
    assert len(inside) >= 5, f"only {len(inside)} counter steps in {t1 - t0:.3f} s: GIL held"
