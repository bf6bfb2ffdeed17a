#!/usr/bin/env python3
"""End-to-end test of `sdpa report`: writes reports from the lab results in $FIXTURES
(`--from`, so that the test takes seconds, not the minutes of a real run), then checks

- the folder: index.html, report.md, figures/*.svg, data/*.csv and *.json, nothing left behind;
- the page is self-contained: no script, no external URL in any src/href/url(), no <link>/<img>;
- it renders in headless Chromium (driven over --remote-debugging-pipe): no request other than
  the page itself, every figure laid out with a non-zero size and drawn (its screenshot is not
  one flat colour), a full screenshot that is not blank;
- every claim section C1..C8 has a figure and a verdict;
- the data files re-create the figures: each table CSV equals the JSON table row by row, each
  figure's plotted numbers come from the tables it names, and the C4 variance points are exactly
  the variance table's rows;
- bad arguments exit 2 with a message naming the argument, an absent experiment is reported in
  the page, a failing run leaves an existing report untouched, a missing gnuplot is named.

Needs Debian's chromium (scripts/test.sh installs it); fails, naming it, when it is missing.
"""
import base64
import csv
import html.parser
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, finish  # noqa: E402

SDPA = os.environ.get("SDPA", "sdpa")
FIXTURES = os.environ["FIXTURES"]
CLAIMS = [f"C{i}" for i in range(1, 9)]



def run(*args, env=None):
    return subprocess.run([SDPA, *args], capture_output=True, text=True, env=env)


# ---- static checks of the HTML ---------------------------------------------------------------

class PageParser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags = []          # (tag, attrs)
        self.sections = {}      # id -> {"figures": n, "verdicts": n, "svgs": n}
        self.current = None
        self.figure_sources = {}  # figure id -> [csv names linked in its caption]
        self.current_figure = None
        self.in_style = False
        self.style_text = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "section":
            self.current = a.get("id")
            self.sections[self.current] = {"figures": 0, "verdicts": 0, "svgs": 0}
        if tag == "style":
            self.in_style = True
        if self.current:
            if tag == "figure":
                self.sections[self.current]["figures"] += 1
            if tag == "svg":
                self.sections[self.current]["svgs"] += 1
            if tag == "div" and "verdict" in (a.get("class") or "").split():
                self.sections[self.current]["verdicts"] += 1
        if tag == "figure":
            self.current_figure = a.get("id", "")[len("fig-"):]
            self.figure_sources[self.current_figure] = []
        if tag == "a" and self.current_figure is not None:
            href = a.get("href", "")
            name = href[len("data/"):]
            if href.startswith("data/") and not name.startswith("fig-"):
                self.figure_sources[self.current_figure].append(name)

    def handle_endtag(self, tag):
        if tag == "section":
            self.current = None
        if tag == "figure":
            self.current_figure = None
        if tag == "style":
            self.in_style = False

    def handle_data(self, data):
        if self.in_style:
            self.style_text += data


def static_checks(out, text):
    p = PageParser()
    p.feed(text)
    forbidden = {"script", "link", "img", "iframe", "object", "embed", "video", "audio", "source"}
    for tag, attrs in p.tags:
        check(tag not in forbidden, f"the page has a <{tag}> element")
        for k, v in attrs.items():
            if v is None:
                continue
            check(not k.startswith("on"), f"<{tag}> has an event handler {k}")
            if k in ("src", "srcset", "data", "poster", "action", "formaction"):
                check(False, f"<{tag} {k}={v!r}> loads something")
            if k in ("href", "xlink:href"):
                local = v.startswith("#")
                data_file = v.startswith("data/") and os.path.isfile(os.path.join(out, v))
                check(local or data_file, f"<{tag} {k}={v!r}> is neither #local nor a data file")
            if k == "xmlns" or k.startswith("xmlns:"):
                continue  # namespace names, not loads
            if k == "style" or k == "filter" or k == "fill" or k == "clip-path":
                for u in re.findall(r"url\(\s*['\"]?([^'\")]*)", v):
                    check(u.startswith("#"), f"<{tag} {k}> references url({u})")
    for u in re.findall(r"url\(\s*['\"]?([^'\")]*)", p.style_text):
        check(u.startswith("#"), f"the CSS references url({u})")
    check("@import" not in p.style_text, "the CSS has an @import")
    # outside namespace declarations no http(s) or protocol-relative URL appears anywhere
    stripped = re.sub(r'xmlns(:\w+)?="[^"]*"', "", text)
    for m in re.finditer(r"(https?:)?//[a-zA-Z0-9.-]+\.[a-z]{2,}", stripped):
        check(False, f"the page mentions a URL: {m.group(0)}")
    # ids are unique on the page (gnuplot reuses its ids in every figure)
    ids = [a["id"] for _, a in p.tags if a.get("id")]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    check(not dup, f"duplicate ids on the page: {dup[:10]}")
    for c in CLAIMS:
        s = p.sections.get(c)
        if check(s is not None, f"no section {c}"):
            check(s["figures"] >= 1 and s["svgs"] >= 1, f"section {c} has no figure: {s}")
            check(s["verdicts"] >= 1, f"section {c} has no verdict: {s}")
    # the fixtures hold every table (sdpa_lab_tests checks them against the lab's declarations),
    # so every section beyond the article draws its figure: none passes on a "not shown" note
    for sid in ("non-ideal", "freezing", "alternatives", "temperature", "precision", "training",
                "kernel"):
        s = p.sections.get(sid)
        if check(s is not None, f"no section {sid}"):
            check(s["figures"] >= 1 and s["svgs"] >= 1, f"section {sid} has no figure: {s}")
    # every svg has a non-zero size and viewBox
    for tag, a in p.tags:
        if tag == "svg":
            vb = [float(x) for x in a.get("viewbox", "0 0 0 0").split()]
            check(len(vb) == 4 and vb[2] > 0 and vb[3] > 0, f"svg with viewBox {a.get('viewbox')}")
            check(float(a.get("width", 0)) > 0 and float(a.get("height", 0)) > 0,
                  f"svg without a size: {a}")
    return p


# ---- PNG decoding (zlib only) ----------------------------------------------------------------

def png_pixels(data):
    """(width, height, list of pixel tuples) of an 8-bit RGB or RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6), f"PNG depth {depth} colour type {ctype}"
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    pixels = []
    for y in range(h):
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
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                pr = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pr) & 255
        pixels.extend(bytes(line[i:i + 3]) for i in range(0, stride, bpp))
        prev = line
    return w, h, pixels


def not_blank(png, what):
    w, h, px = png_pixels(png)
    counts = {}
    for p in px:
        counts[p] = counts.get(p, 0) + 1
    top = max(counts.values())
    drawn = 1 - top / len(px)
    return check(w > 0 and h > 0 and len(counts) >= 4 and drawn >= 0.005,
                 f"{what}: looks blank ({w}x{h}, {len(counts)} colours, {drawn:.2%} not background)")


# ---- Chromium over the DevTools pipe ---------------------------------------------------------

class Chromium:
    def __init__(self, profile):
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if not exe:
            raise SystemExit("FAIL: Debian's chromium is not installed; the report test renders "
                             "the page with it (apt-get install chromium; scripts/test.sh does)")
        self.to_r, self.to_w = os.pipe()
        self.from_r, self.from_w = os.pipe()

        def fds():
            # via fresh copies: os.pipe() may itself have returned 3 or 4, and dup2 onto the same
            # number would leave the close-on-exec flag set
            a, b = os.dup(self.to_r), os.dup(self.from_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-quic", f"--user-data-dir={profile}",
                "--remote-debugging-pipe", "--window-size=1280,900",
                # nothing may resolve: an external load would fail, and be recorded below
                "--host-resolver-rules=MAP * ~NOTFOUND", "about:blank"]
        self.proc = subprocess.Popen(args, preexec_fn=fds, close_fds=False,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(self.to_r)
        os.close(self.from_w)
        self.buf = b""
        self.next_id = 0
        self.events = []

    def _read(self):
        while b"\0" not in self.buf:
            chunk = os.read(self.from_r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, session=None):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.to_w, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._read()
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]
            self.events.append(m)

    def wait_event(self, method):
        for i, m in enumerate(self.events):
            if m.get("method") == method:
                return self.events.pop(i)
        while True:
            m = self._read()
            if m.get("method") == method:
                return m
            self.events.append(m)

    def close(self):
        try:
            self.call("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


FIGURES_JS = """JSON.stringify({
  figures: [...document.querySelectorAll('figure')].map(f => {
    const s = f.querySelector('svg'); const r = s ? s.getBoundingClientRect() : null;
    return {id: f.id, w: r ? r.width : 0, h: r ? r.height : 0,
            x: r ? r.left + window.scrollX : 0, y: r ? r.top + window.scrollY : 0,
            drawn: s ? s.querySelectorAll('path, text, rect, use').length : 0};
  }),
  height: document.documentElement.scrollHeight,
  resources: performance.getEntriesByType('resource').map(e => e.name)
})"""


def browser_checks(out, profile, lang, shoot_figures=True):
    url = "file://" + os.path.abspath(os.path.join(out, "index.html"))
    b = Chromium(profile)
    try:
        targets = b.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        session = b.call("Target.attachToTarget", {"targetId": page["targetId"],
                                                   "flatten": True})["sessionId"]
        b.call("Network.enable", {}, session)
        b.call("Page.enable", {}, session)
        b.call("Page.navigate", {"url": url}, session)
        b.wait_event("Page.loadEventFired")
        requests = [e["params"]["request"]["url"] for e in b.events
                    if e.get("method") == "Network.requestWillBeSent"]
        check(requests == [url], f"{lang}: the page made requests other than itself: {requests}")
        info = json.loads(b.call("Runtime.evaluate", {"expression": FIGURES_JS,
                                                      "returnByValue": True},
                                 session)["result"]["value"])
        check(not info["resources"], f"{lang}: resources loaded: {info['resources']}")
        check(len(info["figures"]) >= 12, f"{lang}: only {len(info['figures'])} figures laid out")
        for f in info["figures"]:
            if not check(f["w"] >= 200 and f["h"] >= 100 and f["drawn"] > 20,
                         f"{lang}: figure {f['id']} rendered at {f['w']}x{f['h']} "
                         f"with {f['drawn']} elements"):
                continue
            if not shoot_figures:
                continue
            # at a third of the size: lines and labels still leave thousands of coloured pixels,
            # and decoding the PNG in pure Python takes a ninth of the time (~0.2 s, not 2 s)
            shot = b.call("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": f["x"], "y": f["y"], "width": f["w"], "height": f["h"],
                         "scale": 0.33}},
                session)
            not_blank(base64.b64decode(shot["data"]), f"{lang}: figure {f['id']}")
        shot = b.call("Page.captureScreenshot", {
            "format": "png", "clip": {"x": 0, "y": 0, "width": 1280, "height": 900, "scale": 0.5}},
            session)
        png = base64.b64decode(shot["data"])
        with open(os.path.join(profile, f"screenshot-{lang}.png"), "wb") as fh:
            fh.write(png)
        not_blank(png, f"{lang}: the page's first screen")
        check(info["height"] > 5000, f"{lang}: the page is only {info['height']} px tall")
    finally:
        b.close()


# ---- the data files re-create the figures ----------------------------------------------------

def read_csv(path):
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def as_float(text):
    try:
        return float(text)
    except ValueError:
        return None


def same_value(csv_text, json_value):
    if json_value is None:
        return csv_text == ""
    if isinstance(json_value, bool):
        return csv_text == ("true" if json_value else "false")
    if isinstance(json_value, (int, float)):
        return as_float(csv_text) == float(json_value)
    if isinstance(json_value, str):
        return csv_text == json_value
    return json.loads(csv_text) == json_value


def data_checks(out, parser):
    data = os.path.join(out, "data")
    # each table CSV equals its JSON table, row by row and column by column
    tables = 0
    for name in sorted(os.listdir(data)):
        if not name.endswith(".json") or name == "bench.json":
            continue
        exp = name[:-5]
        result = json.load(open(os.path.join(data, name), encoding="utf-8"))
        for tname, rows in result.get("tables", {}).items():
            path = os.path.join(data, f"{exp}-{tname}.csv")
            if not check(os.path.isfile(path), f"no CSV for table {exp}/{tname}"):
                continue
            got = read_csv(path)
            tables += 1
            check(len(got) == len(rows), f"{exp}-{tname}.csv has {len(got)} rows, JSON {len(rows)}")
            for i, (g, r) in enumerate(zip(got, rows)):
                bad = [k for k in r if not same_value(g.get(k, "\x00"), r[k])]
                if not check(not bad, f"{exp}-{tname}.csv row {i} differs in {bad[:3]}: "
                                      f"{[(g.get(k), r[k]) for k in bad[:3]]}"):
                    break
    check(tables >= 10, f"only {tables} table CSVs checked")
    # each figure's numbers come from the tables it names
    for fig, sources in parser.figure_sources.items():
        path = os.path.join(data, f"fig-{fig}.csv")
        if not check(os.path.isfile(path), f"figure {fig} has no data/fig-{fig}.csv"):
            continue
        check(os.path.isfile(os.path.join(out, "figures", fig + ".svg")), f"no figures/{fig}.svg")
        columns = {}
        for src in sources:
            for row in read_csv(os.path.join(data, src)):
                for k, v in row.items():
                    f = as_float(v)
                    if f is not None and not math.isnan(f):
                        columns.setdefault(k, set()).add(f)
        checked = 0
        for row in read_csv(path):
            names = row["columns"].split(";")
            for i, n in enumerate(names):
                v = as_float(row.get(f"c{i}", ""))
                if n in columns and v is not None:
                    checked += 1
                    if not check(v in columns[n], f"figure {fig}: {n} = {v!r} (series "
                                 f"{row['series']!r}) is in none of {sources}"):
                        break
            else:
                continue
            break  # one report per figure is enough
        check(checked > 0, f"figure {fig}: no plotted number could be traced to {sources}")
    # the alternatives figure: one curve per normaliser in each panel (sigma 1 and 4), each point
    # a row of the alternatives table
    alt = read_csv(os.path.join(data, "fig-alternatives.csv"))
    alt_rows = read_csv(os.path.join(data, "saturation-alternatives.csv"))
    check({(r["panel"], r["series"]) for r in alt} ==
          {(p, m) for p in {r["panel"] for r in alt}
           for m in ("1", "1/sqrt(d)", "1/d", "qk-norm", "softcap")} and
          len({r["panel"] for r in alt}) == 2, "alternatives: not five curves in two panels")
    check(len(alt) == len(alt_rows), f"alternatives: {len(alt)} points for {len(alt_rows)} rows")
    # the C4 figure: the normal series is exactly the variance table's normal rows
    fig = [r for r in read_csv(os.path.join(data, "fig-c4-variance.csv")) if r["series"] == "normal"]
    tab = [r for r in read_csv(os.path.join(data, "variance-variance.csv"))
           if r["distribution"] == "normal"]
    check(len(fig) == len(tab) and len(tab) > 0, f"C4: {len(fig)} points, {len(tab)} rows")
    for f, t in zip(fig, tab):
        want = [float(t[k]) for k in ("d", "variance", "variance_ci_low", "variance_ci_high")]
        got = [float(f[f"c{i}"]) for i in range(4)]
        check(got == want, f"C4 point {got} != table row {want}")


# ---- the runs --------------------------------------------------------------------------------

def report(out, *extra, env=None):
    r = run("report", "--from", FIXTURES, "--out", out, *extra, env=env)
    check(r.returncode == 0, f"sdpa report {extra} exited {r.returncode}: {r.stderr}")
    return r


with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "report")
    report(out)
    for f in ("index.html", "report.md"):
        check(os.path.isfile(os.path.join(out, f)), f"no {f}")
    check(sorted(os.listdir(tmp)) == ["report"], f"left behind: {os.listdir(tmp)}")
    text = open(os.path.join(out, "index.html"), encoding="utf-8").read()
    md = open(os.path.join(out, "report.md"), encoding="utf-8").read()
    parser = static_checks(out, text)
    svgs = sorted(os.listdir(os.path.join(out, "figures")))
    check(len(svgs) >= 12, f"only {len(svgs)} figures: {svgs}")
    for s in svgs:
        check(f"](figures/{s})" in md, f"report.md does not show figures/{s}")
        check(f'id="fig-{s[:-4]}"' in text, f"index.html does not show {s}")
    for c in CLAIMS:
        check(f"## {c} " in md, f"report.md has no section {c}")
    check("原文" in text and "Var(cX)" in text, "the article's sentences are missing")
    data_checks(out, parser)
    browser_checks(out, os.path.join(tmp, "profile-en"), "en")

    # --lang zh: the whole page in Chinese
    out_zh = os.path.join(tmp, "report-zh")
    report(out_zh, "--lang", "zh")
    zh = open(os.path.join(out_zh, "index.html"), encoding="utf-8").read()
    check('lang="zh-CN"' in zh and "目录" in zh and "Contents" not in zh,
          "the zh page is not in Chinese")
    static_checks(out_zh, zh)
    browser_checks(out_zh, os.path.join(tmp, "profile-zh"), "zh", shoot_figures=False)

    # Results of a lab run in Chinese: the summary keeps each measurement's first sentence, up to
    # "。", puts the condition in full-width brackets and joins the experiments with "；".
    zh_data, out_zd = os.path.join(tmp, "data-zh"), os.path.join(tmp, "report-zh-data")
    shutil.copytree(FIXTURES, zh_data)
    with open(os.path.join(zh_data, "saturation.json"), encoding="utf-8") as f:
        sat = json.load(f)
    sat["lang"] = "zh"
    for c in sat["claims"]:
        c["verdict"], c["condition"] = "holds-if", "条件甲"
        c["measurement"] = "第一句 3 个单元。第二句不应出现"
    with open(os.path.join(zh_data, "saturation.json"), "w", encoding="utf-8") as f:
        json.dump(sat, f, ensure_ascii=False)
    r = run("report", "--from", zh_data, "--out", out_zd, "--lang", "zh")
    md = open(os.path.join(out_zd, "report.md"), encoding="utf-8").read() if r.returncode == 0 else ""
    row = next((line for line in md.splitlines() if line.startswith("| C7 |")), "")
    check("saturation [quick]: 有条件成立（条件甲） — 第一句 3 个单元；temperature [" in row and
          "第二句" not in row, f"zh measured lines in the summary: exit {r.returncode}, {row[:300]}")
    shutil.rmtree(zh_data)
    shutil.rmtree(out_zd, ignore_errors=True)

    # running again replaces the report as a whole
    before = os.stat(os.path.join(out, "index.html")).st_ino
    report(out)
    after = os.stat(os.path.join(out, "index.html")).st_ino
    check(after != before, "the report was not replaced")
    text = open(os.path.join(out, "index.html"), encoding="utf-8").read()
    check(sorted(os.listdir(tmp)) == ["profile-en", "profile-zh", "report", "report-zh"],
          f"left behind: {sorted(os.listdir(tmp))}")

    # a failing run (a corrupt input) leaves the earlier report untouched and nothing behind
    bad = os.path.join(tmp, "bad")
    shutil.copytree(FIXTURES, bad)
    with open(os.path.join(bad, "variance.json"), "w") as fh:
        fh.write("{not json")
    r = run("report", "--from", bad, "--out", out)
    check(r.returncode != 0 and "variance.json" in r.stderr, f"corrupt input: {r.returncode} {r.stderr}")
    check(os.stat(os.path.join(out, "index.html")).st_ino == after and
          open(os.path.join(out, "index.html"), encoding="utf-8").read() == text,
          "a failed run changed the earlier report")
    shutil.rmtree(bad)
    check(sorted(os.listdir(tmp)) == ["profile-en", "profile-zh", "report", "report-zh"],
          f"left behind after a failure: {sorted(os.listdir(tmp))}")

    # an absent experiment is said in the page, not a crash
    partial = os.path.join(tmp, "partial")
    os.mkdir(partial)
    shutil.copy(os.path.join(FIXTURES, "variance.json"), partial)
    out_p = os.path.join(tmp, "report-partial")
    r = run("report", "--from", partial, "--out", out_p, "--json")
    check(r.returncode == 0, f"partial inputs: exit {r.returncode}: {r.stderr}")
    page = open(os.path.join(out_p, "index.html"), encoding="utf-8").read()
    check("class=\"note\"" in page and "train.json was not found" in page,
          "the page does not say that train is missing")
    missing = json.loads(r.stdout)["missing"]
    check(len(missing) > 0, "--json does not list what is missing")
    check(len(set(missing)) == len(missing), f"--json lists a missing part twice: {missing}")
    check('id="fig-c4-variance"' in page, "the present experiment was not drawn")

    # a page re-rendered from files states the files' seed and mode, not the command line's
    fixture = json.load(open(os.path.join(FIXTURES, "variance.json"), encoding="utf-8"))
    r = run("report", "--from", partial, "--out", out_p, "--seed", "777", "--full")
    md = open(os.path.join(out_p, "report.md"), encoding="utf-8").read()
    check(r.returncode == 0 and f"**seed**: {fixture['seed']}\n" in md and "777" not in md and
          f"sdpa report --{fixture['mode']} --seed {fixture['seed']}" in md,
          "--from: the header and footer do not state the data's seed and mode")
    # a file whose experiment is not the one its name says is refused, naming it
    wrong = os.path.join(tmp, "wrong")
    os.mkdir(wrong)
    shutil.copy(os.path.join(FIXTURES, "variance.json"), os.path.join(wrong, "derive.json"))
    r = run("report", "--from", wrong, "--out", os.path.join(tmp, "report-wrong"))
    check(r.returncode == 2 and "derive.json" in r.stderr and '"variance"' in r.stderr and
          not os.path.exists(os.path.join(tmp, "report-wrong")),
          f"a misnamed lab file: exit {r.returncode}: {r.stderr.strip()}")
    shutil.rmtree(wrong)
    shutil.rmtree(out_p)

    # bad arguments: exit 2, a message naming the argument, nothing written
    fresh = os.path.join(tmp, "fresh")
    afile = os.path.join(tmp, "afile")
    open(afile, "w").close()
    other = os.path.join(tmp, "other")
    os.mkdir(other)
    open(os.path.join(other, "keep.txt"), "w").close()
    for args, word in ((["--lang", "fr"], "--lang"), (["--quick", "--full"], "--quick"),
                       (["--threads", "-3"], "threads"), (["--from", os.path.join(tmp, "nope")], "--from"),
                       (["--seed", "x"], "--seed")):
        r = run("report", "--out", fresh, *args)
        check(r.returncode == 2 and word in r.stderr, f"{args}: exit {r.returncode}: {r.stderr!r}")
        check(not os.path.exists(fresh), f"{args}: wrote {fresh}")
    r = run("report", "--from", FIXTURES, "--out", afile)
    check(r.returncode == 2 and "--out" in r.stderr, f"--out a file: {r.returncode} {r.stderr!r}")
    r = run("report", "--from", FIXTURES, "--out", other)
    check(r.returncode == 2 and "refusing" in r.stderr and os.listdir(other) == ["keep.txt"],
          f"--out a folder of other files: {r.returncode} {r.stderr!r}")

    # no gnuplot: a clear message naming the Debian package, before anything runs
    env = dict(os.environ, PATH="/nonexistent")
    r = run("report", "--from", FIXTURES, "--out", fresh, env=env)
    check(r.returncode != 0 and "gnuplot-nox" in r.stderr and not os.path.exists(fresh),
          f"without gnuplot: exit {r.returncode}: {r.stderr!r}")

finish("report page")
