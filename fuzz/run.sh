#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (AddressSanitizer + UndefinedBehaviorSanitizer, in their
# own build folder) and runs each for the given number of seconds, both at once (one core each).
#
#   fuzz/run.sh [SECONDS] [TARGET...]     default: 60 seconds, targets npy and attention
#
# Environment: SDPA_FUZZ_BUILD_DIR (default build-fuzz), CXX (default clang++-14).
# The growing corpus lives in fuzz/corpus-work/<target> (ignored by git; the committed seeds in
# fuzz/corpus/<target> are read too). An input that breaks a target is written to
# $SDPA_FUZZ_BUILD_DIR/artifacts/<target>/; copy it to fuzz/regressions/<target>/ once fixed, and
# the ordinary test run replays it forever (ctest -R fuzz_replay).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_EACH="${1:-60}"
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(npy attention)
BUILD="${SDPA_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
CXX_FUZZ="${CXX:-clang++-14}"
case "$CXX_FUZZ" in *clang*) ;; *) CXX_FUZZ=clang++-14 ;; esac

echo "== fuzz: building in $BUILD with $CXX_FUZZ" >&2
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  # -O1: a third of -O2's compile time and about as many executions per second under ASan.
  CXX="$CXX_FUZZ" cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DSDPA_BUILD_FUZZERS=ON \
    -DSDPA_SANITIZE=address,undefined -DSDPA_BUILD_TESTS=OFF -DSDPA_BUILD_BENCH=OFF \
    -DSDPA_BUILD_PYTHON=OFF >/dev/null
fi
cmake --build "$BUILD" -j "${SDPA_JOBS:-$(nproc)}" --target "${TARGETS[@]/#/fuzz_}"

# -timeout: an input that runs 10 s is a hang (the seeds take milliseconds);
# -rss_limit_mb / -malloc_limit_mb: an input of a few kilobytes that makes the library allocate
# gigabytes is a bug (the .npy reader must never allocate more than the file holds).
status=0
pids=()
for t in "${TARGETS[@]}"; do
  mkdir -p "$ROOT/fuzz/corpus-work/$t" "$BUILD/artifacts/$t"
  (
    "$BUILD/fuzz_$t" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
      -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$t/" \
      "$ROOT/fuzz/corpus-work/$t" "$ROOT/fuzz/corpus/$t" "$ROOT/fuzz/regressions/$t" \
      >"$BUILD/artifacts/$t.log" 2>&1
  ) &
  pids+=($!)
done
for i in "${!TARGETS[@]}"; do
  t="${TARGETS[$i]}"
  if wait "${pids[$i]}"; then
    runs=$(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$BUILD/artifacts/$t.log" |
      grep -o '[0-9]*$' || echo '?')
    cov=$(grep -o 'cov: [0-9]*' "$BUILD/artifacts/$t.log" | tail -1 || true)
    echo "== fuzz_$t: ok, $runs inputs in ${SECONDS_EACH}s, $cov" >&2
  else
    status=1
    echo "== fuzz_$t: FAILED; the log's end and the input that broke it:" >&2
    tail -n 40 "$BUILD/artifacts/$t.log" >&2
    ls -l "$BUILD/artifacts/$t/" >&2
    echo "   reproduce: $BUILD/fuzz_$t <file>; once fixed, copy the file to fuzz/regressions/$t/" >&2
  fi
done
exit $status
