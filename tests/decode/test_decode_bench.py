#!/usr/bin/python3
"""`sdpa bench --kv-cache` on tiny shapes: the JSON fields, the K/V byte count, paged and batch of
lengths; `--peak --json` reports the streaming-read bandwidth; bad options exit 2 naming them."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, finish  # noqa: E402

SDPA = os.environ["SDPA"]


def run(*args):
    return subprocess.run([SDPA, "bench", *args], capture_output=True, text=True)


tiny = ["--kv-cache", "--heads", "4", "--kv-heads", "2", "--dim", "16", "--repeat", "3",
        "--threads", "2", "--json"]
for extra, lens, page in ((["--kv-seq", "300"], [300], 0),
                          (["--kv-lens", "5,700,16", "--page-size", "16"], [5, 700, 16], 16),
                          (["--kv-lens", "0,33", "--page-size", "256", "--seq", "3"], [0, 33], 256)):
    r = run(*tiny, *extra)
    check(r.returncode == 0, f"bench {extra} exit {r.returncode}: {r.stderr}")
    if r.returncode != 0:
        continue
    j = json.loads(r.stdout)
    for key in ("seconds_median", "kv_bytes", "kv_gbps_median", "read_gbps",
                "percent_of_read_bandwidth", "target", "threads", "cpu"):
        check(key in j, f"bench {extra}: field {key} missing")
    check(j["kv_lens"] == lens and j["page_size"] == page and j["batch"] == len(lens),
          f"bench {extra}: shape {j['kv_lens']} {j['page_size']}")
    check(j["seq"] == (3 if "--seq" in extra else 1), f"bench {extra}: L defaults to 1")
    want = sum(lens) * 2 * (16 + 16) * 4
    check(j["kv_bytes"] == want, f"bench {extra}: kv_bytes {j['kv_bytes']} != {want}")
    check(j["read_gbps"] > 0 and j["kv_gbps_median"] > 0, f"bench {extra}: rates")

# --kv-compare: the other dtypes timed in the same rounds, each with its bytes (half of float32's
# for a 16-bit cache) and the median over the rounds of its time over --kv-dtype's.
r = run(*tiny, "--kv-seq", "300", "--kv-dtype", "bfloat16", "--kv-compare", "float32,float16")
check(r.returncode == 0, f"bench --kv-compare exit {r.returncode}: {r.stderr}")
if r.returncode == 0:
    j = json.loads(r.stdout)
    check(j["kv_dtype"] == "bfloat16" and j["kv_bytes"] == 300 * 2 * 32 * 2,
          f"bench --kv-compare: {j['kv_dtype']} {j['kv_bytes']}")
    c = j.get("compare", [])
    check([x["kv_dtype"] for x in c] == ["float32", "float16"], f"bench --kv-compare: {c}")
    for x in c:
        size = 4 if x["kv_dtype"] == "float32" else 2
        gbps = 300 * 2 * 32 * size / x["seconds_median"] * 1e-9
        check(abs(x["kv_gbps_median"] - gbps) <= 1e-9 * gbps and x["seconds_ratio_paired_median"] > 0,
              f"bench --kv-compare: {x}")
r = run(*tiny, "--kv-seq", "300", "--json")
check(r.returncode == 0 and "compare" not in json.loads(r.stdout), "bench: compare only when asked")

# --dtype sets the query's dtype; a compared cache the query cannot read (float32 under a
# bfloat16 query) is timed with the float32 query, and its entry says so.
r = run(*tiny, "--kv-seq", "300", "--dtype", "bfloat16", "--kv-dtype", "bfloat16",
        "--kv-compare", "float32,float16")
check(r.returncode == 0, f"bench --dtype bfloat16 exit {r.returncode}: {r.stderr}")
if r.returncode == 0:
    j = json.loads(r.stdout)
    check(j["dtype"] == "bfloat16" and j["kv_dtype"] == "bfloat16", f"bench --dtype: {j['dtype']}")
    check([(x["kv_dtype"], x["dtype"]) for x in j["compare"]]
          == [("float32", "float32"), ("float16", "bfloat16")], f"bench --dtype: {j['compare']}")

# --kv-tiles: each rule is reported, and forcing one decides what is copied (tiles are read in
# place whatever the rule when there is one kv head); auto's choice is the machine's.
for rule, copied in (("copy", True), ("in-place", False)):
    r = run(*tiny, "--kv-seq", "300", "--kv-tiles", rule)
    check(r.returncode == 0, f"bench --kv-tiles {rule} exit {r.returncode}: {r.stderr}")
    if r.returncode == 0:
        j = json.loads(r.stdout)
        check(j["kv_tiles"] == rule and j["kv_tiles_copied"] is copied,
              f"bench --kv-tiles {rule}: {j['kv_tiles']} {j['kv_tiles_copied']}")
one_head = list(tiny)
one_head[one_head.index("--kv-heads") + 1] = "1"
r = run(*one_head, "--kv-seq", "300", "--kv-tiles", "copy")
check(r.returncode == 0 and json.loads(r.stdout)["kv_tiles_copied"] is False,
      "bench --kv-tiles copy with one kv head copies nothing")
r = run(*tiny, "--kv-seq", "300")
check(r.returncode == 0 and json.loads(r.stdout)["kv_tiles"] == "auto", "bench: --kv-tiles auto")

# --kv-order: the rule and the group it gives the sizes (P = min(2048 / (Hkv E), 16) tiles, 1
# for memory order) are reported; the orders agree to rounding, so the outputs are compared in
# tests/decode/test_decode.cpp, not here.
for rule, heads, dim, groups in (("memory", 2, 16, 1), ("page", 2, 16, 16), ("page", 8, 64, 4),
                                 ("page", 8, 128, 2), ("page", 8, 256, 1)):
    args = list(tiny)
    args[args.index("--kv-heads") + 1] = str(heads)
    args[args.index("--heads") + 1] = str(heads)
    args[args.index("--dim") + 1] = str(dim)
    r = run(*args, "--kv-seq", "300", "--kv-order", rule)
    check(r.returncode == 0, f"bench --kv-order {rule} exit {r.returncode}: {r.stderr}")
    if r.returncode == 0:
        j = json.loads(r.stdout)
        check(j["kv_order"] == rule and j["kv_page_rows"] == groups,
              f"bench --kv-order {rule} Hkv {heads} E {dim}: {j['kv_order']} {j['kv_page_rows']}")

r = run("--peak", "--json")
check(r.returncode == 0 and json.loads(r.stdout)["read_gbps"] > 0, "bench --peak --json read_gbps")

for bad, option in ((["--kv-cache", "--page-size", "-1"], "--page-size"),
                    (["--kv-cache", "--kv-lens", "5,-2"], "--kv-lens"),
                    (["--kv-cache", "--kv-heads", "3"], "--kv-heads"),
                    (["--kv-cache", "--kv-compare", "float32"], "--kv-compare"),
                    (["--kv-cache", "--kv-compare", "float16,float16"], "--kv-compare"),
                    (["--kv-cache", "--kv-compare", "float64"], "--kv-compare"),
                    (["--kv-cache", "--kv-tiles", "sometimes"], "--kv-tiles"),
                    (["--kv-cache", "--kv-order", "sideways"], "--kv-order"),
                    (["--kv-order", "page"], "--kv-order"),
                    (["--kv-cache", "--dtype", "float16", "--kv-dtype", "bfloat16"], "--dtype"),
                    (["--kv-cache", "--dtype", "bfloat16"], "--dtype")):
    r = run(*bad)
    check(r.returncode == 2 and option in r.stderr, f"bench {bad}: exit {r.returncode}, {r.stderr!r}")

finish("decode bench CLI")
