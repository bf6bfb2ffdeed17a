#!/usr/bin/python3
"""`sdpa bench` on tiny shapes: the JSON fields the report and bench/torch_compare.py rely on,
and bad arguments refused with exit status 2 and a message naming the option."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, finish  # noqa: E402

SDPA = os.environ["SDPA"]


def run(*args):
    return subprocess.run([SDPA, "bench", *args], capture_output=True, text=True)



tiny = ["--heads", "2", "--kv-heads", "1", "--seq", "70", "--kv-seq", "90", "--dim", "16",
        "--repeat", "3", "--threads", "2", "--json"]
for extra in ([], ["--backward"], ["--impl", "naive"], ["--causal", "lower-right", "--backward"]):
    r = run(*tiny, *extra)
    check(r.returncode == 0, f"bench {extra} exit {r.returncode}: {r.stderr}")
    if r.returncode != 0:
        continue
    j = json.loads(r.stdout)
    for key in ("seconds_median", "seconds_min", "seconds_max", "gflops_median", "percent_of_peak",
                "peak_gflops", "target", "threads", "cpu", "impl"):
        check(key in j, f"bench {extra}: field {key} missing")
    check(j["seconds_min"] <= j["seconds_median"] <= j["seconds_max"], f"bench {extra}: order")
    check(len(j["seconds"]) == 3 and j["threads"] == 2, f"bench {extra}: repeat/threads")
    flops = 2.0 * 1 * 2 * 70 * 90 * 32 * (0.5 if "--causal" in extra else 1) * (
        2.5 if "--backward" in extra else 1)
    check(abs(j["flops"] - flops) <= 1e-9 * flops, f"bench {extra}: flops {j['flops']} != {flops}")

r = run("--peak", "--json")
check(r.returncode == 0 and json.loads(r.stdout)["peak_gflops"] > 0, "bench --peak --json")

# --target pins the kernels and the peak loop to one compiled SIMD target: SCALAR is compiled on
# every x86 machine (so this runs anywhere); the JSON names it for both.
r = run(*tiny, "--target", "scalar")
check(r.returncode == 0, f"bench --target scalar: exit {r.returncode}: {r.stderr}")
if r.returncode == 0:
    j = json.loads(r.stdout)
    check(j["target"] == "SCALAR" and j["peak_target"] == "SCALAR",
          f"bench --target scalar ran on {j['target']}, peak on {j['peak_target']}")
r = run("--peak", "--json", "--threads", "1", "--target", "SCALAR")
check(r.returncode == 0 and json.loads(r.stdout)["target"] == "SCALAR", "bench --peak --target")

for bad, option in ((["--target", "avx9"], "--target"), (["--dim", "0"], "--dim"), (["--kv-heads", "3"], "--kv-heads"),
                    (["--causal", "diagonal"], "--causal"), (["--impl", "fastest"], "--impl")):
    r = run(*bad)
    check(r.returncode == 2 and option in r.stderr, f"bench {bad}: exit {r.returncode}, {r.stderr!r}")

finish("bench CLI")
