"""float16 and bfloat16 through Python (docs/precision.md): NumPy float16 arrays, bfloat16 as
uint16 bit patterns, torch.float16 / torch.bfloat16 tensors in sdpa.torch with gradients in
their dtypes; results against a float64 NumPy computation of the same (exactly widened) inputs,
within the accuracy rule: the fast path's error at most twice the half-precision naive
baseline's plus a float32 floor."""
import numpy as np
import pytest

import sdpa


def attention64(q, k, v, scale=None):
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def inputs(seed=0, shape=(2, 3, 33, 16), S=45):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(shape)
    k = rng.standard_normal(shape[:-2] + (S, shape[-1]))
    v = rng.standard_normal(shape[:-2] + (S, shape[-1]))
    return q, k, v


def widen(a):
    a = np.asarray(a)
    return sdpa.from_bfloat16(a) if a.dtype == np.uint16 else a.astype(np.float32)


def err(x, ref):
    return float(np.max(np.abs(widen(x).astype(np.float64) - ref)))


def test_bfloat16_conversions():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, np.inf, -np.inf, 3.0e38, 1e-40], np.float32)
    bits = sdpa.to_bfloat16(x)
    assert bits.dtype == np.uint16
    # 1 + 2^-8 is a tie (to even: 1.0); 1 + 3 * 2^-8 is a tie (to even: 1 + 2^-6).
    assert list(bits[:4]) == [0x3F80, 0x3F80, 0x3F82, 0xC020]
    assert bits[4] == 0x7F80 and bits[5] == 0xFF80
    back = sdpa.from_bfloat16(bits)
    assert back.dtype == np.float32 and back[0] == 1.0 and np.isinf(back[4])
    assert np.isnan(sdpa.from_bfloat16(sdpa.to_bfloat16(np.array([np.nan], np.float32))))[0]
    with pytest.raises(TypeError, match="bits: expected dtype uint16"):
        sdpa.from_bfloat16(np.zeros(3, np.int32))


def test_bfloat16_conversions_keep_the_shape():
    # 0-d inputs (NumPy scalars too), empty and non-contiguous arrays keep their shapes.
    assert sdpa.to_bfloat16(np.float32(1.5)).shape == ()
    assert sdpa.to_bfloat16(np.float32(1.5)) == 0x3FC0
    assert sdpa.from_bfloat16(np.uint16(0x3FC0)).shape == ()
    assert sdpa.from_bfloat16(np.array(0x3FC0, np.uint16)) == 1.5
    assert np.isnan(sdpa.from_bfloat16(sdpa.to_bfloat16(np.float32(np.nan))))
    assert sdpa.to_bfloat16(np.zeros((2, 0, 3))).shape == (2, 0, 3)
    x = np.arange(12, dtype=np.float32).reshape(3, 4).T
    bits = sdpa.to_bfloat16(x)
    assert bits.shape == (4, 3)
    np.testing.assert_array_equal(sdpa.from_bfloat16(bits), x)
    np.testing.assert_array_equal(sdpa.from_bfloat16(bits.T), x.T)


@pytest.mark.parametrize("kind", ["float16", "bfloat16"])
def test_numpy_forward_backward_accuracy_rule(kind):
    q, k, v = inputs()
    conv = (lambda a: a.astype(np.float16)) if kind == "float16" else sdpa.to_bfloat16
    qh, kh, vh = conv(q), conv(k), conv(v)
    ref = attention64(widen(qh), widen(kh), widen(vh))
    fast, lse = sdpa.attention_forward(qh, kh, vh, return_lse=True)
    naive, naive_lse = sdpa.attention_forward(qh, kh, vh, return_lse=True, impl="naive")
    assert fast.dtype == qh.dtype and naive.dtype == qh.dtype
    assert lse.dtype == np.float32
    floor = 4 * np.finfo(np.float32).eps * np.max(np.abs(ref))
    assert err(fast, ref) <= 2 * err(naive, ref) + floor
    # The baseline is a 16-bit computation.
    eps = 2.0 ** -7 if kind == "bfloat16" else 2.0 ** -10
    assert err(naive, ref) >= 0.1 * eps * np.max(np.abs(ref))
    # Backward: gradients in the inputs' dtype, within the rule against the reference path.
    g = conv(np.random.default_rng(9).standard_normal(fast.shape))
    grads = sdpa.attention_backward(qh, kh, vh, fast, lse, g)
    grads_naive = sdpa.attention_backward(qh, kh, vh, naive, naive_lse, g, impl="naive")
    q64, k64, v64, g64 = (widen(a).astype(np.float64) for a in (qh, kh, vh, g))
    grads_ref = sdpa.attention_backward(q64, k64, v64, ref, np.zeros(ref.shape[:-1]), g64,
                                        impl="reference")
    for a, b, r in zip(grads, grads_naive, grads_ref):
        assert a.dtype == qh.dtype
        floor = 8 * np.finfo(np.float32).eps * np.max(np.abs(r))
        assert err(a, r) <= 2 * err(b, r) + floor


def test_float32_query_on_bfloat16_cache():
    q, k, v = inputs(1, shape=(1, 4, 1, 64), S=200)
    kb, vb = sdpa.to_bfloat16(k), sdpa.to_bfloat16(v)
    out = sdpa.scaled_dot_product_attention(q.astype(np.float32), kb, vb)
    assert out.dtype == np.float32
    ref = attention64(q.astype(np.float32), widen(kb), widen(vb))
    assert err(out, ref) <= 2e-5 * np.max(np.abs(ref))


def test_dtype_errors():
    q, k, v = inputs()
    with pytest.raises(TypeError, match="key/value: expected the query's dtype float16"):
        sdpa.scaled_dot_product_attention(q.astype(np.float16), k.astype(np.float32), v)
    with pytest.raises(TypeError, match=r"expected dtype float32, float64, float16 or uint16"):
        sdpa.scaled_dot_product_attention(q.astype(np.int16), k, v)
    with pytest.raises(TypeError, match="x: expected dtype float32 or float64, got float16"):
        sdpa.softmax(np.ones(3, np.float16))


def test_cli_reads_and_writes_16bit_npy(tmp_path):
    """sdpa attention on '<f2' and '<u2' (bfloat16 bits) files: out in the query's dtype, lse
    float32, against the float64 computation; sdpa bench --dtype runs and says its dtype."""
    import json
    import os
    import subprocess

    cli = os.environ["SDPA"]
    q, k, v = inputs(4, shape=(2, 9, 8), S=13)
    for kind, conv in (("float16", lambda a: a.astype(np.float16)), ("bfloat16", sdpa.to_bfloat16)):
        paths = {}
        for name, a in (("q", q), ("k", k), ("v", v)):
            paths[name] = str(tmp_path / f"{kind}_{name}.npy")
            np.save(paths[name], conv(a))
        out, lse = str(tmp_path / f"{kind}_out.npy"), str(tmp_path / f"{kind}_lse.npy")
        subprocess.run([cli, "attention", "--query", paths["q"], "--key", paths["k"], "--value",
                        paths["v"], "--out", out, "--lse", lse], check=True)
        o, l = np.load(out), np.load(lse)
        assert o.dtype == (np.float16 if kind == "float16" else np.uint16) and l.dtype == np.float32
        ref = attention64(widen(conv(q)), widen(conv(k)), widen(conv(v)))
        eps = 2.0 ** -7 if kind == "bfloat16" else 2.0 ** -10
        assert err(o, ref) <= eps * np.max(np.abs(ref))
        r = subprocess.run([cli, "bench", "--dtype", kind, "--batch", "1", "--heads", "1", "--seq",
                            "64", "--dim", "16", "--repeat", "1", "--json"], check=True,
                           capture_output=True, text=True)
        assert json.loads(r.stdout)["dtype"] == kind
    bad = subprocess.run([cli, "attention", "--query", str(tmp_path / "float16_q.npy"), "--key",
                          str(tmp_path / "bfloat16_k.npy"), "--value",
                          str(tmp_path / "bfloat16_v.npy"), "--out", str(tmp_path / "x.npy")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "expected the query's dtype float16" in bad.stderr
    assert not (tmp_path / "x.npy").exists()


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_half_tensors_and_gradients(dtype):
    import sdpa.torch as st

    td = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 37, 32, generator=gen).to(td).requires_grad_()
    k = torch.randn(2, 2, 50, 32, generator=gen).to(td).requires_grad_()
    v = torch.randn(2, 2, 50, 32, generator=gen).to(td).requires_grad_()
    out = st.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert out.dtype == td
    g = torch.randn(out.shape, generator=gen).to(td)
    out.backward(g)
    assert q.grad.dtype == td and k.grad.dtype == td and v.grad.dtype == td
    # The same inputs in float64 through PyTorch's own maths: the reference.
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    kr, vr = k64.repeat_interleave(2, dim=1), v64.repeat_interleave(2, dim=1)
    s = q64 @ kr.transpose(-2, -1) / 32 ** 0.5
    s = s.masked_fill(~torch.ones(37, 50, dtype=torch.bool).tril(), float("-inf"))
    ref = torch.softmax(s, -1) @ vr
    ref.backward(g.double())
    # The naive half baseline, through sdpa itself.
    qn, kn, vn = (t.detach().clone().requires_grad_() for t in (q, k, v))
    outn = st.scaled_dot_product_attention(qn, kn, vn, is_causal=True, enable_gqa=True,
                                           impl="naive")
    outn.backward(g)
    eps32 = torch.finfo(torch.float32).eps
    for ours, naive, truth in ((out, outn, ref), (q.grad, qn.grad, q64.grad),
                               (k.grad, kn.grad, k64.grad), (v.grad, vn.grad, v64.grad)):
        e = (ours.double() - truth).abs().max().item()
        en = (naive.double() - truth).abs().max().item()
        assert e <= 2 * en + 8 * eps32 * truth.abs().max().item(), (e, en)


@pytest.mark.parametrize("q_dtype,kv_dtype", [("float16", "float16"), ("bfloat16", "bfloat16"),
                                              ("float32", "bfloat16"), ("float32", "float16"),
                                              ("bfloat16", "float16")])
def test_torch_mask_gradient_16bit(q_dtype, kv_dtype):
    """The gradient of a float mask for 16-bit inputs and for a float32 query on a 16-bit key and
    value: formed in float32 (torch has no float16 CPU matmul) with lse as the forward gave it
    (float32), rounded only at the end to the mask's dtype. Against PyTorch's maths in float64
    on the same (exactly widened) inputs; the query is scaled by 4 so that |lse| is large
    (about 14), where scores or lse rounded to bfloat16 would cost |lse| * 2^-9."""
    import math

    import sdpa.torch as st

    qd, kvd = getattr(torch, q_dtype), getattr(torch, kv_dtype)
    L, S, E = 16, 64, 64
    gen = torch.Generator().manual_seed(4)
    q = (4 * torch.randn(2, 2, L, E, generator=gen)).to(qd)
    k = torch.randn(2, 2, S, E, generator=gen).to(kvd)
    v = torch.randn(2, 2, S, E, generator=gen).to(kvd)
    g = torch.randn(2, 2, L, E, generator=gen).to(qd)
    mask0 = torch.randn(L, S, generator=gen).to(qd)
    mask = mask0.clone().requires_grad_()
    st.scaled_dot_product_attention(q, k, v, mask).backward(g)
    assert mask.grad.dtype == qd and mask.grad.shape == (L, S)
    m64 = mask0.double().requires_grad_()
    s = q.double() @ k.double().transpose(-2, -1) / math.sqrt(E) + m64
    (torch.softmax(s, -1) @ v.double()).backward(g.double())
    err = (mask.grad.double() - m64.grad).abs().max().item() / m64.grad.abs().max().item()
    # float32 results: the float32 contract; 16-bit results: two epsilons of their dtype (the
    # result's rounding, and out's in rowsum(dO * O)). Measured: float16 5e-4, bfloat16 5e-3,
    # float32 2e-6; with bfloat16 scores and lse it was 4e-2.
    bound = 2e-5 if qd == torch.float32 else 2 * torch.finfo(qd).eps
    assert err <= bound, (err, bound)
