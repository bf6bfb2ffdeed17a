"""Starts and stops what the serve tests need: an `sdpa serve` on a free port, a headless
Chromium driven over the DevTools protocol (python3-websockets), an HTTP client that ignores
proxy settings, and a PNG reader for the screenshots."""
import asyncio
import base64
import http.client
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib

SDPA = os.environ.get("SDPA", "build/sdpa")
OUT_DIR = os.environ.get("SDPA_TEST_OUT", tempfile.gettempdir())


class Server:
    """`sdpa serve --port 0`; the URL is read from its first line of output."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([SDPA, "serve", "--port", "0", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"http://([0-9.]+):(\d+)/", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"sdpa serve printed {line!r}, stderr {self.proc.stderr.read()!r}")
        self.host, self.port = m.group(1), int(m.group(2))
        self.url = f"http://{self.host}:{self.port}/"

    def alive(self):
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGINT, timeout=10):
        """Sends `sig` and returns the exit status (raises if it takes longer than timeout)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def request(server, method, path, body=None, headers=None, timeout=60):
    """(status, parsed JSON or raw bytes) over a fresh connection; no proxy, no path rewriting."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        h = {"Content-Type": "application/json"} if data is not None else {}
        h.update(headers or {})
        conn.request(method, path, body=data, headers=h)
        res = conn.getresponse()
        raw = res.read()
        if res.getheader("Content-Type", "").startswith("application/json"):
            return res.status, json.loads(raw)
        return res.status, raw
    finally:
        conn.close()


def events(server, run_id, headers=None, timeout=120):
    """Reads the run's event stream to its end: (list of point dicts, end dict)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    conn.request("GET", f"/api/train/events?id={run_id}", headers=headers or {})
    res = conn.getresponse()
    if res.status != 200:
        return res.status, json.loads(res.read())
    points, end, event = [], None, None
    while end is None:
        line = res.fp.readline().decode()
        if not line:
            break
        line = line.rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            if event == "point":
                points.append(data)
            elif event == "end":
                end = data
    conn.close()
    return points, end


# ---- PNG ----------------------------------------------------------------------------------


def read_png(data):
    """(width, height, rows of RGB tuples) of an 8-bit RGB or RGBA, non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, [[tuple(r[x * bpp:x * bpp + 3]) for x in range(width)] for r in rows]


def png_is_not_blank(data, min_colors=20, min_ink=0.02):
    """A screenshot shows something: many colours, and a share of pixels far from the most
    common (background) colour. Returns (ok, colours, ink fraction)."""
    w, h, rows = read_png(data)
    counts = {}
    for row in rows[::2]:
        for px in row[::2]:
            counts[px] = counts.get(px, 0) + 1
    bg = max(counts, key=counts.get)
    total = sum(counts.values())
    ink = sum(n for px, n in counts.items() if sum(abs(a - b) for a, b in zip(px, bg)) > 60) / total
    return len(counts) >= min_colors and ink >= min_ink, len(counts), ink


# ---- Chromium over the DevTools protocol --------------------------------------------------


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """A headless Chromium with one page, driven over the DevTools protocol."""

    FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-proxy-server", "--remote-debugging-port=0", "--window-size=1400,1000",
             "--hide-scrollbars", "--mute-audio"]

    def __init__(self, chromium):
        self.profile = tempfile.mkdtemp(prefix="sdpa-serve-chromium-")
        self.proc = subprocess.Popen([chromium, *self.FLAGS, f"--user-data-dir={self.profile}",
                                      "about:blank"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        port = None
        while time.time() < deadline and port is None:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError("chromium exited before listening")
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if m:
                port = int(m.group(1))
        if port is None:
            raise RuntimeError("chromium did not print its DevTools address")
        # Keep draining stderr (dbus warnings) so that chromium never blocks on a full pipe.
        self._drain = asyncio.get_event_loop().run_in_executor(None, self.proc.stderr.read)
        targets = json.loads(_opener.open(f"http://127.0.0.1:{port}/json/list", timeout=30).read())
        page = next(t for t in targets if t["type"] == "page")
        self.ws_url = page["webSocketDebuggerUrl"]
        self.ws = None
        self.next_id = 0
        self.console = []

    async def connect(self):
        import websockets
        self.ws = await websockets.connect(self.ws_url, max_size=None, ping_interval=None)
        self.reader = asyncio.ensure_future(self._read())
        self.pending = {}
        await self.send("Page.enable")
        await self.send("Runtime.enable")

    async def _read(self):
        async for message in self.ws:
            msg = json.loads(message)
            if "id" in msg and msg["id"] in self.pending:
                self.pending.pop(msg["id"]).set_result(msg)
            elif msg.get("method") == "Runtime.consoleAPICalled":
                args = msg["params"]["args"]
                self.console.append((msg["params"]["type"],
                                     " ".join(str(a.get("value", a.get("description"))) for a in args)))
            elif msg.get("method") == "Runtime.exceptionThrown":
                self.console.append(("exception", json.dumps(msg["params"]["exceptionDetails"])[:500]))

    async def send(self, method, **params):
        self.next_id += 1
        fut = asyncio.get_event_loop().create_future()
        self.pending[self.next_id] = fut
        await self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        msg = await asyncio.wait_for(fut, 60)
        if "error" in msg:
            raise RuntimeError(f"{method}: {msg['error']}")
        return msg["result"]

    async def eval(self, expression):
        """The JSON value of a JavaScript expression (awaited if it is a promise)."""
        r = await self.send("Runtime.evaluate", expression=f"JSON.stringify(({expression}))",
                            awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        value = r["result"].get("value")
        return None if value is None else json.loads(value)

    async def wait_for(self, expression, timeout=60, what=None):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if await self.eval(expression):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what or expression}")

    async def click(self, x, y):
        for kind in ("mousePressed", "mouseReleased"):
            await self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left",
                            clickCount=1)

    async def drag(self, x0, y, x1, steps=8):
        await self.send("Input.dispatchMouseEvent", type="mousePressed", x=x0, y=y,
                        button="left", clickCount=1)
        for i in range(1, steps + 1):
            await self.send("Input.dispatchMouseEvent", type="mouseMoved",
                            x=x0 + (x1 - x0) * i / steps, y=y, button="left", buttons=1)
            await asyncio.sleep(0.02)
        await self.send("Input.dispatchMouseEvent", type="mouseReleased", x=x1, y=y,
                        button="left", clickCount=1)

    async def box(self, element_id):
        """The element's box in viewport coordinates, after scrolling it into view."""
        return await self.eval(f"""(() => {{ const e = document.getElementById('{element_id}');
            e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect();
            return {{x: r.x, y: r.y, w: r.width, h: r.height}}; }})()""")

    async def screenshot(self, clip=None, scale=0.5):
        """A PNG of the page, or of `clip` (x, y, width, height in CSS pixels), at `scale`
        (half size by default: the pure-Python PNG reader stays fast)."""
        if clip is None:
            clip = await self.eval("""({x: 0, y: 0, width: document.documentElement.scrollWidth,
                height: document.documentElement.scrollHeight})""")
        params = {"format": "png", "captureBeyondViewport": True, "clip": dict(clip, scale=scale)}
        r = await self.send("Page.captureScreenshot", **params)
        return base64.b64decode(r["data"])

    async def close(self):
        try:
            if self.ws:
                await self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.profile, ignore_errors=True)
