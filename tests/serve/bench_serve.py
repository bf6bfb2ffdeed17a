"""Times `sdpa serve`'s answers to slider moves (not a test: speed goals live in benchmarks).

    SDPA=build/sdpa /usr/bin/python3 tests/serve/bench_serve.py [--cores 0,1]

For N <= 4096 and d <= 1024: the first request of a law (its keys are drawn), then a sweep of
the d slider up and down at N = 4096 and of the N slider at d = 1024, for each scale, measured
by the client (loopback HTTP included). Prints one JSON object with medians and maxima."""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402
from harness import request  # noqa: E402

D_LIST = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]
N_LIST = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def cpu_ms(server):
    """User + system CPU time of the server process so far, in ms (all its threads)."""
    fields = open(f"/proc/{server.proc.pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def timed(server, path, body):
    t = time.perf_counter()
    status, r = request(server, "POST", path, body)
    assert status == 200, (status, r)
    return (time.perf_counter() - t) * 1000, r.get("ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cores", help="pin the server to these cores (taskset list, e.g. 0,1)")
    args = ap.parse_args()
    if args.cores:
        os.sched_setaffinity(0, {int(c) for c in args.cores.split(",")})
    out = {"cpu": next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                        if line.startswith("model name")), "?"),
           "cores": len(os.sched_getaffinity(0)), "load_average": os.getloadavg()[0]}
    with harness.Server() as server:
        cold = []
        c0 = cpu_ms(server)
        for seed, dist in enumerate(("normal", "uniform", "rademacher", "student-t")):
            cold.append(timed(server, "/api/scores", {"d": 1024, "n": 4096, "dist": dist,
                                                      "seed": 100 + seed})[0])
        out["first_request_of_a_law_ms"] = {"median": statistics.median(cold), "max": max(cold),
                                            "cpu_per_request": (cpu_ms(server) - c0) / len(cold)}
        for scale in ("1", "1/sqrt(d)", "1/d", "qk-norm", "softcap"):
            c0 = cpu_ms(server)
            sweep = [timed(server, "/api/scores", {"d": d, "n": 4096, "scale": scale})[0]
                     for d in D_LIST + D_LIST[::-1]]
            sweep += [timed(server, "/api/scores", {"d": 1024, "n": n, "scale": scale})[0]
                      for n in N_LIST + N_LIST[::-1]]
            # CPU time per request: on an idle machine with both cores free, the wall time is
            # about half of it (the scores pass runs on every core).
            out[f"slider_ms[{scale}]"] = {"median": statistics.median(sweep), "max": max(sweep),
                                          "requests": len(sweep),
                                          "cpu_per_request": (cpu_ms(server) - c0) / len(sweep)}
        out["softmax_ms"] = statistics.median(
            timed(server, "/api/softmax", {"logits": "1000, 10, 5"})[0] for _ in range(20))
        out["freeze_ms(d<=1024,N<=4096)"] = statistics.median(
            timed(server, "/api/freeze", {"scale": s})[0] for s in ("1", "1/sqrt(d)", "1/d"))
        server.stop()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
