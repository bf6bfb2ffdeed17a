"""The variant keywords of the Python module (NumPy and sdpa.torch) and sdpa.attention_varlen,
against torch composites that materialise L x S (float64, torch.autograd for the gradients)."""
import re

import numpy as np
import pytest
import torch

import sdpa
import sdpa.torch as st


def composite(q, k, v, causal="none", window=(-1, -1), softcap=0.0, slopes=None, sinks=None,
              scale=None):
    """FlashAttention's semantics on (B, H, L, E) tensors, written independently."""
    L, S = q.shape[-2], k.shape[-2]
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[-3] // k.shape[-3]
    k = k.repeat_interleave(group, -3)
    v = v.repeat_interleave(group, -3)
    s = scale * q @ k.transpose(-1, -2)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(L, dtype=torch.float64)[:, None]
    j = torch.arange(S, dtype=torch.float64)[None, :]
    d = S - L
    if slopes is not None:
        s = s - torch.as_tensor(slopes).reshape(-1, q.shape[-3], 1, 1) * (i + d - j).abs()
    vis = torch.ones(L, S, dtype=torch.bool)
    if causal == "upper-left":
        vis &= j <= i
    elif causal == "lower-right":
        vis &= j <= i + d
    if window[0] >= 0:
        vis &= j >= i + d - window[0]
    if window[1] >= 0:
        vis &= j <= i + d + window[1]
    s = s.masked_fill(~vis, float("-inf"))
    if sinks is not None:
        sink = sinks.reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)
        lse = torch.logsumexp(torch.cat([s, sink], -1), -1)
    else:
        lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return p @ v, lse


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def test_numpy_keywords_match_the_composite():
    q, k, v, g = rand(2, 4, 33, 8, seed=1), rand(2, 2, 50, 8, seed=2), rand(2, 2, 50, 8, seed=3), \
        rand(2, 4, 33, 8, seed=4)
    slopes = np.array([0.3, 0.1, 0.05, 0.2])
    sinks = np.array([0.5, -1.0, 0.0, 1.5])
    kw = dict(window_size=(10, 3), softcap=2.5, alibi_slopes=slopes, sinks=sinks,
              causal="lower-right", enable_gqa=True)
    for impl, tol in (("reference", 1e-10), ("fast", 1e-10)):
        out, lse = sdpa.attention_forward(q, k, v, impl=impl, **kw)
        tq, tk, tv, ts = (torch.tensor(a, requires_grad=True) for a in (q, k, v, sinks))
        want, want_lse = composite(tq, tk, tv, "lower-right", (10, 3), 2.5, slopes, ts)
        assert np.abs(out - want.detach().numpy()).max() < tol
        assert np.abs(lse - want_lse.detach().numpy()).max() < tol
        want.backward(torch.tensor(g))
        dq, dk, dv, ds = sdpa.attention_backward(q, k, v, out, lse, g, impl=impl, **kw)
        for got, t in ((dq, tq), (dk, tk), (dv, tv), (ds, ts)):
            assert np.abs(got - t.grad.numpy()).max() < tol * 10


def test_scaled_dot_product_attention_dropout():
    q, k, v = rand(1, 2, 20, 4, seed=5), rand(1, 2, 30, 4, seed=6), rand(1, 2, 30, 4, seed=7)
    a = sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.3, seed=1)
    b = sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.3, seed=1)
    c = sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.3, seed=2)
    assert np.array_equal(a, b)
    assert np.abs(a - c).max() > 1e-3
    # The reference draws the same mask.
    r = sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.3, seed=1, impl="reference")
    assert np.abs(a - r).max() < 1e-12


@pytest.mark.parametrize("kwargs, error, fragment", [
    ({"window_size": (-2, 0)}, ValueError, "window_size"),
    ({"window_size": 3}, TypeError, "window_size"),
    ({"softcap": -1.0}, ValueError, "softcap"),
    ({"softcap": float("nan")}, ValueError, "softcap"),
    ({"alibi_slopes": [1.0]}, ValueError, "alibi_slopes"),
    ({"sinks": [1.0, 2.0, 3.0]}, ValueError, "sinks"),
    ({"dropout_p": 1.0}, ValueError, "dropout_p"),
    ({"seed": -1}, ValueError, "seed"),
    ({"seed": 2**64}, ValueError, "seed"),
    ({"seed": 1.5}, TypeError, "seed"),
    ({"window_size": (2**70, 1)}, ValueError, "window_size"),
    ({"windows": (1, 1)}, TypeError, "windows"),
])
def test_bad_keywords_name_the_argument(kwargs, error, fragment):
    q = rand(1, 2, 4, 4)
    with pytest.raises(error, match=fragment):
        sdpa.attention_forward(q, q, q, **kwargs)


def test_torch_autograd_with_sinks():
    torch.manual_seed(0)
    q = torch.randn(2, 3, 40, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 70, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 3, 70, 8, dtype=torch.float64, requires_grad=True)
    sinks = torch.randn(3, dtype=torch.float64, requires_grad=True)
    slopes = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]], dtype=torch.float64)
    out = st.scaled_dot_product_attention(q, k, v, causal="lower-right", window_size=(20, 0),
                                          softcap=3.0, alibi_slopes=slopes, sinks=sinks)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, sinks), g)
    want = composite(q, k, v, "lower-right", (20, 0), 3.0, slopes, sinks)[0]
    want_grads = torch.autograd.grad(want, (q, k, v, sinks), g)
    assert (out - want).abs().max() < 1e-10
    for a, b in zip(grads, want_grads):
        assert (a - b).abs().max() < 1e-9
    # Float32 sinks get a float32 gradient; gradcheck-style check of the sink in float64.
    assert torch.autograd.gradcheck(
        lambda s: st.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), sinks=s,
                                                  window_size=(5, 5)),
        (sinks.detach().clone().requires_grad_(),))


def test_torch_mask_gradient_with_every_variant():
    # A float mask that requires grad, broadcast over the batch, together with a window,
    # softcap, per-batch ALiBi, sinks (with their gradient), dropout and GQA: every gradient
    # against torch.autograd through a composite that draws the library's dropout factors.
    B, H, Hkv, L, S, E = 2, 4, 2, 20, 31, 8
    q, k, v, g = (torch.tensor(rand(*shape, seed=40 + n), requires_grad=n < 3)
                  for n, shape in enumerate([(B, H, L, E), (B, Hkv, S, E), (B, Hkv, S, E),
                                             (B, H, L, E)]))
    mask = torch.tensor(0.5 * rand(1, H, L, S, seed=45), requires_grad=True)
    sinks = torch.tensor([0.3, -0.5, 1.0, 0.0], dtype=torch.float64, requires_grad=True)
    slopes = np.arange(1, 9).reshape(B, H) / 10.0
    kw = dict(window_size=(9, 2), softcap=3.0, alibi_slopes=slopes, dropout_p=0.3, seed=12)
    out = st.scaled_dot_product_attention(q, k, v, attn_mask=mask, causal="lower-right",
                                          enable_gqa=True, sinks=sinks, **kw)
    out.backward(g)
    got = [t.grad.clone() for t in (q, k, v, mask, sinks)]
    for t in (q, k, v, mask, sinks):
        t.grad = None
    z = torch.from_numpy(sdpa._sdpa._dropout_factors(B, H, L, S, 0.3, 12))
    assert 0.2 < float((z == 0).double().mean()) < 0.4
    kk, vv = k.repeat_interleave(2, -3), v.repeat_interleave(2, -3)
    s = (q @ kk.transpose(-1, -2)) / np.sqrt(E)
    s = 3.0 * torch.tanh(s / 3.0)
    i = torch.arange(L, dtype=torch.float64)[:, None]
    j = torch.arange(S, dtype=torch.float64)[None, :]
    d = S - L
    s = s - torch.tensor(slopes)[:, :, None, None] * (i + d - j).abs() + mask
    vis = (j <= i + d) & (j >= i + d - 9) & (j <= i + d + 2)
    s = s.masked_fill(~vis, float("-inf"))
    full = torch.cat([s, sinks.reshape(1, H, 1, 1).expand(B, H, L, 1)], -1)
    p = torch.softmax(full, -1)[..., :-1]
    want = (p * z) @ vv
    assert (out - want).abs().max() < 1e-10
    want.backward(g)
    for a, t in zip(got, (q, k, v, mask, sinks)):
        assert (a - t.grad).abs().max() < 1e-9


def test_torch_dropout_follows_torch_manual_seed():
    q = torch.randn(1, 2, 16, 8)
    torch.manual_seed(3)
    a = st.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    torch.manual_seed(3)
    b = st.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    c = st.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert torch.equal(a, b) and not torch.equal(a, c)


# ---- varlen ----------------------------------------------------------------------------------

def pack(lengths, H, E, seed):
    return rand(sum(lengths), H, E, seed=seed), np.concatenate([[0], np.cumsum(lengths)])


@pytest.mark.parametrize("kw", [
    {},
    {"causal": True},
    {"window_size": (7, 2), "softcap": 2.0, "sinks": np.array([0.2, -0.4, 1.0, 0.0])},
    {"alibi_slopes": np.arange(1, 17).reshape(4, 4) / 20.0, "causal": "upper-left"},
])
@pytest.mark.parametrize("threads", [1, 2])
def test_varlen_is_each_sequence_on_its_own(kw, threads):
    # Two short sequences (the decode kernel's, without variants) run one after the other on a
    # thread: with threads=1 inside a loop of a team of one.
    lq, lk = [5, 0, 70, 3], [9, 4, 140, 30]
    q, cu_q = pack(lq, 4, 8, 11)
    k, cu_k = pack(lk, 2, 8, 12)
    v, _ = pack(lk, 2, 8, 13)
    g, _ = pack(lq, 4, 8, 14)
    out, lse = sdpa.attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), return_lse=True,
                                     threads=threads, **kw)
    grads = sdpa.attention_varlen_backward(q, k, v, cu_q, cu_k, max(lq), max(lk), out, lse, g,
                                           threads=threads, **kw)
    sinks = kw.get("sinks")
    ts = None if sinks is None else torch.tensor(sinks, requires_grad=True)
    causal = kw.get("causal", False)
    causal = "lower-right" if causal is True else ("none" if causal is False else causal)
    want_dk, want_dv = np.zeros_like(k), np.zeros_like(v)
    for b in range(len(lq)):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        tq, tk, tv = (torch.tensor(a[s].transpose(1, 0, 2)[None], requires_grad=True)
                      for a, s in ((q, sq), (k, sk), (v, sk)))
        slopes = kw.get("alibi_slopes")
        o, l = composite(tq, tk, tv, causal, kw.get("window_size", (-1, -1)),
                         kw.get("softcap", 0.0), None if slopes is None else slopes[b], ts)
        assert np.abs(out[sq] - o[0].detach().numpy().transpose(1, 0, 2)).max(initial=0) < 1e-10
        assert np.abs(lse[:, sq] - l[0].detach().numpy()).max(initial=0) < 1e-10
        if lq[b] == 0:
            continue
        o.backward(torch.tensor(g[sq].transpose(1, 0, 2)[None]))
        assert np.abs(grads[0][sq] - tq.grad[0].numpy().transpose(1, 0, 2)).max(initial=0) < 1e-9
        want_dk[sk] = tk.grad[0].numpy().transpose(1, 0, 2)
        want_dv[sk] = tv.grad[0].numpy().transpose(1, 0, 2)
    assert np.abs(grads[1] - want_dk).max(initial=0) < 1e-9
    assert np.abs(grads[2] - want_dv).max(initial=0) < 1e-9
    if sinks is not None:
        assert np.abs(grads[3] - ts.grad.numpy()).max(initial=0) < 1e-9


def test_varlen_dropout_is_per_sequence():
    # Sequence b of a varlen batch draws the mask of batch index b.
    q, cu = pack([30, 30], 2, 4, 21)
    a = sdpa.attention_varlen(q, q, q, cu, cu, 30, 30, dropout_p=0.4, seed=9)
    dense = q.reshape(2, 30, 2, 4).transpose(0, 2, 1, 3)
    b = sdpa.scaled_dot_product_attention(dense, dense, dense, dropout_p=0.4, seed=9)
    assert np.abs(a - b.transpose(0, 2, 1, 3).reshape(60, 2, 4)).max() < 1e-12


def test_varlen_same_bits_for_any_thread_count():
    # Sequences run side by side one thread each, or alone with every thread (the longest here
    # holds over half the work): the bits do not depend on the thread count, forward and
    # backward, the sinks' gradient included.
    lengths = [300, 0, 17, 64, 129, 40, 1]
    q, cu = pack(lengths, 4, 16, 31)
    k, _ = pack(lengths, 2, 16, 32)
    v, _ = pack(lengths, 2, 16, 33)
    g, _ = pack(lengths, 4, 16, 34)
    q, k, v, g = (a.astype(np.float32) for a in (q, k, v, g))
    kw = dict(causal=True, window_size=(50, 3), softcap=5.0, dropout_p=0.2, seed=5,
              alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625]),
              sinks=np.array([0.2, -0.4, 1.0, 0.0]))
    runs = []
    for threads in (1, 2, 3, 8):
        out, lse = sdpa.attention_varlen(q, k, v, cu, cu, 300, 300, return_lse=True,
                                         threads=threads, **kw)
        grads = sdpa.attention_varlen_backward(q, k, v, cu, cu, 300, 300, out, lse, g,
                                               threads=threads, **kw)
        runs.append((out, lse) + tuple(grads))
    assert len(runs[0]) == 6
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert a.tobytes() == b.tobytes()


def test_torch_varlen_autograd():
    # sdpa.torch.attention_varlen: out and every gradient (the sinks' included) are those of
    # the NumPy functions, which the tests above check against composites.
    lq, lk = [6, 0, 33], [10, 3, 40]
    q, cu_q = pack(lq, 4, 8, 51)
    k, cu_k = pack(lk, 2, 8, 52)
    v, _ = pack(lk, 2, 8, 53)
    g, _ = pack(lq, 4, 8, 54)
    sinks = np.array([0.2, -0.4, 1.0, 0.0])
    kw = dict(causal=True, window_size=(12, 1), softcap=2.0, dropout_p=0.25, seed=4,
              alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625]))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    ts = torch.tensor(sinks, requires_grad=True)
    out = st.attention_varlen(tq, tk, tv, torch.tensor(cu_q), cu_k, 33, 40, sinks=ts, **kw)
    out.backward(torch.tensor(g))
    want, lse = sdpa.attention_varlen(q, k, v, cu_q, cu_k, 33, 40, return_lse=True, sinks=sinks,
                                      **kw)
    grads = sdpa.attention_varlen_backward(q, k, v, cu_q, cu_k, 33, 40, want, lse, g,
                                           sinks=sinks, **kw)
    assert np.array_equal(out.detach().numpy(), want)
    for t, w in zip((tq, tk, tv, ts), grads):
        assert np.array_equal(t.grad.numpy(), w)
    assert np.abs(grads[0]).max() > 0 and np.abs(grads[3]).max() > 0
    with pytest.raises(TypeError, match="query"):
        st.attention_varlen(tq.int(), tk, tv, cu_q, cu_k, 33, 40)


@pytest.mark.parametrize("option, value, error", [
    ("threads", 2**40, ValueError), ("threads", 1.5, TypeError), ("threads", True, TypeError),
    ("softmax_scale", "0.5", TypeError), ("max_seqlen_q", 33.0, TypeError),
    ("max_seqlen_k", "40", TypeError)])
def test_torch_varlen_options_are_checked(option, value, error):
    # sdpa.torch.attention_varlen refuses a wrong option by name, as the NumPy function does,
    # instead of converting it with int() or float().
    q, cu_q = pack([6, 33], 2, 8, 55)
    k, cu_k = pack([10, 40], 2, 8, 56)
    args = dict(max_seqlen_q=33, max_seqlen_k=40)
    kw = {}
    (args if option.startswith("max_seqlen") else kw)[option] = value
    t = [torch.tensor(a) for a in (q, k, k)]
    with pytest.raises(error, match=option):
        st.attention_varlen(*t, cu_q, cu_k, args["max_seqlen_q"], args["max_seqlen_k"], **kw)


@pytest.mark.parametrize("cu_q, fragment", [
    ([1, 3, 6], "cu_seqlens_q: expected the first offset to be 0"),
    ([0, 4, 3, 6], "cu_seqlens_q: expected non-decreasing offsets"),
    ([0, 3, 5], "cu_seqlens_q: expected the last offset to be the packed total 6"),
])
def test_varlen_bad_offsets(cu_q, fragment):
    q = rand(6, 2, 4)
    cu_k = [0, 3, 6] if len(cu_q) == 3 else [0, 2, 4, 6]
    with pytest.raises(ValueError, match=fragment):
        sdpa.attention_varlen(q, q, q, cu_q, cu_k, 6, 6)


def test_varlen_max_seqlen_checked():
    q = rand(6, 2, 4)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        sdpa.attention_varlen(q, q, q, [0, 2, 6], [0, 2, 6], 3, 6)


@pytest.mark.parametrize("cu_q, fragment", [
    ([], "cu_seqlens_q: expected B + 1 >= 1 offsets, got none"),
    (np.array([0, 3, 2**64 - 1], np.uint64),
     "cu_seqlens_q: expected offsets below 2^63, got 18446744073709551615"),
])
def test_varlen_offsets_are_named_as_given(cu_q, fragment):
    q = rand(9, 2, 4)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        sdpa.attention_varlen(q, q, q, cu_q, [0, 3, 9], 9, 9)


def test_varlen_offsets_are_checked_before_the_lengths():
    # [0, 6, 3, 9] goes down: its "length" 6 is no length, so max_seqlen_q = 5 is not the fault.
    q = rand(9, 2, 4)
    with pytest.raises(ValueError, match="cu_seqlens_q: expected non-decreasing offsets"):
        sdpa.attention_varlen(q, q, q, [0, 6, 3, 9], [0, 3, 6, 9], 5, 9)


def test_numpy_integers_are_ints():
    # seed, window_size and threads take NumPy integers as Python's.
    q = rand(1, 2, 9, 4, seed=61)
    a = sdpa.scaled_dot_product_attention(q, q, q, dropout_p=0.2, seed=5, window_size=(3, 1),
                                          threads=2)
    b = sdpa.scaled_dot_product_attention(q, q, q, dropout_p=0.2, seed=np.uint64(5),
                                          window_size=(np.int64(3), np.int32(1)),
                                          threads=np.int64(2))
    assert a.tobytes() == b.tobytes()


def test_varlen_reads_byte_swapped_arrays():
    # A '>f8' array holds the same values as its native copy, and gives the same results.
    lengths = [7, 12]
    q, cu = pack(lengths, 2, 4, 71)
    k, _ = pack(lengths, 2, 4, 72)
    v, _ = pack(lengths, 2, 4, 73)
    g, _ = pack(lengths, 2, 4, 74)
    swapped = [a.astype(a.dtype.newbyteorder(">" if a.dtype.byteorder != ">" else "<"))
               for a in (q, k, v, g)]
    assert all(np.array_equal(a, b) for a, b in zip((q, k, v, g), swapped))
    out, lse = sdpa.attention_varlen(q, k, v, cu, cu, 12, 12, return_lse=True)
    out_s, lse_s = sdpa.attention_varlen(*swapped[:3], cu, cu, 12, 12, return_lse=True)
    assert np.array_equal(out, out_s) and np.array_equal(lse, lse_s)
    grads = sdpa.attention_varlen_backward(q, k, v, cu, cu, 12, 12, out, lse, g)
    grads_s = sdpa.attention_varlen_backward(*swapped[:3], cu, cu, 12, 12, out, lse, swapped[3])
    for a, b in zip(grads, grads_s):
        assert np.array_equal(a, b)
