#!/usr/bin/env bash
# Regenerates the report's test fixtures from a quick lab run at seed 1: one <experiment>.json
# per experiment (`sdpa lab <experiment> --quick --seed 1 --json`) and, with --bench, bench.json
# (the benchmark and accuracy object of a quick report). The schema test (sdpa_lab_tests,
# Schema.ReportFixturesMatchTheDeclarations) fails when these files and the lab disagree.
#
#   tests/report/regenerate_fixtures.sh [--bench] [path/to/sdpa]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bench=0
if [[ "${1:-}" == "--bench" ]]; then
  bench=1
  shift
fi
sdpa="${1:-$here/../../build/sdpa}"
out="$here/fixtures"
mkdir -p "$out"
for e in $("$sdpa" lab list --json | python3 -c 'import json,sys; print(" ".join(e["name"] for e in json.load(sys.stdin)["experiments"]))'); do
  echo "lab $e" >&2
  "$sdpa" lab "$e" --quick --seed 1 --json > "$out/$e.json.tmp"
  mv "$out/$e.json.tmp" "$out/$e.json"
done
if [[ $bench == 1 ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  "$sdpa" report --quick --seed 1 --out "$tmp/report" >&2
  cp "$tmp/report/data/bench.json" "$out/bench.json"
fi
