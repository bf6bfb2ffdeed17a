#!/usr/bin/python3
"""What the attention variants cost in the fused kernel (docs/variants.md), through the Python
module: a sliding window against full attention, softcap / ALiBi / sinks / dropout against plain
attention, and a variable-length batch against one sequence of the same work.

Each comparison alternates its two sides for --rounds rounds (these are shared virtual machines:
a neighbour's load moves both alike) and reports the median of each side's wall-clock times and
their ratio, and the ratio of the medians of process CPU time (steadier under load, blind to
serial parts and idle threads).

Usage: PYTHONPATH=build/python bench/variants.py [--threads 2] [--rounds 3] [--quick] [--json]
--quick shrinks the shapes (the window case to N = 4096, window 256) for a smoke run.
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

import sdpa


CPU = {}  # the last alternate()'s medians of process CPU time: (baseline, variant)


def timed(f):
    t, c = time.perf_counter(), time.process_time()
    f()
    return time.perf_counter() - t, time.process_time() - c


def alternate(a, b, rounds):
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(timed(a))
        tb.append(timed(b))
    CPU["last"] = (statistics.median(x[1] for x in ta), statistics.median(x[1] for x in tb))
    return statistics.median(x[0] for x in ta), statistics.median(x[0] for x in tb)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    th = args.threads
    rows = []

    def report(name, base, t_base, t_var, goal):
        ratio = t_var / t_base
        c_base, c_var = CPU["last"]
        cpu_ratio = c_var / c_base if c_base > 0 else float("nan")
        rows.append({"case": name, "baseline": base, "baseline_s": t_base, "variant_s": t_var,
                     "ratio": ratio, "baseline_cpu_s": c_base, "variant_cpu_s": c_var,
                     "cpu_ratio": cpu_ratio, "goal": goal})
        if not args.json:
            print(f"{name:44s} {t_base * 1e3:9.1f} ms {t_var * 1e3:9.1f} ms  ratio {ratio:6.3f}"
                  f"  CPU-time ratio {cpu_ratio:6.3f}  (goal {goal})", flush=True)

    # 1. Sliding window vs full attention, forward and backward.
    N, W = (4096, 256) if args.quick else (16384, 1024)
    q, k, v, g = (rng.standard_normal((1, 8, N, 64)).astype(np.float32) for _ in range(4))
    full = lambda **kw: sdpa.attention_forward(q, k, v, threads=th, **kw)
    ow, lw = full(window_size=(W // 2, W // 2 - 1))
    of, lf = full()
    tf, tw = alternate(lambda: full(), lambda: full(window_size=(W // 2, W // 2 - 1)),
                       args.rounds)
    report(f"fwd window {W} (1,8,{N},64)", "full", tf, tw, f"{W / N:.4f} +-25%")
    bf = lambda: sdpa.attention_backward(q, k, v, of, lf, g, threads=th)
    bw = lambda: sdpa.attention_backward(q, k, v, ow, lw, g, threads=th,
                                         window_size=(W // 2, W // 2 - 1))
    tf, tw = alternate(bf, bw, max(1, args.rounds - 1))
    report(f"bwd window {W} (1,8,{N},64)", "full", tf, tw, f"{W / N:.4f} +-25%")

    # 2. softcap, ALiBi, sinks, dropout vs plain, at (1,8,4096,64) forward and backward.
    M = 2048 if args.quick else 4096
    q, k, v, g = (rng.standard_normal((1, 8, M, 64)).astype(np.float32) for _ in range(4))
    variants = {
        "softcap": {"softcap": 30.0},
        "alibi": {"alibi_slopes": 2.0 ** -np.arange(1, 9)},
        "sinks": {"sinks": rng.standard_normal(8)},
        "dropout": {"dropout_p": 0.1, "seed": 1},
    }
    op, lp = sdpa.attention_forward(q, k, v, threads=th)
    for name, kw in variants.items():
        tp, tv = alternate(lambda: sdpa.attention_forward(q, k, v, threads=th),
                           lambda: sdpa.attention_forward(q, k, v, threads=th, **kw), args.rounds)
        report(f"fwd {name} (1,8,{M},64)", "plain", tp, tv, "<= 1.20" if name == "dropout"
               else "<= 1.15")
        ov, lv = sdpa.attention_forward(q, k, v, threads=th, **kw)
        tp, tv = alternate(lambda: sdpa.attention_backward(q, k, v, op, lp, g, threads=th),
                           lambda: sdpa.attention_backward(q, k, v, ov, lv, g, threads=th, **kw),
                           args.rounds)
        report(f"bwd {name} (1,8,{M},64)", "plain", tp, tv, "-" if name == "dropout"
               else "<= 1.15")

    # 3. varlen: 8 sequences of 100 .. 4000 tokens vs one sequence of the same total work
    # (the sum of L_b^2 is what attention costs), forward, GFLOP/s.
    lengths = [100, 400, 700, 1200, 1700, 2300, 3100, 4000]
    if args.quick:
        lengths = [x // 4 for x in lengths]
    H = 8
    total = sum(lengths)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    qp, kp, vp = (rng.standard_normal((total, H, 64)).astype(np.float32) for _ in range(3))
    work = sum(x * x for x in lengths)
    n1 = int(round(np.sqrt(work)))
    q1, k1, v1 = (rng.standard_normal((n1, H, 64)).astype(np.float32) for _ in range(3))
    cu1 = np.array([0, n1])
    t1, tv = alternate(
        lambda: sdpa.attention_varlen(q1, k1, v1, cu1, cu1, n1, n1, threads=th),
        lambda: sdpa.attention_varlen(qp, kp, vp, cu, cu, max(lengths), max(lengths), threads=th),
        args.rounds)
    flops = 4.0 * H * work * 64
    report(f"varlen 8 seqs {lengths[0]}..{lengths[-1]} vs one of {n1}", "one sequence", t1, tv,
           "GFLOP/s ratio >= 0.9, i.e. time ratio <= 1.11")
    rows[-1]["gflops_one"] = flops / t1 / 1e9
    rows[-1]["gflops_varlen"] = flops / tv / 1e9
    if args.json:
        print(json.dumps({"threads": th, "rounds": args.rounds, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
