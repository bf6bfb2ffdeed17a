#!/usr/bin/env python3
"""The `sdpa lab` command line: list, one JSON object with --json, Chinese claims with --lang zh,
the same bytes for 1 and 2 threads, other samples for another seed, exit status 2 and a message
naming the argument for bad input, nothing on stderr when it is not a terminal. Runs the binary
in $SDPA; standard library only."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from checks import check, finish  # noqa: E402

SDPA = os.environ.get("SDPA", "sdpa")


def run(*args):
    return subprocess.run([SDPA, "lab", *args], capture_output=True, text=True)



r = run("list")
check(r.returncode == 0, f"lab list exits 0, got {r.returncode}: {r.stderr}")
names = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
check(names == ["softmax", "derive", "variance", "saturation", "temperature", "precision", "train"],
      f"lab list names, got {names}")
r = run("list", "--json")
check(r.returncode == 0 and [e["name"] for e in json.loads(r.stdout)["experiments"]] == names,
      "lab list --json")

# One JSON object, the common form; nothing on stderr (not a terminal: no progress bar).
outs = {}
for threads in ("1", "2"):
    r = run("derive", "--json", "--threads", threads, "--seed", "3")
    check(r.returncode == 0, f"lab derive --threads {threads} exits 0: {r.stderr}")
    check(r.stderr == "", f"lab derive writes nothing on stderr, got {r.stderr!r}")
    check(r.stdout.count("\n") == 1, "lab derive --json prints exactly one line")
    obj = json.loads(r.stdout)
    for key in ("experiment", "seed", "mode", "seconds", "claims", "tables"):
        check(key in obj, f"lab derive --json has {key}")
    check(obj["seed"] == 3 and obj["mode"] == "quick", "seed and mode echoed")
    obj.pop("seconds")
    outs[threads] = json.dumps(obj, sort_keys=True)
check(outs["1"] == outs["2"], "lab derive: 1 and 2 threads give the same JSON (seconds aside)")

r = run("derive", "--json", "--seed", "4")
other = json.loads(r.stdout)
other.pop("seconds")
check(json.dumps(other["tables"], sort_keys=True) != json.dumps(json.loads(outs["1"])["tables"],
                                                                 sort_keys=True),
      "another seed gives other samples")

# Chinese claims, in the article's words.
r = run("softmax", "--lang", "zh")
check(r.returncode == 0 and "梯度几乎无法传播到非最大值的位置" in r.stdout, "lab softmax --lang zh")
r = run("softmax", "--lang", "zh", "--json")
obj = json.loads(r.stdout)
check(obj["lang"] == "zh" and obj["claims"][0]["claim"] == obj["claims"][0]["claim_zh"],
      "--json --lang zh: claim is the Chinese one")
r = run("softmax")
check("verdict:" in r.stdout and "[C2]" in r.stdout, "text output has claims and verdicts")

# Bad input: status 2, a message naming the argument, nothing on stdout.
for args, needle in ((("softmax", "--lang", "fr"), "--lang"),
                     (("softmax", "--threads", "-1"), "--threads"),
                     (("softmax", "--quick", "--full"), "--"),
                     (("nonesuch",), "nonesuch"),
                     (("softmax", "--bogus"), "--bogus"),
                     (("list", "extra"), "extra"),
                     ((), "list"),
                     (("softmax", "--seed", "x"), "--seed"),
                     (("softmax", "--seed"), "--seed: expected UINT"),
                     (("softmax", "--threads"), "got nothing")):
    r = run(*args)
    check(r.returncode == 2, f"lab {' '.join(args)} exits 2, got {r.returncode}")
    check(needle in r.stderr, f"lab {' '.join(args)}: message names {needle}: {r.stderr!r}")
    check(r.stdout == "", f"lab {' '.join(args)} prints nothing on stdout")

for name in names:
    r = run(name, "--help")
    check(r.returncode == 0 and "--seed" in r.stdout and "--full" in r.stdout,
          f"lab {name} --help")

finish("lab CLI")
