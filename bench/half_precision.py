#!/usr/bin/python3
"""The half-precision table in one run: bfloat16 and float16 inputs against float32, forward and
backward, and decode over 16-bit KV caches against a float32 cache, on the same machine.

Each round runs float32, bfloat16 and float16 back to back on the same shape (`sdpa bench --dtype
D`), so that the three see the same load on a shared machine; a dtype's figure is the median over
the rounds of its per-round median, and its ratio to float32 the median of the per-round ratios.
The FMA peak (`sdpa bench --peak`) is measured before every round. Decode runs `sdpa bench
--kv-cache --kv-dtype D --kv-compare float32`: the 16-bit and the float32 caches alternate call by
call inside one process, and the ratio is the median over those calls of float32's time over the
16-bit cache's. The queries are float32 (the float32 cache's rounds too), and once more bfloat16
over the bfloat16 cache (`--dtype bfloat16`: a bfloat16 model's decode).

The goals (docs/precision.md): bfloat16 forward >= 1.6x float32 where the CPU has AVX512_BF16
(`vdpbf16ps`), >= 1.0x elsewhere; bfloat16 backward and float16 forward >= 1.0x; decode over a
16-bit cache >= 1.8x the float32 decode. --target NAME (e.g. avx2) runs sdpa and the peak on that
compiled SIMD target, a proxy for a machine with that instruction set (the caches and the FMA
units stay this machine's); below AVX3_DL bfloat16 products take the converting path.

Usage: bench/half_precision.py [--sdpa build/sdpa] [--threads 2] [--rounds 3] [--repeat 3]
                               [--shape 1,8,4096,128] [--kv-shape 32,8,32768,128] [--target avx2]
                               [--json]
"""
import argparse
import json
import statistics
import sys

from benchlib import (add_common_options, check_common_options, cpu, print_run_line, run_fields,
                      run_json)

DTYPES = ("float32", "bfloat16", "float16")


def parse_ints(text, option, n):
    try:
        dims = [int(x) for x in text.split(",")]
    except ValueError:
        dims = []
    if len(dims) != n or min(dims) < 1:
        sys.exit(f"{option}: expected {n} positive integers separated by commas, got '{text}'")
    return dims


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(p, "rounds of float32, bfloat16, float16")
    p.add_argument("--kv-repeat", type=int, default=30, help="timed decode calls per cache")
    p.add_argument("--shape", default="1,8,4096,128", help="B,H,N,E of forward and backward")
    p.add_argument("--kv-shape", default="32,8,32768,128", help="Hq,Hkv,S,E of the decode")
    args = p.parse_args()
    check_common_options(args)
    if args.kv_repeat < 1:
        sys.exit(f"--kv-repeat: expected a positive integer, got {args.kv_repeat}")
    b, h, n, e = parse_ints(args.shape, "--shape", 4)
    hq, hkv, s, ekv = parse_ints(args.kv_shape, "--kv-shape", 4)
    model, flags = cpu()
    target = ["--target", args.target] if args.target else []
    # vdpbf16ps runs where the CPU has AVX512_BF16 and sdpa runs its best target (AVX3_DL).
    native_bf16 = "avx512_bf16" in flags and args.target.upper() in ("", "AVX3_DL")
    common = ["--json", "--threads", str(args.threads), *target]
    peaks = []
    runs = {(pass_, d): [] for pass_ in ("forward", "backward") for d in DTYPES}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}: peak, forward and backward", file=sys.stderr)
        peaks.append(run_json([args.sdpa, "bench", "--peak", *common])["peak_gflops"])
        for pass_ in ("forward", "backward"):
            for d in DTYPES:
                cmd = [args.sdpa, "bench", *common, "--batch", str(b), "--heads", str(h), "--seq",
                       str(n), "--dim", str(e), "--repeat", str(args.repeat), "--dtype", d]
                if pass_ == "backward":
                    cmd.append("--backward")
                runs[(pass_, d)].append(run_json(cmd)["gflops_median"])
    peak = statistics.median(peaks)
    rows = []
    goals = {("forward", "bfloat16"): 1.6 if native_bf16 else 1.0, ("backward", "bfloat16"): 1.0,
             ("forward", "float16"): 1.0, ("backward", "float16"): None}
    for pass_ in ("forward", "backward"):
        base = runs[(pass_, "float32")]
        for d in ("bfloat16", "float16"):
            mine = runs[(pass_, d)]
            ratio = statistics.median(x / y for x, y in zip(mine, base))
            goal = goals[(pass_, d)]
            rows.append({"case": f"{d} {pass_}", "gflops": statistics.median(mine),
                         "float32_gflops": statistics.median(base), "ratio": ratio,
                         "percent_of_peak": 100 * statistics.median(mine) / peak, "goal": goal,
                         "met": None if goal is None else ratio >= goal, "runs": mine,
                         "float32_runs": base})
    # (cache, query): a float32 query over each 16-bit cache, and the all-bfloat16 decode of a
    # bfloat16 model (which takes bfloat16 pairs where the CPU has them).
    for d, qd in (("bfloat16", "float32"), ("bfloat16", "bfloat16"), ("float16", "float32")):
        print(f"decode: {d} cache, {qd} query, against a float32 cache", file=sys.stderr)
        j = run_json([args.sdpa, "bench", "--kv-cache", *common, "--heads", str(hq),
                      "--kv-heads", str(hkv), "--kv-seq", str(s), "--dim", str(ekv), "--repeat",
                      str(args.kv_repeat), "--kv-dtype", d, "--dtype", qd, "--kv-compare",
                      "float32"])
        f32 = j["compare"][0]
        case = f"{d} decode" if qd == "float32" else f"{d} decode, {qd} query"
        rows.append({"case": case, "kv_gbps": j["kv_gbps_median"],
                     "float32_kv_gbps": f32["kv_gbps_median"],
                     "ratio": f32["seconds_ratio_paired_median"],
                     "percent_of_read_bandwidth": j["percent_of_read_bandwidth"], "goal": 1.8,
                     "met": f32["seconds_ratio_paired_median"] >= 1.8})
    result = run_fields(args, model, peaks)
    result.update({"avx512_bf16": "avx512_bf16" in flags, "native_bf16_products": native_bf16,
                   "shape": [b, h, n, e], "kv_shape": [hq, hkv, s, ekv], "rows": rows})
    if args.json:
        print(json.dumps(result))
        return
    print_run_line(result, f"AVX512_BF16: {'yes' if result['avx512_bf16'] else 'no'}")
    print(f"forward and backward at (B,H,N,E) = ({b},{h},{n},{e}); decode at Hq {hq}, Hkv {hkv}, "
          f"S {s}, E {ekv}")
    print("| case | rate | float32 | ratio | goal |")
    print("|---|---|---|---|---|")
    for row in rows:
        if "gflops" in row:
            rate = f"{row['gflops']:.0f} GFLOP/s ({row['percent_of_peak']:.0f}% of peak)"
            base = f"{row['float32_gflops']:.0f} GFLOP/s"
        else:
            rate = (f"{row['kv_gbps']:.1f} GB/s ({row['percent_of_read_bandwidth']:.0f}% of "
                    f"the read)")
            base = f"{row['float32_kv_gbps']:.1f} GB/s"
        goal = "-" if row["goal"] is None else (
            f">= {row['goal']:.1f}x: {'met' if row['met'] else 'not met'}")
        print(f"| {row['case']} | {rate} | {base} | {row['ratio']:.2f}x | {goal} |")


if __name__ == "__main__":
    main()
