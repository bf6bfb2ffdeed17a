#!/usr/bin/python3
"""Decode through the Python module with the KV cache in the layout serving code keeps it.

A model's cache is usually (B, S, Hkv, E), FlashAttention's layout. It reaches
sdpa.scaled_dot_product_attention as a transposed (B, Hkv, S, E) view, which the decode kernel
reads through its strides in place. This script times, alternating in each round:

  contiguous  q, k, v in C order (B, H, S, E): the baseline;
  transposed  k and v as (B, S, Hkv, E) arrays viewed as (B, Hkv, S, E) (q too, as (B, L, H, E));
  kvcache     sdpa.attention_with_kvcache on the (B, S, Hkv, E) cache itself.

It reports the median wall time of each and its ratio to the contiguous call, and checks that
the three give the same numbers (the same kernel reads the same values).

Usage: PYTHONPATH=build/python bench/strided_decode.py [--seq 32768] [--heads 32]
       [--kv-heads 8] [--dim 128] [--threads 2] [--rounds 7] [--json]
"""
import argparse
import json
import statistics
import time

import numpy as np

import sdpa


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", type=int, default=32768, help="keys in the cache (S)")
    ap.add_argument("--heads", type=int, default=32, help="query heads (Hq)")
    ap.add_argument("--kv-heads", type=int, default=8, help="key/value heads (Hkv)")
    ap.add_argument("--dim", type=int, default=128, help="head dimension (E = Ev)")
    ap.add_argument("--queries", type=int, default=1, help="query rows per head (L)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()

    rng = np.random.default_rng(a.seed)
    B, L, S, Hq, Hkv, E = 1, a.queries, a.seq, a.heads, a.kv_heads, a.dim
    q_blhe = rng.standard_normal((B, L, Hq, E), dtype=np.float32)
    k_bshe = rng.standard_normal((B, S, Hkv, E), dtype=np.float32)
    v_bshe = rng.standard_normal((B, S, Hkv, E), dtype=np.float32)
    q_view, k_view, v_view = (x.transpose(0, 2, 1, 3) for x in (q_blhe, k_bshe, v_bshe))
    q_c, k_c, v_c = (np.ascontiguousarray(x) for x in (q_view, k_view, v_view))
    seqlens = np.full((B,), S, dtype=np.int32)

    calls = {
        "contiguous": lambda: sdpa.scaled_dot_product_attention(
            q_c, k_c, v_c, enable_gqa=True, threads=a.threads),
        "transposed": lambda: sdpa.scaled_dot_product_attention(
            q_view, k_view, v_view, enable_gqa=True, threads=a.threads),
        "kvcache": lambda: sdpa.attention_with_kvcache(
            q_blhe, k_bshe, v_bshe, cache_seqlens=seqlens, threads=a.threads),
    }
    outs = {name: np.asarray(f()) for name, f in calls.items()}  # warm-up and the check
    same = {
        "transposed": bool(np.array_equal(outs["transposed"], outs["contiguous"])),
        "kvcache": bool(np.array_equal(outs["kvcache"].transpose(0, 2, 1, 3),
                                       outs["contiguous"])),
    }
    times = {name: [] for name in calls}
    for _ in range(a.rounds):
        for name, f in calls.items():
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    result = {
        "shape": {"B": B, "L": L, "S": S, "Hq": Hq, "Hkv": Hkv, "E": E},
        "threads": a.threads,
        "rounds": a.rounds,
        "median_ms": med,
        "ratio_to_contiguous": {n: med[n] / med["contiguous"] for n in med},
        "same_bits_as_contiguous": same,
    }
    if a.json:
        print(json.dumps(result))
        return
    print(f"(B, L, S, Hq, Hkv, E) = ({B}, {L}, {S}, {Hq}, {Hkv}, {E}), {a.threads} threads, "
          f"median of {a.rounds} rounds")
    for name in calls:
        extra = "" if name == "contiguous" else f"  same bits: {same[name]}"
        print(f"  {name:11s} {med[name]:8.2f} ms  {med[name] / med['contiguous']:5.2f}x{extra}")


if __name__ == "__main__":
    main()
