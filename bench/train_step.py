#!/usr/bin/env python3
"""Times one training step (forward, backward, AdamW update) of a small GPT (2 layers, 4 heads,
width 128, batch 1) at sequence lengths 1024 and 4096, with attention by torch and by
sdpa.torch, and reports each run's peak memory (the process's maximum resident set, each
configuration in a fresh process so that the figures do not mix).

    PYTHONPATH=build/python /usr/bin/python3 bench/train_step.py [--seq 1024 4096] [--steps 5]
        [--rounds 1] [--threads 2] [--seed 1] [--json]

--rounds R runs the pair of processes (torch, then sdpa) R times in alternation and quotes the
median over rounds, so that a load that changes during the run (a shared machine) weighs on
both alike; each row also gives the process CPU time per step (user + system of all its
threads), steadier than wall time when other processes compete for the cores.

torch's attention: F.scaled_dot_product_attention where it exists (PyTorch >= 2.0), else torch
1.13's private F._scaled_dot_product_attention, else the composite softmax(q k^T) v; all three
form the L x S matrix. Progress goes to stderr; the table (or JSON) to stdout.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def torch_attention_fn():
    import math

    import torch
    import torch.nn.functional as F
    if hasattr(F, "scaled_dot_product_attention"):
        return "F.scaled_dot_product_attention", lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True)
    if hasattr(F, "_scaled_dot_product_attention"):
        return "F._scaled_dot_product_attention", lambda q, k, v: F._scaled_dot_product_attention(
            q, k, v, None, 0.0, False, True)[0]

    def composite(q, k, v):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        L = q.shape[-2]
        s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), -math.inf)
        return torch.softmax(s, -1) @ v
    return "composite", composite


def child(impl, seq, steps, threads, seed):
    import torch
    sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))
    import test_train_gpt as gpt
    import sdpa.torch as st
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    gpt.SEQ = seq
    model = gpt.GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if impl == "sdpa":
        name, attention = "sdpa.torch", lambda q, k, v: st.scaled_dot_product_attention(
            q, k, v, is_causal=True)
    else:
        name, attention = torch_attention_fn()
    batch = torch.randint(0, gpt.VOCAB, (1, seq + 1))
    times, cpu = [], []
    for i in range(steps + 1):  # the first step warms up
        t0, c0 = time.perf_counter(), time.process_time()
        logits = model(batch[:, :-1], attention)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, gpt.VOCAB),
                                                 batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i > 0:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"impl": impl, "attention": name, "seq": seq, "step_ms":
                      1e3 * statistics.median(times), "step_cpu_ms": 1e3 * statistics.median(cpu),
                      "peak_rss_mb": peak_mb}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--steps", type=int, default=5, help="timed steps per run (median quoted)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternating (torch, sdpa) process pairs per sequence (median quoted)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], int(a.child[1]), a.steps, a.threads, a.seed)
        return
    if a.rounds < 1 or a.steps < 1:
        ap.error("--rounds and --steps: expected at least 1")
    rows = []
    for seq in a.seq:
        runs = {"torch": [], "sdpa": []}
        for r in range(a.rounds):
            for impl in ("torch", "sdpa"):
                print(f"train_step: {impl} at sequence {seq} (round {r + 1} of {a.rounds}) ...",
                      file=sys.stderr, flush=True)
                out = subprocess.run([sys.executable, __file__, "--child", impl, str(seq),
                                      "--steps", str(a.steps), "--threads", str(a.threads),
                                      "--seed", str(a.seed)], check=True, capture_output=True,
                                     text=True)
                runs[impl].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for impl in ("torch", "sdpa"):
            row = dict(runs[impl][0])
            for key in ("step_ms", "step_cpu_ms"):
                row[key] = statistics.median(x[key] for x in runs[impl])
            row["step_ms_rounds"] = [x["step_ms"] for x in runs[impl]]
            row["peak_rss_mb"] = max(x["peak_rss_mb"] for x in runs[impl])
            rows.append(row)
    for seq in a.seq:
        t, s = (next(r for r in rows if r["seq"] == seq and r["impl"] == i)
                for i in ("torch", "sdpa"))
        s["speedup_vs_torch"] = t["step_ms"] / s["step_ms"]
    if a.json:
        print(json.dumps({"threads": a.threads, "steps": a.steps, "rounds": a.rounds,
                          "seed": a.seed, "rows": rows}, indent=1))
        return
    print(f"{'seq':>6} {'attention':<32} {'step ms':>9} {'CPU ms':>9} {'peak RSS MB':>12} "
          f"{'speedup':>8}")
    for r in rows:
        sp = f"{r['speedup_vs_torch']:.2f}x" if "speedup_vs_torch" in r else ""
        print(f"{r['seq']:>6} {r['attention']:<32} {r['step_ms']:>9.1f} {r['step_cpu_ms']:>9.1f} "
              f"{r['peak_rss_mb']:>12.0f} {sp:>8}")


if __name__ == "__main__":
    main()
