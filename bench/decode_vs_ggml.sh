#!/usr/bin/env bash
# Decode against ggml's CPU flash attention, alternating in one run, with the streaming-read
# bandwidth measured between them (the ratios to it are what hold on a shared machine).
#
#   bench/decode_vs_ggml.sh GGML_DIR [SDPA] [ROUNDS]
#
# GGML_DIR: a ggml checkout built CPU-only with its CMake (include/ and build/src/libggml*.so;
# e.g. cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON && cmake --build build
# --target ggml). SDPA: the sdpa binary (default build/sdpa). ROUNDS: default 3. Nothing is
# downloaded; bench/ggml_fa_decode.c is compiled against GGML_DIR into a temporary folder.
# Shape (one Llama-3-8B layer at 32k context): Hq = 32, Hkv = 8, L = 1, S = 32768, E = 128,
# 2 threads; THREADS, HQ, HKV, S, E override it. KV_LENS=a,b,c (with PAGE=N) runs sdpa on a
# paged batch of those lengths instead, and ggml (which has no paged batch) is left out; so
# is it with GGML=0. Prints a Markdown table (medians over the rounds); OUT=FILE keeps the raw
# JSON lines. ggml's worker threads spin while they wait, so its CPU time counts those waits:
# compare ggml by wall time. The three shapes of the decode goals:
#   bench/decode_vs_ggml.sh GGML_DIR build/sdpa 3
#   KV_LENS=500,1000,2000,4000,8000,16000,24000,32768 PAGE=256 bench/decode_vs_ggml.sh GGML_DIR
#   HKV=32 S=8192 bench/decode_vs_ggml.sh GGML_DIR
set -euo pipefail

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  exit $([[ $# -lt 1 ]] && echo 2 || echo 0)
fi
GGML_DIR=$(cd "$1" && pwd)
SDPA=${2:-build/sdpa}
ROUNDS=${3:-3}
THREADS=${THREADS:-2} HQ=${HQ:-32} HKV=${HKV:-8} S=${S:-32768} E=${E:-128}
REPEAT=${REPEAT:-7}
KV_LENS=${KV_LENS:-} PAGE=${PAGE:-0} GGML=${GGML:-1}
SHAPE=(--heads "$HQ" --kv-heads "$HKV" --kv-seq "$S" --dim "$E")
if [[ -n $KV_LENS ]]; then
  SHAPE=(--heads "$HQ" --kv-heads "$HKV" --dim "$E" --kv-lens "$KV_LENS")
  GGML=0
fi
[[ $PAGE == 0 ]] || SHAPE+=(--page-size "$PAGE")
[[ -x $SDPA ]] || { echo "decode_vs_ggml.sh: error: no sdpa binary at $SDPA" >&2; exit 2; }
LIBDIR=$GGML_DIR/build/src
[[ -f $GGML_DIR/include/ggml.h && -e $LIBDIR/libggml.so ]] || {
  echo "decode_vs_ggml.sh: error: expected $GGML_DIR/include/ggml.h and $LIBDIR/libggml.so" >&2
  exit 2
}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
OUT=${OUT:-$TMP/runs.jsonl}
: >"$OUT"
cc -O2 -o "$TMP/ggml_fa_decode" "$HERE/ggml_fa_decode.c" -I"$GGML_DIR/include" -L"$LIBDIR" \
  -lggml -lggml-base -lggml-cpu -lm -Wl,-rpath,"$LIBDIR"

# Extra sdpa configurations, each "label|arguments" (e.g. a half-precision cache).
EXTRA=${EXTRA:-}
for ((r = 1; r <= ROUNDS; ++r)); do
  echo "round $r of $ROUNDS (load: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  "$SDPA" bench --peak --threads "$THREADS" --json |
    sed 's/^{/{"impl":"peak",/' >>"$OUT"
  "$SDPA" bench --kv-cache "${SHAPE[@]}" \
    --threads "$THREADS" --repeat "$REPEAT" --json | sed 's/^{/{"label":"sdpa f32",/' >>"$OUT"
  if [[ $GGML != 0 ]]; then
    "$TMP/ggml_fa_decode" "$HQ" "$HKV" "$S" "$E" f32 "$THREADS" "$REPEAT" |
      sed 's/^{/{"label":"ggml f32",/' >>"$OUT"
    "$TMP/ggml_fa_decode" "$HQ" "$HKV" "$S" "$E" f16 "$THREADS" "$REPEAT" |
      sed 's/^{/{"label":"ggml f16",/' >>"$OUT"
  fi
  IFS=';' read -ra extras <<<"$EXTRA"
  for x in "${extras[@]}"; do
    [[ -n $x ]] || continue
    # shellcheck disable=SC2086
    "$SDPA" bench --kv-cache "${SHAPE[@]}" \
      --threads "$THREADS" --repeat "$REPEAT" --json ${x#*|} |
      sed "s/^{/{\"label\":\"${x%%|*}\",/" >>"$OUT"
  done
done

python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
med = statistics.median
bw = med([r["read_gbps"] for r in rows if r.get("impl") == "peak"]
         + [r["read_gbps"] for r in rows if "read_gbps" in r and r.get("impl") != "peak"])
bw_cpu = med([r["read_gbps_per_cpu_second"] for r in rows if "read_gbps_per_cpu_second" in r])
labels = []
for r in rows:
    if "label" in r and r["label"] not in labels:
        labels.append(r["label"])
stats = {}
for lab in labels:
    rs = [r for r in rows if r.get("label") == lab]
    stats[lab] = dict(t=med([r["seconds_median"] for r in rs]),
                      cpu=med([r["cpu_seconds_median"] for r in rs]),
                      bytes=rs[0]["kv_bytes"])
s32 = stats.get("sdpa f32", {}).get("t")
g32 = stats.get("ggml f32", {}).get("t")
g16 = stats.get("ggml f16", {}).get("t")
print(f"streaming read (median of the runs): {bw:.1f} GB/s wall, {bw_cpu:.1f} GB/s per CPU-second")
print()
print("| | time (median) | CPU time | K/V read rate | % of streaming read | per CPU-second, % of streaming | sdpa f32 time / this | ggml f32 time / this | ggml f16 time / this |")
print("|---|---|---|---|---|---|---|---|---|")
for lab in labels:
    s = stats[lab]
    rate = s["bytes"] / s["t"] * 1e-9
    rate_cpu = s["bytes"] / s["cpu"] * 1e-9
    vs = " | ".join(f"{g / s['t']:.2f}x" if g else "-" for g in (s32, g32, g16))
    print(f"| {lab} | {s['t'] * 1e3:.1f} ms | {s['cpu'] * 1e3:.1f} ms | {rate:.1f} GB/s "
          f"| {100 * rate / bw:.0f}% | {100 * rate_cpu / bw_cpu:.0f}% | {vs} |")
EOF
[[ $OUT == "$TMP"/* ]] || echo "raw runs: $OUT" >&2
