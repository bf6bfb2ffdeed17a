"""Writes docs/serve.png, the README's picture of `sdpa serve` (run by hand, not by ctest):

    SDPA=build/sdpa /usr/bin/python3 tests/serve/make_screenshot.py docs/serve.png
"""
import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402


async def shoot(server, path):
    b = harness.Browser(harness.find_chromium())
    try:
        await b.connect()
        await b.send("Page.navigate", url=server.url)
        await b.wait_for("window.sdpa && window.sdpa.renders.scores >= 1 && "
                         "window.sdpa.renders.freeze >= 1 && window.sdpa.inflight === 0")
        box = await b.eval("""(() => { const r = document.getElementById('panel-scores')
            .getBoundingClientRect(); return {x: r.x, y: 0, width: r.width,
            height: r.y + r.height + window.scrollY + 8}; })()""")
        with open(path, "wb") as fh:
            fh.write(await b.screenshot(box, scale=0.6))
    finally:
        await b.close()


if __name__ == "__main__":
    with harness.Server() as server:
        asyncio.run(shoot(server, sys.argv[1] if len(sys.argv) > 1 else "docs/serve.png"))
        server.stop()
