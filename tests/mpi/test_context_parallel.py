"""Context-parallel attention under mpirun (2, 3 and 4 ranks on loopback).

Each case writes .npy inputs, runs `sdpa attention` once as a single process (fast kernel,
naive float32 baseline, float64 reference) and once as `mpirun -np P sdpa attention
--context-parallel ring|ulysses`, and asserts:
  - out, lse and the three gradients agree with the float64 reference within the accuracy
    contract of the fused kernel, err(context-parallel) <= 2 * max(err(fast), err(naive)) +
    floor, on causal (both alignments), masks, GQA and lengths the ranks do not divide evenly;
  - the same inputs on the same rank count give byte-identical files run to run;
  - a rank that is killed, exits or stalls mid-run makes the job exit non-zero within a bounded
    time with no output file; bad input on any rank gives every rank the error, exit 2.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

SDPA = os.environ["SDPA"]
MPIRUN = os.environ.get("MPIRUN", "mpirun")
FAILURES = []


def mpirun(ranks):
    cmd = [MPIRUN, "--oversubscribe", "-np", str(ranks), "--mca", "btl", "self,vader",
           "--mca", "btl_vader_single_copy_mechanism", "none"]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    return cmd


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


def run(cmd, timeout=120, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)


class Case:
    def __init__(self, name, shape_q, shape_k, ev=None, causal="none", gqa=False, mask=None,
                 seed=0, dtype=np.float32, scale=None):
        self.name, self.causal, self.gqa, self.scale = name, causal, gqa, scale
        rng = np.random.default_rng(seed)
        self.q = rng.standard_normal(shape_q).astype(dtype)
        self.k = rng.standard_normal(shape_k).astype(dtype)
        vshape = list(shape_k)
        if ev is not None:
            vshape[-1] = ev
        self.v = rng.standard_normal(vshape).astype(dtype)
        oshape = list(shape_q)
        oshape[-1] = vshape[-1]
        self.dout = rng.standard_normal(oshape).astype(dtype)
        self.mask = mask(rng) if mask else None


def write_inputs(case, d):
    os.makedirs(d, exist_ok=True)
    paths = {}
    for name in ("q", "k", "v", "dout"):
        paths[name] = os.path.join(d, name + ".npy")
        np.save(paths[name], getattr(case, name))
    if case.mask is not None:
        paths["mask"] = os.path.join(d, "mask.npy")
        np.save(paths["mask"], case.mask)
    # float64 copies for the reference
    for name in ("q", "k", "v", "dout"):
        paths[name + "64"] = os.path.join(d, name + "64.npy")
        np.save(paths[name + "64"], getattr(case, name).astype(np.float64))
    return paths


OUTPUTS = ("out", "lse", "dq", "dk", "dv")


def attention_args(case, p, outdir, f64=False):
    s = "64" if f64 else ""
    args = ["attention", "--query", p["q" + s], "--key", p["k" + s], "--value", p["v" + s],
            "--grad-output", p["dout" + s], "--causal", case.causal, "--threads", "1"]
    if case.gqa:
        args.append("--enable-gqa")
    if case.scale is not None:
        args += ["--scale", str(case.scale)]
    if "mask" in p:
        args += ["--mask", p["mask"]]
    os.makedirs(outdir, exist_ok=True)
    for flag, name in (("--out", "out"), ("--lse", "lse"), ("--grad-query", "dq"),
                       ("--grad-key", "dk"), ("--grad-value", "dv")):
        args += [flag, os.path.join(outdir, name + ".npy")]
    return args


def load(outdir):
    return {n: np.load(os.path.join(outdir, n + ".npy")).astype(np.float64) for n in OUTPUTS}


def err(a, ref):
    finite = np.isfinite(ref)
    if not np.array_equal(finite, np.isfinite(a)) or not np.array_equal(a[~finite], ref[~finite]):
        return np.inf
    return float(np.max(np.abs(a[finite] - ref[finite]), initial=0.0))


def compare_case(case, strategy, ranks, d):
    p = write_inputs(case, d)
    base = {}
    for impl, f64 in (("fast", False), ("naive", False), ("reference", True)):
        r = run([SDPA] + attention_args(case, p, os.path.join(d, impl), f64) + ["--impl", impl])
        if r.returncode != 0:
            check(False, f"{case.name}: single-process {impl} failed: {r.stderr}")
            return None
        base[impl] = load(os.path.join(d, impl))
    cp_dir = os.path.join(d, "cp")
    t0 = time.time()
    r = run(mpirun(ranks) + [SDPA] + attention_args(case, p, cp_dir) +
            ["--context-parallel", strategy, "--cp-timeout", "30"])
    seconds = time.time() - t0
    if r.returncode != 0:
        check(False, f"{case.name}: {strategy} -np {ranks} failed ({r.returncode}): {r.stderr}")
        return None
    cp = load(cp_dir)
    ref = base["reference"]
    for n in OUTPUTS:
        scale = max(1.0, float(np.max(np.abs(ref[n][np.isfinite(ref[n])]), initial=0.0)))
        floor = 1e-6 * scale
        e_fast, e_naive, e_cp = (err(base["fast"][n], ref[n]), err(base["naive"][n], ref[n]),
                                 err(cp[n], ref[n]))
        bound = 2 * max(e_fast, e_naive) + floor
        check(e_cp <= bound, f"{case.name} {strategy} -np {ranks} {n}: err {e_cp:.2e} <= "
              f"{bound:.2e} (fast {e_fast:.2e}, naive {e_naive:.2e})")
    print(f"     ({seconds:.2f} s under mpirun)")
    return cp_dir


def bool_mask(shape, keep=0.7):
    return lambda rng: rng.random(shape) < keep


def float_mask(shape):
    def make(rng):
        m = rng.standard_normal(shape).astype(np.float32)
        m[rng.random(shape) < 0.2] = -np.inf
        return m
    return make


CASES = [
    # (case, strategy, ranks)
    (Case("causal upper-left, GQA, L=S=61", (1, 4, 61, 16), (1, 2, 61, 16), causal="upper-left",
          gqa=True, seed=1), "ring", 2),
    (Case("causal lower-right, L=45 < S=70", (2, 3, 45, 8), (2, 3, 70, 8), ev=5,
          causal="lower-right", seed=2), "ring", 3),
    (Case("causal lower-right, L=70 > S=45 (rows with no key)", (1, 2, 70, 8), (1, 2, 45, 8),
          causal="lower-right", seed=3), "ring", 4),
    (Case("causal upper-left, L=53 > S=38", (1, 2, 53, 8), (1, 2, 38, 8), causal="upper-left",
          seed=4), "ring", 3),
    (Case("bool mask per head, L=50, S=53", (2, 3, 50, 12), (2, 3, 53, 12),
          mask=bool_mask((2, 3, 50, 53)), seed=5), "ring", 3),
    (Case("float mask, broadcast rows, causal, 2-D inputs", (67, 16), (67, 16),
          causal="upper-left", mask=float_mask((67,)), seed=6), "ring", 4),
    (Case("causal upper-left, GQA, L=S=61", (1, 4, 61, 16), (1, 2, 61, 16), causal="upper-left",
          gqa=True, seed=1), "ulysses", 2),
    (Case("bool mask per head, causal lower-right, L=50, S=57", (1, 4, 50, 8), (1, 4, 57, 8),
          causal="lower-right", mask=bool_mask((1, 4, 50, 57)), seed=7), "ulysses", 4),
    (Case("GQA 6/3 heads, uneven L=41", (1, 6, 41, 8), (1, 3, 41, 8), gqa=True, seed=8),
     "ulysses", 3),
    # Scores of a few tens (lse ~ 20-30) over shards of at most 8 query rows: each block's
    # forward must score as the ring backward does (not on the decode kernel) and the blocks'
    # lse merge in float64, else P = exp(s - lse) carries errors past the bound.
    (Case("scores of a few tens, 8-row shards", (1, 2, 24, 8), (1, 2, 24, 8), scale=2.5,
          seed=101), "ring", 3),
    (Case("scores of a few tens, 6-row shards", (1, 2, 24, 8), (1, 2, 24, 8), scale=-2.0,
          seed=100), "ring", 4),
    # Scores of a few hundred: |lse| > 64, rows the fused backward renormalises over the keys of
    # its call; all-to-all calls see every key, so they stay exact.
    (Case("huge scores (|lse| > 64)", (1, 2, 33, 16), (1, 2, 33, 16), causal="upper-left",
          scale=60.0, seed=11), "ulysses", 2),
]


def test_determinism(d):
    case = Case("determinism", (1, 4, 77, 16), (1, 4, 77, 16), causal="upper-left", seed=9)
    p = write_inputs(case, d)
    blobs = []
    for i in range(2):
        out = os.path.join(d, f"run{i}")
        r = run(mpirun(3) + [SDPA] + attention_args(case, p, out) + ["--context-parallel", "ring"])
        if r.returncode != 0:
            check(False, f"determinism run {i}: {r.stderr}")
            return
        blobs.append([open(os.path.join(out, n + ".npy"), "rb").read() for n in OUTPUTS])
    check(blobs[0] == blobs[1], "ring -np 3: byte-identical outputs and gradients run to run")
    # A dropout probability below 2^-17 drops nothing, as in one process: accepted, same bytes.
    out = os.path.join(d, "tiny_dropout")
    r = run(mpirun(3) + [SDPA] + attention_args(case, p, out) +
            ["--context-parallel", "ring", "--dropout-p", "1e-6"])
    same = r.returncode == 0 and blobs[0] == [
        open(os.path.join(out, n + ".npy"), "rb").read() for n in OUTPUTS]
    check(same, f"--dropout-p 1e-6 is no dropout: exit {r.returncode}, the same bytes "
                f"{r.stderr.strip().splitlines()[:1]}")
    r = run(mpirun(3) + [SDPA] + attention_args(case, p, os.path.join(d, "dropout")) +
            ["--context-parallel", "ring", "--dropout-p", "0.1"])
    check(r.returncode == 2 and "--context-parallel: expected without" in r.stderr,
          f"--dropout-p 0.1 is refused: exit {r.returncode} {r.stderr.strip().splitlines()[:1]}")


def test_faults(d):
    case = Case("faults", (1, 2, 40, 8), (1, 2, 40, 8), causal="upper-left", seed=10)
    p = write_inputs(case, d)
    # Rank 0 writes the outputs; SIGKILL runs no handler, so only temporaries that do not exist
    # while the ranks compute are sure to be gone when rank 0 itself is killed.
    for action, rank, limit in (("kill", 1, 30), ("exit", 1, 30), ("stall", 1, 30),
                                ("kill", 0, 30)):
        out = os.path.join(d, f"{action}{rank}")
        t0 = time.time()
        try:
            r = run(mpirun(3) + [SDPA] + attention_args(case, p, out) +
                    ["--context-parallel", "ring", "--cp-timeout", "3"],
                    timeout=limit + 30, env={"SDPA_MPI_FAULT": f"{action}:{rank}:1"})
            seconds = time.time() - t0
            rc = r.returncode
        except subprocess.TimeoutExpired:
            seconds, rc = time.time() - t0, None
        leftovers = [f for f in os.listdir(out)] if os.path.isdir(out) else []
        check(rc not in (None, 0) and seconds < limit and not leftovers,
              f"rank {rank} does '{action}' at step 1: exit {rc} after {seconds:.1f} s "
              f"(< {limit} s), files left: {leftovers}")
        if action == "stall" and rc not in (None, 0):
            check("did not complete within 3 s" in r.stderr,
                  "the waiting ranks say which exchange timed out: " +
                  r.stderr.strip().splitlines()[0] if r.stderr.strip() else "(no stderr)")
    # One rank's input cannot be read (a mask file that is not a .npy): every rank reports it.
    bad = os.path.join(d, "bad_mask.npy")
    with open(bad, "wb") as f:
        f.write(b"not a numpy file")
    args = attention_args(case, p, os.path.join(d, "bad")) + ["--mask", bad]
    r = run(mpirun(3) + [SDPA] + args + ["--context-parallel", "ring"], timeout=60)
    # mpirun ends the other ranks once one exits non-zero, so not every rank's line survives.
    check(r.returncode == 2 and r.stderr.count("sdpa: error:") >= 1 and "bad_mask.npy" in
          r.stderr and not os.listdir(os.path.join(d, "bad")),
          f"unreadable input: exit {r.returncode}, the error names the file: "
          f"{r.stderr.strip().splitlines()[:1]}")
    # Outputs are checked as one process checks them, before any work: an output naming an
    # input is refused and the input stays as it was; an output in a missing folder fails at
    # once, naming its flag, and no output is written.
    for strategy in ("ring", "ulysses"):
        q_before = open(p["q"], "rb").read()
        args = attention_args(case, p, os.path.join(d, "clash"))
        args[args.index("--out") + 1] = p["q"]
        r = run(mpirun(2) + [SDPA] + args + ["--context-parallel", strategy], timeout=60)
        check(r.returncode == 2 and "--out: expected an output path different from every input"
              in r.stderr and open(p["q"], "rb").read() == q_before and
              not os.listdir(os.path.join(d, "clash")),
              f"{strategy}: --out naming --query: exit {r.returncode}, the query is unchanged: "
              f"{r.stderr.strip().splitlines()[:1]}")
    args = attention_args(case, p, os.path.join(d, "missing"))
    args[args.index("--grad-key") + 1] = os.path.join(d, "no such folder", "dk.npy")
    r = run(mpirun(2) + [SDPA] + args + ["--context-parallel", "ring", "--cp-timeout", "5"],
            timeout=60, env={"SDPA_MPI_FAULT": "stall:1:1"})
    check(r.returncode == 2 and "--grad-key: expected a path in an existing directory" in
          r.stderr and not os.listdir(os.path.join(d, "missing")),
          f"--grad-key in a missing folder, refused before the ranks exchange anything: exit "
          f"{r.returncode}, {r.stderr.strip().splitlines()[:1]}")
    # The ring backward refuses rows the fused backward would renormalise per block.
    huge = Case("huge scores", (1, 2, 33, 16), (1, 2, 33, 16), scale=60.0, seed=11)
    hp = write_inputs(huge, os.path.join(d, "huge"))
    r = run(mpirun(2) + [SDPA] + attention_args(huge, hp, os.path.join(d, "huge_out")) +
            ["--context-parallel", "ring"], timeout=60)
    check(r.returncode == 2 and "expected |lse| <= 64" in r.stderr and
          not os.listdir(os.path.join(d, "huge_out")),
          f"ring backward with |lse| > 64: exit {r.returncode}, "
          f"{r.stderr.strip().splitlines()[:1]}")
    # Ulysses with fewer kv heads than ranks is refused on every rank with a clear message.
    r = run(mpirun(3) + [SDPA] + attention_args(case, p, os.path.join(d, "uly")) +
            ["--context-parallel", "ulysses"], timeout=60)
    check(r.returncode == 2 and "expected at least as many key/value heads as ranks" in r.stderr,
          f"ulysses with 2 kv heads on 3 ranks: exit {r.returncode}, "
          f"{r.stderr.strip().splitlines()[:1]}")


def test_bench(d):
    # sdpa bench over ranks whose shards differ in size (37 rows on 3 ranks: 13, 12, 12; one
    # row on 2 ranks: one rank holds none) completes and reports every rank.
    for strategy, ranks, seq, extra in (("ring", 3, 37, ["--backward"]), ("ulysses", 3, 37, []),
                                        ("ring", 2, 1, []), ("ring", 2, 37,
                                                             ["--causal", "lower-right"])):
        heads = "3" if strategy == "ulysses" else "2"
        r = run(mpirun(ranks) + [SDPA, "bench", "--context-parallel", strategy, "--seq", str(seq),
                                 "--heads", heads, "--dim", "8", "--repeat", "1", "--threads",
                                 "1", "--json", "--cp-timeout", "20"] + extra, timeout=60)
        ok = r.returncode == 0
        if ok:
            report = json.loads(r.stdout)
            ok = len(report["per_rank"]) == ranks and sum(x["query_rows"] for x in
                                                          report["per_rank"]) == seq
        check(ok, f"bench {strategy} on {ranks} ranks, {seq} rows {' '.join(extra)}: exit "
                  f"{r.returncode} {r.stderr.strip().splitlines()[:1]}")


def main():
    start = time.time()
    with tempfile.TemporaryDirectory() as d:
        for i, (case, strategy, ranks) in enumerate(CASES):
            compare_case(case, strategy, ranks, os.path.join(d, f"case{i}"))
        os.makedirs(os.path.join(d, "det"))
        test_determinism(os.path.join(d, "det"))
        os.makedirs(os.path.join(d, "faults"))
        test_faults(os.path.join(d, "faults"))
        test_bench(d)
    print(f"{time.time() - start:.1f} s in all")
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        sys.exit(1)


if __name__ == "__main__":
    main()
