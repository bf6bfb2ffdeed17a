#!/usr/bin/env python3
"""Smoke tests of the `sdpa` program's attention and softmax commands (exit codes, messages,
outputs). Runs with the binary in $SDPA; needs numpy only."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, finish  # noqa: E402

SDPA = os.environ.get("SDPA", "sdpa")


def run(*args):
    return subprocess.run([SDPA, *args], capture_output=True, text=True)



def softmax_ref(s):
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    return p / p.sum(-1, keepdims=True)


with tempfile.TemporaryDirectory() as d:
    p = lambda name: os.path.join(d, name)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    k = rng.standard_normal((2, 3, 7, 4)).astype(np.float32)
    v = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    for name, a in (("q", q), ("k", k), ("v", v)):
        np.save(p(name + ".npy"), a)

    r = run("attention", "--query", p("q.npy"), "--key", p("k.npy"), "--value", p("v.npy"),
            "--out", p("o.npy"), "--lse", p("lse.npy"), "--impl", "reference")
    check(r.returncode == 0, f"attention exit 0, got {r.returncode}: {r.stderr}")
    if r.returncode == 0:
        s = np.einsum("bhle,bhse->bhls", q.astype(np.float64), k.astype(np.float64)) / 2.0
        expect = softmax_ref(s) @ v.astype(np.float64)
        out = np.load(p("o.npy"))
        check(out.dtype == np.float32, "out has the query's dtype")
        check(np.abs(out - expect).max() < 1e-5, "attention matches numpy")
        lse = np.load(p("lse.npy"))
        check(lse.shape == (2, 3, 5), "lse shape")

    # backward writes all gradients
    dout = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    np.save(p("do.npy"), dout)
    r = run("attention", "--query", p("q.npy"), "--key", p("k.npy"), "--value", p("v.npy"),
            "--out", p("o2.npy"), "--grad-output", p("do.npy"), "--grad-query", p("dq.npy"),
            "--grad-key", p("dk.npy"), "--grad-value", p("dv.npy"))
    check(r.returncode == 0 and os.path.exists(p("dk.npy")), f"backward runs: {r.stderr}")

    # bad input: exit 2, message names the argument, nothing written
    np.save(p("k_bad.npy"), k[:, :2])
    bad = [
        (["--key", p("k_bad.npy")], "key"),
        (["--scale", "nan"], "scale"),
        (["--scale", "abc"], "scale"),
        (["--threads", "-3"], "threads"),
        (["--causal", "diagonal"], "causal"),
        (["--impl", "gpu"], "impl"),
        (["--out", p("q.npy")], "--out"),
        (["--out", p("nodir/o.npy")], "--out"),
        (["--grad-output", p("do.npy")], "--grad-output"),
    ]
    for extra, name in bad:
        base = {"--query": p("q.npy"), "--key": p("k.npy"), "--value": p("v.npy"),
                "--out": p("bad_out.npy")}
        for i in range(0, len(extra), 2):
            base[extra[i]] = extra[i + 1]
        argv = ["attention"] + [x for kv in base.items() for x in kv]
        r = run(*argv)
        check(r.returncode == 2, f"{extra}: exit 2, got {r.returncode}")
        check(name in r.stderr, f"{extra}: message names {name}: {r.stderr.strip()}")
        check(not os.path.exists(p("bad_out.npy")), f"{extra}: nothing written")
    check(np.array_equal(np.load(p("q.npy")), q), "an input is never overwritten")
    leftovers = [f for f in os.listdir(d) if f.startswith(".sdpa-") or ".tmp." in f]
    check(not leftovers, f"no temporary files left: {leftovers}")

    # option-parse errors read like every other error, with the allowed range
    r = run("attention", "--query", p("q.npy"), "--key", p("k.npy"), "--value", p("v.npy"),
            "--out", p("bad_out.npy"), "--threads", "1e9")
    check(r.returncode == 2 and "sdpa: error: --threads: expected 0 (one per core) or 1..1024, "
          "got 1e9" in r.stderr, f"--threads 1e9: prefix and range: {r.stderr.strip()}")
    r = run("attention", "--query", p("q.npy"), "--key", p("k.npy"), "--value", p("v.npy"),
            "--out", "")
    check(r.returncode == 2 and "sdpa: error: --out: expected a file path" in r.stderr,
          f"--out '' names --out: {r.stderr.strip()}")

# softmax
r = run("softmax", "--logits", "1000,10,5", "--json")
check(r.returncode == 0, "softmax runs")
if r.returncode == 0:
    check(json.loads(r.stdout)["probabilities"] == [1.0, 0.0, 0.0], "softmax([1000,10,5]) = [1,0,0]")
r = run("softmax", "--logits", "1000,10,5", "--dtype", "float32", "--json")
check(r.returncode == 0 and json.loads(r.stdout)["probabilities"] == [1.0, 0.0, 0.0], "float32 too")
# scale * logit overflowing float64: the limit puts all the mass on the largest scaled logit,
# never shares it among the overflowed ones.
for scale, expect in (("1e308", [0.0, 0.0, 1.0]), ("-1e308", [1.0, 0.0, 0.0]),
                      ("1e307", [0.0, 0.0, 1.0])):
    for dtype in ("float64", "float32"):
        r = run("softmax", "--logits", "1,2,3", "--scale", scale, "--dtype", dtype, "--json")
        got = json.loads(r.stdout) if r.returncode == 0 else {}
        check(got.get("probabilities") == expect,
              f"softmax --scale {scale} ({dtype}): {expect}, got {r.stdout.strip()} {r.stderr}")
        if got:
            lp = got.get("log_probabilities")
            check(lp is None or (lp[expect.index(1.0)] == 0.0),
                  f"softmax --scale {scale} ({dtype}): log p of the top is 0, got {lp}")
r = run("softmax", "--logits", "1,x,3")
check(r.returncode == 2 and "--logits" in r.stderr, "bad logits: exit 2 naming --logits")
# A finite logit past the dtype's range is refused, never rounded to an infinity (which would
# share the mass between 1e400 and 2e400); infinities are written as such.
for logits, dtype in (("1e400,2e400", "float64"), ("-1e400,-2e400", "float64"),
                      ("1e39,2e39", "float32"), ("-3.5e38,0", "float32")):
    r = run("softmax", "--logits", logits, "--dtype", dtype, "--json")
    check(r.returncode == 2 and f"--logits: expected numbers within {dtype}'s range" in r.stderr
          and not r.stdout, f"softmax --logits {logits} ({dtype}) refused, got {r.returncode} "
          f"{r.stdout.strip()} {r.stderr.strip()}")
for logits, dtype, expect in (("1e39,2e39", "float64", [0.0, 1.0]),
                              ("3.4e38,0", "float32", [1.0, 0.0]),
                              ("-Infinity,1", "float64", [0.0, 1.0])):
    r = run("softmax", "--logits", logits, "--dtype", dtype, "--json")
    got = json.loads(r.stdout) if r.returncode == 0 else {}
    check(got.get("probabilities") == expect,
          f"softmax --logits {logits} ({dtype}): {expect}, got {r.stdout.strip()} {r.stderr}")
r = run("softmax", "--logits", "+inf,1")
check(r.returncode == 0, f"softmax takes +inf as written, got {r.returncode} {r.stderr}")
for scale in ("1e400", "", "1,5"):
    r = run("softmax", "--logits", "1,2", "--scale", scale)
    check(r.returncode == 2 and f"--scale: expected a finite number, got '{scale}'" in r.stderr,
          f"softmax --scale '{scale}' refused naming what came, got {r.returncode} {r.stderr}")
for args in (["--help"], ["attention", "--help"], ["softmax", "--help"], ["--version"]):
    r = run(*args)
    check(r.returncode == 0 and r.stdout, f"{args} prints and exits 0")

# serve --host '': no address to listen on or to print.
if "serve" in run("--help").stdout:
    try:
        r = subprocess.run([SDPA, "serve", "--host", "", "--port", "0"], capture_output=True,
                           text=True, timeout=20)
        check(r.returncode == 2 and "sdpa: error: --host: expected an address" in r.stderr,
              f"serve --host '': exit 2 naming --host, got {r.returncode}: {r.stderr.strip()}")
    except subprocess.TimeoutExpired:
        check(False, "serve --host '' started serving")

# --cp-timeout: a short message naming what came (not DBL_MAX in 309 digits).
if "--cp-timeout" in run("attention", "--help").stdout:
    for bad in ("0", "-1", "x"):
        r = run("bench", "--cp-timeout", bad)
        check(r.returncode == 2 and
              f"--cp-timeout: expected a positive number of seconds, got '{bad}'" in r.stderr and
              len(r.stderr) < 200, f"--cp-timeout {bad}: {r.stderr.strip()}")

finish("CLI")
