"""`sdpa serve` in a real browser: headless Chromium loads the page, the d slider is dragged
with the mouse, the charts must change and hold exactly the numbers the API gives for the
page's inputs; a short training run is started with a click and must stream to its end, its
curve equal to the server's record; screenshots must not be blank."""
import asyncio
import os
import sys
import time

T0 = time.time()


def log(what):
    print(f"[{time.time() - T0:6.1f} s] {what}", flush=True)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
sys.path.insert(0, os.path.dirname(__file__))
from checks import check, finish  # noqa: E402
import harness  # noqa: E402
from harness import request  # noqa: E402

IDLE = "window.sdpa && window.sdpa.inflight === 0"


def hist_points(r):
    return [{"x": x, "y": y} for x, y in zip(r["hist"]["centers"], r["hist"]["density"])]


def curve_points(r):
    return [{"x": x, "y": y} for x, y in zip(r["theory_curve"]["x"], r["theory_curve"]["density"])]


async def chart_state(b):
    return await b.eval("""(() => { const c = window.sdpa.charts, l = window.sdpa.last.scores;
        return { request: l.request, renders: window.sdpa.renders.scores,
          d_shown: document.getElementById('d-value').textContent,
          hist: c.hist.data.datasets[0].data, theory: c.hist.data.datasets[1].data,
          row: c.row.data.datasets[0].data, grad: c.grad.data.datasets[0].data }; })()""")


async def scenario(server, chromium, out_dir):
    b = harness.Browser(chromium)
    log("chromium started")
    try:
        await b.connect()
        await b.send("Page.navigate", url=server.url)
        await b.wait_for("window.sdpa && window.sdpa.renders.scores >= 1 && "
                         "window.sdpa.renders.freeze >= 1 && window.sdpa.renders.softmax >= 1 && "
                         + IDLE, what="the first render of every panel")
        log("page rendered")
        before = await chart_state(b)
        check(before["request"]["d"] == 64 and before["d_shown"] == "64",
              f"the page starts at d = 64 (request {before['request']['d']}, shown {before['d_shown']})")
        check(len(before["hist"]) == 60 and len(before["theory"]) == 161,
              "the histogram has 60 bins and the theory curve 161 points")

        # Drag the d slider's thumb to three quarters of its track.
        box = await b.box("d-slider")
        frac0 = 11 / 23  # d = 64 is entry 11 of 24
        y = box["y"] + box["h"] / 2
        await b.drag(box["x"] + 8 + (box["w"] - 16) * frac0, y, box["x"] + 8 + (box["w"] - 16) * 0.75)
        await b.wait_for(f"window.sdpa.renders.scores > {before['renders']} && " + IDLE,
                         what="a render after the slider moved")
        after = await chart_state(b)
        d_new = after["request"]["d"]
        check(d_new > 64 and str(d_new) == after["d_shown"],
              f"dragging the slider raised d: request d = {d_new}, shown {after['d_shown']}")
        check(after["hist"] != before["hist"], "the histogram's data changed")

        # The charts hold exactly what the API answers for the inputs the page sent.
        status, api = request(server, "POST", "/api/scores", after["request"])
        check(status == 200, f"POST /api/scores with the page's inputs answers 200 ({status})")
        check(api["d"] == d_new, "the API computed for the slider's d")
        check(after["hist"] == hist_points(api), "histogram bars equal the API's densities")
        check(after["theory"] == curve_points(api), "theory curve equals the API's closed form")
        check(after["row"] == [max(p, 1e-300) for p in api["row"]["probs_sorted"]],
              "row softmax bars equal the API's probabilities")
        check(after["grad"] == api["grad"]["log10_hist"]["counts"],
              "gradient histogram equals the API's counts")
        caption = await b.eval("document.getElementById('hist-caption').textContent")
        check(f"{api['rows']} rows" in caption, f"the caption reports the rows ({caption[:60]}...)")
        # The numbers themselves: at 1/sqrt(d) the scaled scores have variance 1.
        check(abs(api["variance"]["measured"] - 1) < 0.15 and abs(api["variance"]["theory"] - 1) < 1e-12,
              f"measured variance {api['variance']['measured']:.3f} near the closed form 1")

        log("slider checked")
        # Training: 60 steps, evaluated every 10, started with a click on the button.
        await b.eval("""(() => { document.getElementById('train-steps').value = 60;
            document.getElementById('train-eval').value = 10; return true; })()""")
        box = await b.box("train-start")
        await b.click(box["x"] + box["w"] / 2, box["y"] + box["h"] / 2)
        await b.wait_for("window.sdpa.runs.length === 1 && window.sdpa.runs[0].state !== 'running'",
                         timeout=120, what="the training run to end")
        run = await b.eval("""(() => { const r = window.sdpa.runs[0]; return { id: r.id,
            state: r.state, points: r.points, request: r.request,
            loss: window.sdpa.charts.train.loss.data.datasets[0].data }; })()""")
        check(run["state"] == "done", f"the run ended as done ({run['state']})")
        steps = [p["step"] for p in run["points"]]
        check(steps == list(range(0, 61, 10)), f"streamed evaluation steps 0, 10, ..., 60 ({steps})")
        check(run["loss"] == [{"x": p["step"], "y": p["loss"]} for p in run["points"]],
              "the loss chart holds the streamed points")
        status, snap = request(server, "GET", f"/api/train/run?id={run['id']}")
        check(status == 200 and snap["points"] == run["points"],
              "the streamed curve equals the server's record of the run")
        losses = [p["loss"] for p in run["points"]]
        check(all(isinstance(v, float) for v in losses) and losses[-1] < losses[0],
              f"the loss fell from {losses[0]:.3f} to {losses[-1]:.3f}")
        check(all(0 <= p["accuracy"] <= 1 for p in run["points"]), "accuracies lie in [0, 1]")

        log("training checked")
        # Screenshots: the whole page and each panel.
        await b.eval("window.scrollTo(0, 0)")
        shots = {"page": await b.screenshot(scale=0.3)}
        for panel in ("panel-scores", "panel-softmax", "panel-train", "panel-freeze"):
            box = await b.eval(f"""(() => {{ const r = document.getElementById('{panel}')
                .getBoundingClientRect(); return {{x: r.x + window.scrollX, y: r.y + window.scrollY,
                width: r.width, height: r.height}}; }})()""")
            shots[panel] = await b.screenshot(box)
        for name, png in shots.items():
            path = os.path.join(out_dir, f"serve-{name}.png")
            with open(path, "wb") as fh:
                fh.write(png)
            ok, colours, ink = harness.png_is_not_blank(png)
            check(ok, f"screenshot {name} is not blank ({colours} colours, {ink:.1%} ink): {path}")
        log("screenshots checked")
        errors = [c for c in b.console if c[0] in ("error", "exception")]
        check(not errors, f"no errors in the page's console ({errors[:3]})")
    finally:
        await b.close()


def main():
    chromium = harness.find_chromium()
    if not chromium:
        print("chromium is not installed (scripts/common.sh TEST_PACKAGES has it): skipped")
        sys.exit(77)
    try:
        import websockets  # noqa: F401
    except ImportError:
        print("python3-websockets is not installed: skipped")
        sys.exit(77)
    out_dir = harness.OUT_DIR
    os.makedirs(out_dir, exist_ok=True)
    with harness.Server() as server:
        asyncio.run(asyncio.wait_for(scenario(server, chromium, out_dir), 240))
        check(server.alive(), "the server is still running")
        check(server.stop() == 0, "SIGINT stops the server with status 0")
    finish("serve browser test")


if __name__ == "__main__":
    main()
