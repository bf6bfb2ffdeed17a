#!/usr/bin/python3
"""bench/half_precision.py on tiny shapes: one row per 16-bit dtype and pass, and per 16-bit decode
cache; each ratio is the median of the per-round ratios it reports; the goals are the documented
ones; bad options exit non-zero naming them."""
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, finish  # noqa: E402

SDPA, SCRIPT = os.environ["SDPA"], os.environ["SCRIPT"]


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, "--sdpa", SDPA, *args], capture_output=True,
                          text=True)


tiny = ["--threads", "2", "--rounds", "2", "--repeat", "1", "--kv-repeat", "3", "--shape",
        "1,2,64,32", "--kv-shape", "4,2,300,32"]
r = run(*tiny, "--json")
check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
if r.returncode == 0:
    j = json.loads(r.stdout)
    cases = [row["case"] for row in j["rows"]]
    check(cases == ["bfloat16 forward", "float16 forward", "bfloat16 backward", "float16 backward",
                    "bfloat16 decode", "bfloat16 decode, bfloat16 query", "float16 decode"],
          f"rows {cases}")
    check(len(j["peaks"]) == 2 and j["peak_gflops_median"] > 0, f"peaks {j['peaks']}")
    for row in j["rows"]:
        check(row["ratio"] > 0, f"{row['case']}: ratio {row['ratio']}")
        if "runs" in row:
            want = statistics.median(x / y for x, y in zip(row["runs"], row["float32_runs"]))
            check(len(row["runs"]) == 2 and abs(row["ratio"] - want) <= 1e-12 * want,
                  f"{row['case']}: ratio {row['ratio']} from runs {want}")
        if row["goal"] is not None:
            check(row["met"] == (row["ratio"] >= row["goal"]), f"{row['case']}: met {row['met']}")
    goals = {row["case"]: row["goal"] for row in j["rows"]}
    check(goals["bfloat16 forward"] == (1.6 if j["native_bf16_products"] else 1.0) and
          goals["float16 forward"] == 1.0 and goals["bfloat16 backward"] == 1.0 and
          goals["float16 backward"] is None and goals["bfloat16 decode"] == 1.8 and
          goals["bfloat16 decode, bfloat16 query"] == 1.8 and goals["float16 decode"] == 1.8,
          f"goals {goals}")

r = run(*tiny)
check(r.returncode == 0 and "| bfloat16 decode |" in r.stdout and "FMA peak" in r.stdout,
      f"table: {r.stdout!r} {r.stderr!r}")

for bad, option in ((["--shape", "1,2,64"], "--shape"), (["--kv-shape", "4,0,300,32"], "--kv-shape"),
                    (["--rounds", "0"], "--rounds")):
    r = run(*bad)
    check(r.returncode != 0 and option in r.stderr, f"{bad}: exit {r.returncode}, {r.stderr!r}")

finish("half-precision bench script")
