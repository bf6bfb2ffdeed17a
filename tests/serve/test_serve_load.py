"""`sdpa serve` under load: 200 requests at once from one client on loopback (scores, softmax,
static files, info and live event streams), while a training run is in progress. Every answer
must be 200 and equal to the answer the same request got alone; the run's curve must equal that
of the same run made without load; the server must survive and stop cleanly. Bounded: every
request has a 60 s timeout and the whole burst must end within 120 s."""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
sys.path.insert(0, os.path.dirname(__file__))
from checks import check, finish  # noqa: E402
import harness  # noqa: E402
from harness import request  # noqa: E402

N_REQUESTS = 200
RUN = {"scale": "1", "d": 64, "steps": 150, "eval_every": 10, "seed": 5}


def without_timing(answer):
    """(status, body) with the body's wall time ("ms") left out."""
    status, body = answer
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if k != "ms"}
    return status, body


def workload():
    """The 200 requests: (method, path, body)."""
    jobs = []
    for i in range(N_REQUESTS):
        k = i % 10
        if k < 4:
            jobs.append(("POST", "/api/scores", {"d": (16, 64, 256)[i % 3], "n": (256, 1024)[i % 2],
                                                  "scale": ("1", "1/sqrt(d)", "qk-norm")[i % 3],
                                                  "seed": i % 4}))
        elif k < 7:
            jobs.append(("POST", "/api/softmax", {"logits": [1000, 10, 5, i % 7],
                                                   "temperature": 1 + i % 3}))
        elif k == 7:
            jobs.append(("GET", ("/", "/app.js", "/chart.min.js", "/style.css")[i % 4], None))
        elif k == 8:
            jobs.append(("GET", "/api/info", None))
        elif i < 60:  # six event streams: the server allows eight at once
            jobs.append(("EVENTS", None, None))
        else:
            jobs.append(("RUN", None, None))
    return jobs


def main():
    with harness.Server() as server:
        # The run alone, for reference.
        status, r = request(server, "POST", "/api/train/start", RUN, {"X-Sdpa-Client": "solo"})
        solo_points, solo_end = harness.events(server, r["id"])
        check(solo_end["state"] == "done", f"the reference run completes ({solo_end})")

        jobs = workload()
        expected = {}
        for method, path, body in jobs:
            if method in ("GET", "POST"):
                key = (method, path, repr(body))
                if key not in expected:
                    expected[key] = without_timing(request(server, method, path, body))

        # The same run again, now under load; its stream is also read by the EVENTS jobs.
        status, r = request(server, "POST", "/api/train/start", RUN, {"X-Sdpa-Client": "loaded"})
        run_id = r["id"]
        results = [None] * len(jobs)
        barrier = threading.Barrier(len(jobs))

        def work(i, method, path, body):
            try:
                barrier.wait(timeout=60)
                if method == "EVENTS":
                    results[i] = harness.events(server, run_id, timeout=60)
                elif method == "RUN":
                    results[i] = request(server, "GET", f"/api/train/run?id={run_id}", timeout=60)
                else:
                    results[i] = without_timing(request(server, method, path, body, timeout=60))
            except Exception as e:  # recorded, then reported as a failure
                results[i] = e

        t0 = time.time()
        threads = [threading.Thread(target=work, args=(i, *job)) for i, job in enumerate(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        elapsed = time.time() - t0
        check(not any(t.is_alive() for t in threads) and elapsed < 120,
              f"{len(jobs)} concurrent requests finished in {elapsed:.1f} s (bound 120 s)")
        failures = 0
        for (method, path, body), got in zip(jobs, results):
            if method == "EVENTS":
                ok = (isinstance(got, tuple) and got[1] is not None and got[1]["state"] == "done"
                      and got[0] == solo_points)
                what = "an event stream delivered the whole run, equal to the solo run's"
            elif method == "RUN":
                ok = (isinstance(got, tuple) and got[0] == 200 and
                      got[1]["points"] == solo_points[:len(got[1]["points"])])
                what = "a snapshot of the run in progress is a prefix of the solo run's curve"
            else:
                ok = got == expected[(method, path, repr(body))] and got[0] == 200
                what = f"{method} {path} {body}: 200 and the same answer as alone"
            if not ok:
                failures += 1
                check(False, f"{what} (got {str(got)[:200]})")
        check(failures == 0, f"{len(jobs) - failures} of {len(jobs)} requests answered correctly")
        status, snap = request(server, "GET", f"/api/train/run?id={run_id}")
        check(snap["state"] == "done" and snap["points"] == solo_points,
              "the run made under load has the same curve as the run made alone")
        check(server.alive(), "the server survived")
        check(request(server, "GET", "/api/info")[0] == 200, "and still answers")
        check(server.stop() == 0, "SIGINT stops it with status 0")
        print(f"load: {len(jobs)} requests in {elapsed:.2f} s")
    finish("serve load test")


if __name__ == "__main__":
    main()
