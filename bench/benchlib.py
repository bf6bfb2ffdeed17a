"""What the table scripts of bench/ share: the CPU's name and flags, running a command that prints
one JSON object, and the options each of them takes."""
import datetime
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def cpu():
    """("<model name>, family <n>", the set of /proc/cpuinfo flags) of the first CPU."""
    model, family, flags = "unknown", "", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model == "unknown":
                model = value.strip()
            elif key == "cpu family" and not family:
                family = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
    return (f"{model}, family {family}" if family else model), flags


def run_json(cmd, env=None):
    """The JSON object `cmd` prints; exits naming the command when it fails."""
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def add_common_options(p, rounds_help):
    p.add_argument("--sdpa", default=os.path.join(HERE, "..", "build", "sdpa"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help=rounds_help)
    p.add_argument("--repeat", type=int, default=3, help="timed runs per side per round")
    p.add_argument("--target", default="",
                   help="SIMD target for sdpa and the peak (e.g. avx2; default: the best)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def check_common_options(args):
    if not os.path.exists(args.sdpa):
        sys.exit(f"--sdpa: expected the sdpa program, {args.sdpa} does not exist")
    if args.threads < 1 or args.rounds < 1 or args.repeat < 1:
        sys.exit("--threads, --rounds, --repeat: expected positive integers")


def run_fields(args, model, peaks):
    """The fields every table's JSON starts with: when, where, how, and the run's FMA peak."""
    return {"date": datetime.date.today().isoformat(), "cpu": model,
            "target": args.target or "best", "load_average": os.getloadavg()[0],
            "threads": args.threads, "rounds": args.rounds, "repeat": args.repeat,
            "peak_gflops_median": statistics.median(peaks), "peaks": peaks}


def print_run_line(result, isa):
    """The table's first line: date, CPU (isa: what it has), target, threads, peak, load."""
    label = f"target {result['target']}, " if result["target"] != "best" else ""
    print(f"{result['date']}, {result['cpu']} ({isa}), {label}{result['threads']} threads, FMA "
          f"peak {result['peak_gflops_median']:.0f} GFLOP/s (median of {len(result['peaks'])}, "
          f"same run), load average {result['load_average']:.1f}")
