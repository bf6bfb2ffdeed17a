#!/usr/bin/python3
"""The training-speed table in one run: sdpa's fused kernel against tuned PyTorch 1.13, forward,
backward and causal, at E = 64 and 128, with the FP32 FMA peak measured in the same run.

Each case runs in rounds that alternate sdpa and PyTorch, so that both see the same machine
(these are shared virtual machines: a neighbour's load moves both sides alike); each side's figure
is the median over the rounds of its per-round medians. The peak (`sdpa bench --peak`) is
measured before every round and its median is the denominator of "% of peak".

Tuned PyTorch is the three-pass composition a user writes (PyTorch 1.13 has no fused CPU
attention) with tcmalloc and the CPU's widest ATen kernels, each in its own process because the
environment must be set before the libraries load (see bench/torch_compare.py, whose worker this
script reuses): on AVX-512 machines OPENBLAS_CORETYPE=SkylakeX ATEN_CPU_CAPABILITY=avx512, on
AVX2 machines Haswell and avx2 (SkylakeX dies on an illegal instruction there).

--target NAME (e.g. avx2) runs sdpa and the peak loop on that compiled SIMD target (`sdpa bench
--target`) and PyTorch with the matching environment (avx2: Haswell and avx2), so that an AVX-512
machine can time the code an AVX2 machine would run, against the peak of the same instructions:
a proxy, labelled as such, since the caches and the FMA units stay this machine's.

Usage: bench/compare.py [--sdpa build/sdpa] [--threads 2] [--rounds 3] [--repeat 3]
                        [--cases fwd:1,8,4096,64 bwd:1,8,4096,64 ...] [--target avx2] [--json]
A case is PASS:B,H,N,E with PASS one of fwd, bwd, cfwd, cbwd (c = causal, upper-left).
"""
import argparse
import json
import os
import statistics
import sys

from benchlib import (add_common_options, check_common_options, cpu, print_run_line, run_fields,
                      run_json)

HERE = os.path.dirname(os.path.abspath(__file__))
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
DEFAULT_CASES = ["fwd:1,8,4096,64", "fwd:1,8,4096,128", "bwd:1,8,4096,64", "bwd:1,8,4096,128",
                 "cfwd:1,8,4096,64", "cbwd:1,8,4096,64"]


def parse_case(text):
    kind, _, shape = text.partition(":")
    if kind not in ("fwd", "bwd", "cfwd", "cbwd"):
        sys.exit(f"--cases: expected PASS:B,H,N,E with PASS fwd, bwd, cfwd or cbwd, got '{text}'")
    try:
        dims = [int(x) for x in shape.split(",")]
    except ValueError:
        dims = []
    if len(dims) != 4 or min(dims) < 1:
        sys.exit(f"--cases: expected four positive integers B,H,N,E, got '{text}'")
    return {"name": text, "backward": kind.endswith("bwd"), "causal": kind.startswith("c"),
            "shape": dims}


def sdpa_once(args, case):
    b, h, n, e = case["shape"]
    cmd = [args.sdpa, "bench", "--json", "--batch", str(b), "--heads", str(h), "--seq", str(n),
           "--dim", str(e), "--threads", str(args.threads), "--repeat", str(args.repeat)]
    if case["backward"]:
        cmd.append("--backward")
    if case["causal"]:
        cmd += ["--causal", "upper-left"]
    if args.target:
        cmd += ["--target", args.target]
    j = run_json(cmd)
    return j["gflops_median"], j["percent_of_peak_cpu_time"]


def torch_once(args, case, avx512):
    env = dict(os.environ, LD_PRELOAD=TCMALLOC,
               OPENBLAS_CORETYPE="SkylakeX" if avx512 else "Haswell",
               ATEN_CPU_CAPABILITY="avx512" if avx512 else "avx2")
    cmd = [sys.executable, os.path.join(HERE, "torch_compare.py"), "--worker", "--threads",
           str(args.threads), "--repeat", str(args.repeat), "--shape", *map(str, case["shape"])]
    if case["backward"]:
        cmd.append("--backward")
    if case["causal"]:
        cmd.append("--causal")
    return run_json(cmd, env)["gflops_median"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(p, "alternating rounds per case")
    p.add_argument("--cases", nargs="*", default=DEFAULT_CASES)
    p.add_argument("--no-torch", action="store_true", help="sdpa and the peak only")
    args = p.parse_args()
    check_common_options(args)
    cases = [parse_case(c) for c in args.cases]
    model, flags = cpu()
    avx512 = "avx512f" in flags
    # PyTorch's environment follows the target sdpa runs on: an AVX3 target is AVX-512.
    torch_avx512 = avx512 and (not args.target or args.target.upper().startswith("AVX3"))
    peak_cmd = [args.sdpa, "bench", "--peak", "--json", "--threads", str(args.threads)]
    if args.target:
        peak_cmd += ["--target", args.target]
    peaks, rows = [], []
    for case in cases:
        s_runs, t_runs, cpu_runs = [], [], []
        for r in range(args.rounds):
            print(f"{case['name']}: round {r + 1}/{args.rounds}", file=sys.stderr)
            peaks.append(run_json(peak_cmd)["peak_gflops"])
            gflops, cpu_percent = sdpa_once(args, case)
            s_runs.append(gflops)
            cpu_runs.append(cpu_percent)
            if not args.no_torch:
                t_runs.append(torch_once(args, case, torch_avx512))
        rows.append({"case": case["name"], "sdpa_gflops": statistics.median(s_runs),
                     "torch_gflops": statistics.median(t_runs) if t_runs else None,
                     "sdpa_runs": s_runs, "torch_runs": t_runs,
                     "percent_of_peak_cpu_time": statistics.median(cpu_runs)})
    peak = statistics.median(peaks)
    for row in rows:
        row["percent_of_peak"] = 100 * row["sdpa_gflops"] / peak
        row["ratio"] = row["sdpa_gflops"] / row["torch_gflops"] if row["torch_gflops"] else None
    result = run_fields(args, model, peaks)
    result.update({"avx512": avx512, "torch_capability": "avx512" if torch_avx512 else "avx2",
                   "rows": rows})
    if args.json:
        print(json.dumps(result))
        return
    print_run_line(result, "AVX-512" if avx512 else "AVX2")
    print("| case (B,H,L=S,E) | sdpa GFLOP/s | % of peak | % per CPU-second | tuned PyTorch | ratio |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        t = f"{row['torch_gflops']:.0f}" if row["torch_gflops"] else "-"
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] else "-"
        print(f"| {row['case']} | {row['sdpa_gflops']:.0f} | {row['percent_of_peak']:.0f}% | "
              f"{row['percent_of_peak_cpu_time']:.0f}% | {t} | {ratio} |")


if __name__ == "__main__":
    main()
