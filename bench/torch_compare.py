#!/usr/bin/python3
"""Times PyTorch (Debian's python3-torch 1.13) on the shapes of `sdpa bench`, in the same run,
and prints the ratios.

PyTorch 1.13 has no fused CPU attention (scaled_dot_product_attention arrived in 2.0), so the
PyTorch side is the three-pass composition a user writes: softmax(q @ k^T * scale [+ causal
mask]) @ v, and autograd for the backward. It is timed in two configurations, each in its own
process because the environment must be set before the libraries load:
  as-installed: the environment of this machine (OPENBLAS_CORETYPE=Haswell etc.), glibc malloc;
  tuned:        LD_PRELOAD=libtcmalloc_minimal.so.4 (Debian's libgoogle-perftools4),
                OPENBLAS_CORETYPE=SkylakeX, ATEN_CPU_CAPABILITY=avx512.
Both use the same thread count as sdpa (default 2). The OPENBLAS_* overrides happen only in
the child processes of this script, never in tests or CI.

Usage: bench/torch_compare.py [--sdpa build/sdpa] [--threads 2] [--repeat 5]
                              [--shapes 1,8,4096,64 1,8,4096,128] [--no-backward] [--json]
"""
import argparse
import json
import os
import subprocess
import sys
import time

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def worker(args):
    import torch

    torch.set_num_threads(args.threads)
    b, h, n, e = args.shape
    g = torch.Generator().manual_seed(1)
    q = torch.randn(b, h, n, e, generator=g)
    k = torch.randn(b, h, n, e, generator=g)
    v = torch.randn(b, h, n, e, generator=g)
    dout = torch.randn(b, h, n, e, generator=g)
    scale = e ** -0.5
    mask = None
    if args.causal:
        mask = torch.ones(n, n, dtype=torch.bool).triu(1)

    def attention(q, k, v):
        s = torch.matmul(q, k.transpose(-2, -1)) * scale
        if mask is not None:
            s = s.masked_fill(mask, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1), v)

    times = []
    for i in range(args.repeat + 1):  # the first run is a warm-up
        if args.backward:
            qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
            out = attention(qq, kk, vv)
            t0 = time.perf_counter()
            out.backward(dout)
            t1 = time.perf_counter()
        else:
            with torch.no_grad():
                t0 = time.perf_counter()
                attention(q, k, v)
                t1 = time.perf_counter()
        if i > 0:
            times.append(t1 - t0)
    times.sort()
    flops = 4.0 * b * h * n * n * e * (0.5 if args.causal else 1.0) * (2.5 if args.backward else 1.0)
    median = times[len(times) // 2]
    print(json.dumps({"seconds_median": median, "gflops_median": flops / median * 1e-9,
                      "torch": torch.__version__}))


def run_torch(mode, shape, args, backward):
    env = dict(os.environ)
    if mode == "tuned":
        env["LD_PRELOAD"] = TCMALLOC
        env["OPENBLAS_CORETYPE"] = "SkylakeX"
        env["ATEN_CPU_CAPABILITY"] = "avx512"
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--threads", str(args.threads),
           "--repeat", str(args.repeat), "--shape", *map(str, shape)]
    if backward:
        cmd.append("--backward")
    if args.causal:
        cmd.append("--causal")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "failed"}
    return json.loads(r.stdout)


def run_sdpa(impl, shape, args, backward):
    b, h, n, e = shape
    cmd = [args.sdpa, "bench", "--json", "--impl", impl, "--batch", str(b), "--heads", str(h),
           "--seq", str(n), "--dim", str(e), "--threads", str(args.threads),
           "--repeat", str(args.repeat)]
    if backward:
        cmd.append("--backward")
    if args.causal:
        cmd += ["--causal", "upper-left"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr.strip()}
    return json.loads(r.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sdpa", default=os.path.join(os.path.dirname(__file__), "..", "build", "sdpa"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--shapes", nargs="*", default=["1,8,4096,64", "1,8,4096,128"],
                   help="B,H,N,E with L = S = N")
    p.add_argument("--causal", action="store_true", help="upper-left causal on both sides")
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shape", type=int, nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--backward", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if not os.path.exists(args.sdpa):
        sys.exit(f"--sdpa: expected the sdpa program, {args.sdpa} does not exist")
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("PyTorch is not installed (apt-get install python3-torch); nothing to compare")
    rows = []
    passes = [False] if args.no_backward else [False, True]
    for text in args.shapes:
        shape = [int(x) for x in text.split(",")]
        if len(shape) != 4:
            sys.exit(f"--shapes: expected B,H,N,E, got '{text}'")
        for backward in passes:
            row = {"shape": shape, "pass": "backward" if backward else "forward",
                   "causal": args.causal}
            for name, fn in (("sdpa_fast", lambda: run_sdpa("fast", shape, args, backward)),
                             ("sdpa_naive", lambda: run_sdpa("naive", shape, args, backward)),
                             ("torch_installed", lambda: run_torch("installed", shape, args, backward)),
                             ("torch_tuned", lambda: run_torch("tuned", shape, args, backward))):
                if sys.stderr.isatty():
                    print(f"  {text} {row['pass']}: {name} ...", file=sys.stderr)
                row[name] = fn()
            fast = row["sdpa_fast"].get("gflops_median")
            for other in ("sdpa_naive", "torch_installed", "torch_tuned"):
                g = row[other].get("gflops_median")
                row[f"fast_over_{other}"] = fast / g if fast and g else None
            rows.append(row)
    if args.json:
        print(json.dumps({"threads": args.threads, "rows": rows}))
        return
    print(f"GFLOP/s (median of {args.repeat}), {args.threads} threads; ratio = sdpa fast / other")
    print(f"{'shape':>16} {'pass':>8} {'fast':>8} {'%peak':>6} {'naive':>8} {'torch':>8} "
          f"{'tuned':>8} {'x naive':>8} {'x torch':>8} {'x tuned':>8}")

    def fmt(x, spec=".1f"):
        return format(x, spec) if isinstance(x, (int, float)) else "-"

    for r in rows:
        f = r["sdpa_fast"]
        print(f"{','.join(map(str, r['shape'])):>16} {r['pass']:>8} {fmt(f.get('gflops_median')):>8} "
              f"{fmt(f.get('percent_of_peak')):>6} {fmt(r['sdpa_naive'].get('gflops_median')):>8} "
              f"{fmt(r['torch_installed'].get('gflops_median')):>8} "
              f"{fmt(r['torch_tuned'].get('gflops_median')):>8} "
              f"{fmt(r['fast_over_sdpa_naive'], '.2f'):>8} {fmt(r['fast_over_torch_installed'], '.2f'):>8} "
              f"{fmt(r['fast_over_torch_tuned'], '.2f'):>8}")
        for name in ("sdpa_fast", "sdpa_naive", "torch_installed", "torch_tuned"):
            if "error" in r[name]:
                print(f"    {name}: {r[name]['error']}")


if __name__ == "__main__":
    main()
