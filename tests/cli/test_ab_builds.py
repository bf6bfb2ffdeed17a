#!/usr/bin/env python3
"""Tests of bench/ab_builds.cpp (`sdpa_ab_builds`): two copies of one libsdpa build, loaded side by
side, give bit-identical outputs on every pass and a speedup near 1; bad arguments exit 2 with a
message naming the argument. Runs with the binary in $AB and the shared library in $LIB."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, finish  # noqa: E402

AB = os.environ["AB"]
LIB = os.environ["LIB"]


def run(*args):
    return subprocess.run([AB, *args], capture_output=True, text=True)


with tempfile.TemporaryDirectory() as d:
    # A second file of the same build: dlopen loads it as another library, not the same handle.
    copy = os.path.join(d, "libsdpa-copy.so")
    shutil.copy(LIB, copy)
    small = ["--heads", "4", "--kv-heads", "2", "--dim", "64", "--rounds", "4", "--threads", "2",
             "--json"]
    for case in (["--pass", "decode", "--kv-seq", "700", "--dtype", "bfloat16", "--caches", "2"],
                 ["--pass", "decode", "--kv-seq", "300", "--seq", "3", "--dtype", "float32"],
                 ["--pass", "forward", "--kv-seq", "150", "--dtype", "float16"],
                 ["--pass", "backward", "--kv-seq", "130", "--dtype", "float32"]):
        r = run(LIB, copy, *small, *case)
        check(r.returncode == 0, f"{case}: exit 0, got {r.returncode}: {r.stderr}")
        if r.returncode == 0:
            j = json.loads(r.stdout)
            check(j["bit_identical"] is True, f"{case}: the same build twice is bit-identical: {j}")
            check(j["pass"] == case[1] and j["rounds"] == 4, f"{case}: echoes the case: {j}")
            check(0 < j["seconds_a_median"] and 0 < j["seconds_b_median"], f"{case}: times: {j}")
            check(j["speedup_q1"] <= j["speedup_median"] <= j["speedup_q3"],
                  f"{case}: the median lies between the quartiles: {j}")

    r = run(LIB, os.path.join(d, "missing.so"))
    check(r.returncode == 2 and "lib_b" in r.stderr and "missing.so" in r.stderr,
          f"a missing library: exit 2 naming lib_b and the path, got {r.returncode}: {r.stderr}")
    r = run(LIB, copy, "--heads", "6", "--kv-heads", "4")
    check(r.returncode == 2 and "--kv-heads" in r.stderr and "6" in r.stderr,
          f"--kv-heads not dividing --heads: exit 2 naming it, got {r.returncode}: {r.stderr}")
    r = run(LIB, copy, "--pass", "sideways")
    check(r.returncode != 0 and "--pass" in r.stderr,
          f"an unknown pass: non-zero exit naming --pass, got {r.returncode}: {r.stderr}")
    r = run("--help")
    check(r.returncode == 0 and "lib_a" in r.stdout, f"--help: exit 0 with usage: {r.stderr}")

finish("ab_builds")
