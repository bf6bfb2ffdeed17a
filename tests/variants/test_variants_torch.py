#!/usr/bin/env python3
"""The attention variants (window, softcap, ALiBi, sinks) of `sdpa attention` against a torch
composite that materialises L x S, forward and backward (torch.autograd, float64).

FlashAttention's semantics, written here independently of the library: i the query, j the key,
d = S - L; query i sees j in [i + d - left, i + d + right]; the score is
c * tanh(scale * q.k / c) - slope * |i + d - j|; a sink is one more logit in the softmax's
denominator with value 0. Both implementations are checked: --impl reference in float64 (to
1e-10) and --impl fast in float32 (to 2e-5 of the largest magnitude). Runs with $SDPA; needs
numpy and torch."""
import os
import json
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, finish  # noqa: E402

SDPA = os.environ.get("SDPA", "sdpa")


def composite(q, k, v, causal, window, softcap, slopes, sinks, scale):
    L, S = q.shape[-2], k.shape[-2]
    s = scale * q @ k.transpose(-1, -2)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(L, dtype=torch.float64)[:, None]
    j = torch.arange(S, dtype=torch.float64)[None, :]
    d = S - L
    if slopes is not None:
        s = s - slopes.reshape(-1, q.shape[-3], 1, 1) * (i + d - j).abs()
    vis = torch.ones(L, S, dtype=torch.bool)
    if causal == "upper-left":
        vis &= j <= i
    elif causal == "lower-right":
        vis &= j <= i + d
    left, right = window
    if left >= 0:
        vis &= j >= i + d - left
    if right >= 0:
        vis &= j <= i + d + right
    s = s.masked_fill(~vis, float("-inf"))
    if sinks is not None:
        sink = sinks.reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)
        logits = torch.cat([s, sink], -1)
        lse = torch.logsumexp(logits, -1)
        p = torch.exp(s - lse[..., None])
    else:
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # a row without keys: 0, not NaN
    return p @ v, lse


def run(*args):
    return subprocess.run([SDPA, *args], capture_output=True, text=True)


CASES = [
    # (B, H, L, S, E, causal, window, softcap, alibi, sinks)
    (1, 2, 9, 9, 4, "none", (2, 1), 0.0, False, False),
    (2, 2, 7, 12, 5, "lower-right", (3, -1), 0.0, False, False),
    (1, 3, 12, 6, 4, "none", (-1, 0), 0.0, False, False),  # L > S: d < 0, leading rows see none
    (1, 2, 8, 10, 4, "none", (-1, -1), 1.5, False, False),
    (2, 2, 8, 10, 4, "upper-left", (-1, -1), 0.0, True, False),
    (1, 2, 8, 10, 4, "none", (-1, -1), 0.0, False, True),
    (1, 2, 12, 6, 4, "none", (1, 0), 2.0, True, True),  # fully masked rows with a sink
    (2, 2, 140, 300, 8, "lower-right", (100, 20), 3.0, True, True),  # several kernel tiles
]

with tempfile.TemporaryDirectory() as tmp:
    f = lambda name: os.path.join(tmp, name)
    rng = np.random.default_rng(15)
    for n, (B, H, L, S, E, causal, window, cap, alibi, sink) in enumerate(CASES):
        q = rng.standard_normal((B, H, L, E)) * 1.5
        k = rng.standard_normal((B, H, S, E)) * 1.5
        v = rng.standard_normal((B, H, S, E))
        g = rng.standard_normal((B, H, L, E))
        slopes = rng.uniform(0.05, 0.5, (B, H)) if alibi else None
        sinks = rng.standard_normal(H) if sink else None
        scale = 1 / np.sqrt(E)
        tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
        ts = torch.tensor(sinks, requires_grad=True) if sink else None
        out, lse = composite(tq, tk, tv, causal, window, cap,
                             torch.tensor(slopes) if alibi else None, ts, scale)
        out.backward(torch.tensor(g))
        want = {"out": out.detach().numpy(), "lse": lse.detach().numpy(), "dq": tq.grad.numpy(),
                "dk": tk.grad.numpy(), "dv": tv.grad.numpy()}
        if sink:
            want["dsinks"] = ts.grad.numpy()
        for impl, dtype, tol in (("reference", np.float64, 1e-10), ("fast", np.float32, 2e-5)):
            for name, a in (("q", q), ("k", k), ("v", v), ("g", g)):
                np.save(f(name + ".npy"), a.astype(dtype))
            args = ["attention", "--query", f("q.npy"), "--key", f("k.npy"), "--value",
                    f("v.npy"), "--out", f("out.npy"), "--lse", f("lse.npy"), "--grad-output",
                    f("g.npy"), "--grad-query", f("dq.npy"), "--grad-key", f("dk.npy"),
                    "--grad-value", f("dv.npy"), "--impl", impl, "--causal", causal,
                    "--window", f"{window[0]},{window[1]}", "--softcap", str(cap)]
            if alibi:
                np.save(f("slopes.npy"), slopes)
                args += ["--alibi-slopes", f("slopes.npy")]
            if sink:
                np.save(f("sinks.npy"), sinks)
                args += ["--sinks", f("sinks.npy"), "--grad-sinks", f("dsinks.npy")]
            r = run(*args)
            if not check(r.returncode == 0, f"case {n} {impl}: exit 0, got {r.stderr}"):
                continue
            for key, w in want.items():
                got = np.load(f(key + ".npy")).astype(np.float64)
                finite = np.isfinite(w)
                same_inf = np.array_equal(np.isfinite(got), finite) and np.array_equal(
                    got[~finite], w[~finite])
                err = np.abs(got[finite] - w[finite]).max(initial=0.0)
                bound = tol * max(1.0, np.abs(w[finite]).max(initial=0.0))
                check(same_inf and err <= bound,
                      f"case {n} {impl} {key}: max error {err:.3g} > {bound:.3g} "
                      f"or infinities differ")

    # Bad values are refused with exit 2 and the option named.
    np.save(f("q.npy"), np.zeros((1, 2, 3, 4), np.float32))
    np.save(f("k.npy"), np.zeros((1, 2, 3, 4), np.float32))
    base = ["attention", "--query", f("q.npy"), "--key", f("k.npy"), "--value", f("k.npy"),
            "--out", f("out.npy")]
    np.save(f("bad3.npy"), np.zeros(3))
    for extra, word in ((["--window", "-2,0"], "--window"), (["--window", "3"], "--window"),
                        (["--softcap", "-1"], "--softcap:"), (["--softcap", "nan"], "--softcap:"),
                        (["--dropout-p", "1"], "--dropout-p:"),
                        (["--dropout-p", "-0.1"], "--dropout-p:"),
                        (["--sinks", f("bad3.npy")], f"--sinks {f('bad3.npy')}: expected shape"),
                        (["--alibi-slopes", f("bad3.npy")],
                         f"--alibi-slopes {f('bad3.npy')}: expected shape"),
                        (["--impl", "naive", "--softcap", "1"], "impl")):
        r = run(*base, *extra)
        check(r.returncode == 2 and word in r.stderr and r.stderr.startswith("sdpa: error:"),
              f"{extra}: exit 2 naming {word}, got {r.returncode}: {r.stderr.strip()}")

    # `sdpa bench` times the variants: they reach the options (the JSON echoes them), a window's
    # FLOP count is that of the visible pairs (counted here from the semantics), bad values
    # exit 2.
    L, S, left, right, E = 300, 340, 20, 5, 16
    r = run("bench", "--seq", str(L), "--kv-seq", str(S), "--dim", str(E), "--heads", "2",
            "--causal", "lower-right", "--window", f"{left},{right}", "--softcap", "5",
            "--alibi", "--sinks", "--dropout", "0.1", "--seed", "3", "--repeat", "1", "--json")
    if check(r.returncode == 0, f"bench with variants: exit 0, got {r.stderr}"):
        j = json.loads(r.stdout)
        i = np.arange(L)[:, None]
        jj = np.arange(S)[None, :]
        d = S - L
        visible = (jj >= i + d - left) & (jj <= i + d + right) & (jj <= i + d)
        check(j["variants"] == {"window": [left, right], "softcap": 5.0, "alibi": True,
                                "sinks": True, "dropout_p": 0.1, "seed": 3},
              f"bench echoes the variants, got {j.get('variants')}")
        want = 2.0 * 2 * visible.sum() * (E + E)
        check(abs(j["flops"] - want) <= 1e-9 * want, f"bench window flops {j['flops']} != {want}")
    for extra, word in ((["--dropout", "1"], "--dropout:"), (["--window", "-3,0"], "--window:"),
                        (["--softcap", "-2"], "--softcap:"),
                        (["--kv-cache", "--kv-seq", "64", "--alibi"], "--kv-cache")):
        r = run("bench", "--seq", "64", "--repeat", "1", *extra)
        check(r.returncode == 2 and word in r.stderr and r.stderr.startswith("sdpa: error:"),
              f"bench {extra}: exit 2 naming {word}, got {r.returncode}: {r.stderr.strip()}")

finish("test_variants_torch")
