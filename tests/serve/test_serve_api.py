"""`sdpa serve`'s JSON API without a browser: the numbers against independent computations
(NumPy), and every kind of bad request: out-of-range and unknown parameters (400 naming the
parameter), malformed JSON, traversal paths (404), oversized bodies (413), and the training
limits (429 "busy"). Ends with the server still answering, then stopped by SIGTERM."""
import json
import math
import os
import signal
import socket
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
sys.path.insert(0, os.path.dirname(__file__))
from checks import check, finish  # noqa: E402
import harness  # noqa: E402
from harness import request  # noqa: E402


def numbers(server):
    # Scores: the API's row-0 logits give back its softmax, entropy, max and Jacobian norm.
    for body in ({"d": 64, "n": 512}, {"d": 16, "n": 300, "scale": "1", "dist": "rademacher"},
                 {"d": 100, "n": 256, "scale": "softcap", "cap": 3, "dist": "student-t",
                  "mean": 0.3, "corr": 0.2, "seed": 7},
                 {"d": 33, "n": 129, "scale": "qk-norm", "dist": "uniform"},
                 {"d": 8, "n": 64, "scale": 2.5, "dist": "laplace", "sigma": 0.5}):
        status, r = request(server, "POST", "/api/scores", dict(body, logits=True))
        if not check(status == 200, f"scores {body}: status {status} {r}"):
            continue
        z = np.array(r["row"]["logits"])
        p = np.exp(z - z.max())
        p /= p.sum()
        jac = np.diag(p) - np.outer(p, p)
        top = np.sort(p)[::-1][:len(r["row"]["probs_sorted"])]
        check(np.allclose(top, r["row"]["probs_sorted"], rtol=1e-12, atol=1e-300),
              f"scores {body}: the sorted probabilities are the softmax of the row's logits")
        h = -np.sum(p[p > 0] * np.log(p[p > 0]))
        check(abs(h - r["row"]["entropy"]) <= 1e-10 * max(1, h), f"scores {body}: entropy")
        check(abs(p.max() - r["row"]["max_prob"]) <= 1e-12, f"scores {body}: max probability")
        check(abs(np.linalg.norm(jac) - r["row"]["jacobian_norm"]) <= 1e-10,
              f"scores {body}: Jacobian norm against the explicit diag(p) - p p^T")
        check(abs(r["row"]["ln_n"] - math.log(body["n"])) < 1e-12, f"scores {body}: ln N")
        check(r["row"]["entropy"] <= r["row"]["ln_n"] + 1e-12, f"scores {body}: entropy <= ln N")
        hist = r["hist"]
        mass = sum(hist["density"]) * hist["width"] + hist["outside"]
        check(abs(mass - 1) < 1e-9, f"scores {body}: the histogram's mass is 1 ({mass})")
        check(0 <= r["grad"]["dead_fraction"] <= 1, f"scores {body}: dead fraction in [0, 1]")
        if body.get("scale") == "1":
            check(np.allclose(z, np.round(z)), f"scores {body}: Rademacher q.k are integers")

    # The closed form: Var q.k = d for unit-variance components, whatever the law; and with a
    # mean and a correlation, sigma^4 d (1 + (d-1) rho^2) + 2 mu^2 sigma^2 d (1 + (d-1) rho).
    for dist in ("normal", "uniform", "rademacher", "student-t"):
        status, r = request(server, "POST", "/api/scores", {"d": 256, "n": 4096, "dist": dist,
                                                             "scale": "1"})
        v = r["raw_variance"]
        check(v["theory"] == 256 and abs(v["measured"] / 256 - 1) < 0.1,
              f"{dist}: Var q.k measured {v['measured']:.1f} within 10% of d = 256")
    status, r = request(server, "POST", "/api/scores", {"d": 10, "n": 8, "mean": 0.5, "sigma": 2,
                                                         "corr": 0.25})
    want = 2**4 * 10 * (1 + 9 * 0.25**2) + 2 * 0.25 * 4 * 10 * (1 + 9 * 0.25)
    check(abs(r["raw_variance"]["theory"] - want) < 1e-9 * want,
          f"closed form with mean and correlation: {r['raw_variance']['theory']} vs {want}")
    check(abs(r["variance"]["theory"] - want / 10) < 1e-9 * want, "1/sqrt(d) divides it by d")

    # Softmax playground: 1000, 10, 5 overflows the naive formula in float16 (exp(1000) = inf,
    # inf / inf = NaN) but not the stable one; float64 matches NumPy; gradients of p[0].
    status, r = request(server, "POST", "/api/softmax", {"logits": "1000, 10, 5"})
    fmts = {f["format"]: f for f in r["formats"]}
    check(fmts["float16"]["naive"]["ok"] is False and "nan" in fmts["float16"]["naive"]["probs"],
          "naive float16 softmax of 1000, 10, 5 is NaN")
    check(fmts["float16"]["stable"]["probs"] == [1.0, 0.0, 0.0], "stable float16 gives 1, 0, 0")
    x = np.array([2.0, -1.0, 0.5, 3.25])
    status, r = request(server, "POST", "/api/softmax", {"logits": x.tolist(), "temperature": 2,
                                                          "target": 1})
    p = np.exp(x / 2 - (x / 2).max())
    p /= p.sum()
    fmts = {f["format"]: f for f in r["formats"]}
    check(np.allclose(fmts["float64"]["stable"]["probs"], p, rtol=1e-15, atol=0),
          "float64 stable softmax equals NumPy's")
    check(np.allclose(fmts["float64"]["naive"]["probs"], p, rtol=1e-14, atol=0),
          "float64 naive softmax is fine for small logits")
    g = p[1] * ((np.arange(4) == 1) - p) / 2
    check(np.allclose(r["library"]["grad"], g, rtol=1e-13, atol=1e-16),
          "gradient of p[target] is p_t (delta - p) / T")
    p16 = np.array(fmts["float16"]["stable"]["probs"])
    check(np.all(np.abs(p16 - p) <= 2 * 2.0**-11 * np.maximum(p, 2.0**-14)),
          "float16 probabilities lie within two float16 ulps of the exact ones")
    check(all(float(np.float16(v)) == v for v in p16), "float16 results are float16 numbers")
    bf = np.array(fmts["bfloat16"]["stable"]["probs"], dtype=np.float64)
    check(all((np.float32(v).view(np.uint32) & 0xFFFF) == 0 for v in bf),
          "bfloat16 results have 8 significant bits")

    # Freezing map: entropy fractions in [0, 1]; with scale 1 the boundary is d = 2 ln N.
    status, r = request(server, "POST", "/api/freeze", {"scale": "1", "d_max": 256, "n_max": 1024})
    check(status == 200 and len(r["grid"]) == 9 * 10, f"freeze grid 9 x 10 ({status})")
    check(all(0 <= c["normalized"] <= 1 + 1e-12 for c in r["grid"]), "H / ln N in [0, 1]")
    check(all(abs(b["d"] - 2 * math.log(b["n"])) < 0.05 * b["d"] for b in r["boundary"]) and
          len(r["boundary"]) > 0, "scale 1: the boundary is d = 2 ln N")
    cells = {(c["d"], c["n"]): c["normalized"] for c in r["grid"]}
    check(cells[(256, 1024)] < 0.2 < 0.8 < cells[(1, 1024)],
          f"scale 1 freezes at large d ({cells[(256, 1024)]:.2f}) and not at d = 1 "
          f"({cells[(1, 1024)]:.2f})")
    status, r = request(server, "POST", "/api/freeze", {"scale": "1/sqrt(d)", "d_max": 256,
                                                         "n_max": 1024})
    check(r["boundary"] == [], "1/sqrt(d): no boundary (s^2 = 1 < 2 ln N for every N >= 2)")
    check(min(c["normalized"] for c in r["grid"] if c["n"] >= 64) > 0.8,
          "1/sqrt(d) keeps H / ln N above 0.8 for N >= 64")
    # The same request twice gives the same bytes (the cache changes nothing).
    a = request(server, "POST", "/api/scores", {"d": 48, "n": 1000, "seed": 3})[1]
    request(server, "POST", "/api/scores", {"d": 700, "n": 2000, "seed": 3})
    b = request(server, "POST", "/api/scores", {"d": 48, "n": 1000, "seed": 3})[1]
    a.pop("ms")
    b.pop("ms")
    check(a == b, "a request's numbers do not depend on the requests before it")


BAD = [
    ("/api/scores", {"d": 0}, "d"), ("/api/scores", {"d": 4097}, "d"),
    ("/api/scores", {"d": 2.5}, "d"), ("/api/scores", {"d": "64"}, "d"),
    ("/api/scores", {"n": 0}, "n"), ("/api/scores", {"n": 16384, "d": 4096}, "n"),
    ("/api/scores", {"dist": "cauchy"}, "dist"), ("/api/scores", {"mean": 5}, "mean"),
    ("/api/scores", {"sigma": 0}, "sigma"), ("/api/scores", {"corr": 1}, "corr"),
    ("/api/scores", {"corr": -0.1}, "corr"), ("/api/scores", {"scale": "2/d"}, "scale"),
    ("/api/scores", {"scale": 1e9}, "scale"), ("/api/scores", {"scale": None, "cap": 0}, "cap"),
    ("/api/scores", {"seed": -1}, "seed"), ("/api/scores", {"bins": 3}, "bins"),
    ("/api/scores", {"logits": 1}, "logits"), ("/api/scores", {"dd": 64}, "dd"),
    ("/api/softmax", {"logits": "1, x"}, "logits"), ("/api/softmax", {"logits": []}, "logits"),
    ("/api/softmax", {"logits": list(range(65))}, "logits"),
    ("/api/softmax", {"logits": "1e400"}, "logits"),
    ("/api/softmax", {"logits": "1-2"}, "logits"), ("/api/softmax", {"logits": "0x10"}, "logits"),
    ("/api/softmax", {"logits": "nan"}, "logits"), ("/api/scores", {"seed": 2**53 + 1}, "seed"),
    ("/api/softmax", {"logits": [1e300], "temperature": 1e-3}, "logits"),
    ("/api/softmax", {"logits": [1, 2], "temperature": 0}, "temperature"),
    ("/api/softmax", {"logits": [1, 2], "target": 2}, "target"),
    ("/api/freeze", {"d_max": 3}, "d_max"), ("/api/freeze", {"n_max": 8192}, "n_max"),
    ("/api/freeze", {"n_max": 1}, "n_max"),
    ("/api/train/start", {"d": 0}, "d"), ("/api/train/start", {"lr": 100}, "lr"),
    ("/api/train/start", {"steps": 0}, "steps"), ("/api/train/start", {"optimizer": "rmsprop"},
                                                  "optimizer"),
    ("/api/train/start", {"scale": "softcap"}, "scale"),
    ("/api/train/start", {"eval_every": 0}, "eval_every"),
    ("/api/train/stop", {"id": "x"}, "id"), ("/api/train/stop", {"id": 999}, "id"),
    ("/api/train/stop", {"run": 1}, "run"),
]


def bad_requests(server):
    for path, body, param in BAD:
        status, r = request(server, "POST", path, body)
        check(status == 400 and isinstance(r, dict) and r.get("parameter") == param and
              param in r.get("error", ""),
              f"POST {path} {json.dumps(body)[:60]}: 400 naming {param!r} (got {status} {r})")
    for raw in (b"{", b"[1, 2", b"nul", b'{"d": 64,}', b"\xff\xfe", b"[1]", b"3", b'"d"',
                b'{"d": 1e400}', b'{"lr": -1e400}'):
        status, r = request(server, "POST", "/api/scores", raw)
        check(status == 400 and r.get("parameter") == "body",
              f"malformed body {raw!r}: 400 naming the body (got {status} {r})")
    for path in ("/api/train/run?id=abc", "/api/train/run?id=0", "/api/train/run?id=12345",
                 "/api/train/events?id=-1", "/api/train/events"):
        status, r = request(server, "GET", path)
        check(status == 400 and r.get("parameter") == "id", f"GET {path}: 400 naming id ({status})")
    for path in ("/../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "//etc/passwd", "/etc/passwd",
                 "/app.js/../../../etc/passwd", "/web/app.js", "/src/serve/web/app.js",
                 "/..%2fapp.js", "/chart.min.js/", "/index.html%00.js", "/.git/config",
                 "/usr/share/javascript/chart.js/chart.min.js", "/static/../app.js"):
        status, r = request(server, "GET", path)
        check(status == 404 and b"root:" not in (r if isinstance(r, bytes) else json.dumps(r).encode()),
              f"GET {path}: 404 ({status})")
    for path, kind in (("/", b"<html"), ("/?lang=zh", b'lang="zh"'), ("/app.js", b"use strict"),
                       ("/chart.min.js", b"Chart.js v3"), ("/style.css", b"--fg")):
        status, r = request(server, "GET", path)
        check(status == 200 and kind in r, f"GET {path}: 200 with the embedded file")
    # Oversized bodies: 413 with a JSON answer, before any work.
    for size in (64 * 1024 + 1, 1 << 20):
        body = b'{"logits": "' + b"1," * (size // 2) + b'1"}'
        status, r = request(server, "POST", "/api/softmax", body)
        check(status == 413 and r.get("parameter") == "body", f"{len(body)}-byte body: 413 ({status})")
    # An empty body, or one without logits, takes the default row /api/info states.
    for raw in (b"", b"{}"):
        status, r = request(server, "POST", "/api/softmax", raw)
        check(status == 200 and r.get("logits") == [1000, 10, 5],
              f"softmax with body {raw!r}: the default logits ({status})")
    # A chunked body states no length: refused (411) after its headers, before any of it is
    # read, however much the client goes on sending.
    with socket.create_connection((server.host, server.port), timeout=30) as c:
        c.sendall(b"POST /api/scores HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                  b"Content-Type: application/json\r\n\r\n")
        c.sendall(b"%x\r\n%s\r\n" % (1 << 16, b" " * (1 << 16)))
        # The first response only (the server may answer the unread body's bytes after it).
        answer, length = b"", None
        try:
            while length is None or len(answer.partition(b"\r\n\r\n")[2]) < length:
                chunk = c.recv(4096)
                if not chunk:
                    break
                answer += chunk
                head = answer.partition(b"\r\n\r\n")[0]
                if length is None and b"\r\n\r\n" in answer:
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":")[1])
        except (ConnectionResetError, socket.timeout):
            pass
        head, _, body = answer.partition(b"\r\n\r\n")
        ok = head.startswith(b"HTTP/1.1 411") and length is not None
        if ok:
            r = json.loads(body[:length])
            ok = r.get("parameter") == "body" and "Content-Length" in r.get("error", "")
        check(ok, f"chunked body: 411 naming the body ({head[:40]!r})")
    status, _ = request(server, "GET", "/api/info")
    check(status == 200, "the server answers after a refused chunked body")


def training_limits(server):
    # One run per client, two overall (the default --max-runs); "busy" beyond.
    long_run = {"steps": 5000, "d": 256, "eval_every": 100}
    a = {"X-Sdpa-Client": "client-a"}
    status, r = request(server, "POST", "/api/train/start", long_run, a)
    check(status == 200 and r["id"] >= 1, f"client a starts a run ({status} {r})")
    first = r["id"]
    status, r = request(server, "POST", "/api/train/start", long_run, a)
    check(status == 429 and r.get("busy") is True, f"client a's second run is refused busy ({status})")
    b = {"X-Sdpa-Client": "client-b"}
    status, r = request(server, "POST", "/api/train/start", long_run, b)
    check(status == 200, f"client b starts a run ({status})")
    second = r.get("id")
    status, r = request(server, "POST", "/api/train/start", long_run, {"X-Sdpa-Client": "client-c"})
    check(status == 429 and r.get("busy") is True and "2 training runs" in r["error"],
          f"a third client is refused: the server is busy ({status} {r})")
    status, r = request(server, "POST", "/api/train/stop", {"id": first}, b)
    check(status == 400, "client b cannot stop client a's run")
    # More event streams than allowed (8) are refused, the first ones keep working.
    import http.client
    conns = []
    for _ in range(8):
        c = http.client.HTTPConnection(server.host, server.port, timeout=30)
        c.request("GET", f"/api/train/events?id={first}")
        res = c.getresponse()
        check(res.status == 200, "an event stream opens")
        conns.append(c)
    status, r = request(server, "GET", f"/api/train/events?id={first}")
    check(status == 429 and r.get("busy") is True, f"a ninth event stream is refused ({status})")
    for c in conns:
        c.close()
    time.sleep(0.6)  # each stream notices its closed socket within 250 ms
    for run_id, who in ((first, a), (second, b)):
        status, r = request(server, "POST", "/api/train/stop", {"id": run_id}, who)
        check(status == 200 and r["stopping"], f"run {run_id} is stopped by its client")
        points, end = harness.events(server, run_id)
        check(end is not None and end["state"] == "stopped", f"run {run_id} ends as stopped ({end})")
    status, r = request(server, "POST", "/api/train/start", {"steps": 3, "eval_every": 1}, a)
    check(status == 200, "after stopping, client a may start again")
    points, end = harness.events(server, r["id"])
    check(end["state"] == "done" and [p["step"] for p in points] == [0, 1, 2, 3],
          f"a 3-step run streams steps 0..3 and ends done ({end})")


def main():
    with harness.Server() as server:
        numbers(server)
        bad_requests(server)
        training_limits(server)
        status, r = request(server, "GET", "/api/info")
        check(status == 200 and r["scores"]["d"]["max"] == 4096, "the server still answers")
        # SIGTERM with a run in progress: the run is stopped and the server exits 0.
        request(server, "POST", "/api/train/start", {"steps": 5000}, {"X-Sdpa-Client": "late"})
        t = time.time()
        check(server.stop(signal.SIGTERM) == 0, "SIGTERM during a run: exit status 0")
        check(time.time() - t < 5, f"and within 5 s ({time.time() - t:.1f} s)")
    # --port of a port in use: exit 2 with a message.
    with harness.Server() as first:
        import subprocess
        p = subprocess.run([harness.SDPA, "serve", "--port", str(first.port)], capture_output=True,
                           text=True, timeout=30)
        check(p.returncode == 2 and "sdpa: error:" in p.stderr and "--port" in p.stderr,
              f"a port in use: exit 2 ({p.returncode} {p.stderr.strip()})")
        first.stop()
    finish("serve API test")


if __name__ == "__main__":
    main()
