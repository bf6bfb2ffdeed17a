#!/usr/bin/env bash
# Hardening checks, run by scripts/test.sh after the ordinary test suite (or alone):
#   1. the C++ test suite built with clang's AddressSanitizer + UndefinedBehaviorSanitizer
#      (build-asan) and run;
#   2. each libFuzzer target for SDPA_FUZZ_SECONDS (default 60) seconds (fuzz/run.sh, in the same
#      build-asan, or in build-fuzz when step 1 is left out);
#   3. valgrind memcheck on a small run of each command of the ordinary build's `sdpa`.
# Budget: about 8 minutes on 2 cores from scratch, builds included (docs/guarantees.md has the
# measured split). Environment: SDPA_BUILD_DIR (the ordinary build, default build),
# SDPA_ASAN_BUILD_DIR (default build-asan), SDPA_FUZZ_SECONDS, SDPA_JOBS, and
# SDPA_HARDENING_SKIP="asan fuzz valgrind" (any subset) to leave steps out,
# SDPA_ASAN_GTEST_FILTER (tests left out under ASan, default the memory-measuring ones).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ASAN_BUILD="${SDPA_ASAN_BUILD_DIR:-$ROOT/build-asan}"
FUZZ_SECONDS="${SDPA_FUZZ_SECONDS:-60}"
SKIP=" ${SDPA_HARDENING_SKIP:-} "
start=$SECONDS
step() { echo "== hardening: $1 ($((SECONDS - start)) s so far)" >&2; }

# ---- 1. sanitizers --------------------------------------------------------------------------
if [[ "$SKIP" != *" asan "* ]]; then
  step "AddressSanitizer + UndefinedBehaviorSanitizer build in $ASAN_BUILD (clang)"
  # One clang build serves the tests and the fuzzers (SDPA_BUILD_FUZZERS: the library also
  # carries libFuzzer's coverage counters, which the tests do not notice): the library compiles
  # once instead of twice, about 5 minutes less on 2 cores. clang's UBSan also checks
  # float-to-integer conversions (float-cast-overflow), which GCC's -fsanitize=undefined leaves
  # out. A folder configured with another compiler is configured afresh.
  if [ -f "$ASAN_BUILD/CMakeCache.txt" ] &&
    ! grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang++-14$' "$ASAN_BUILD/CMakeCache.txt"; then
    rm -rf "$ASAN_BUILD"
  fi
  gen=()
  [ -f "$ASAN_BUILD/CMakeCache.txt" ] || gen=(-G Ninja)
  # -O1 -g1: the sanitizers' usual level; a third of -O3's compile time, line numbers in reports.
  CXX=clang++-14 cmake -S "$ROOT" -B "$ASAN_BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DSDPA_SANITIZE=address,undefined \
    -DSDPA_BUILD_FUZZERS=ON -DSDPA_BUILD_PYTHON=OFF -DSDPA_BUILD_BENCH=OFF \
    -DPython_EXECUTABLE=/usr/bin/python3 >/dev/null
  # The library's test programs and the sdpa program the CLI tests run; not the lab's, train's
  # or report's tests (one of them alone takes ~2 minutes under ASan: numerical experiments).
  targets=(sdpa_cli)
  [[ "$SKIP" == *" fuzz "* ]] || targets+=(fuzz_npy fuzz_attention)
  asan_tests=(sdpa_core_tests sdpa_kernel_tests sdpa_decode_tests sdpa_variants_tests sdpa_half_tests
    sdpa_catalogue_tests sdpa_property_tests)
  available="$(ninja -C "$ASAN_BUILD" -t targets all 2>/dev/null)"
  for t in "${asan_tests[@]}" fuzz_npy_replay fuzz_attention_replay; do
    grep -q "^$t:" <<<"$available" && targets+=("$t")
  done
  cmake --build "$ASAN_BUILD" -j "$JOBS" --target "${targets[@]}"
  step "the library's tests under the sanitizers"
  # detect_leaks: LeakSanitizer too. The environment ctest would give: the CLI for the
  # catalogue, the property tests' fixed seed.
  export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  # LLVM's OpenMP runtime (clang's -fopenmp) keeps its thread pool's blocks to the end.
  export LSAN_OPTIONS="suppressions=$ROOT/scripts/lsan-suppressions.txt:print_suppressions=0"
  # Tests that measure memory use cannot pass under ASan (its shadow memory and quarantine add
  # ~100 MiB of resident memory: 172 MiB measured against the kernel test's 96 MiB bound).
  gtest_filter="${SDPA_ASAN_GTEST_FILTER:--*InLinearMemory*}"
  for t in "${asan_tests[@]}"; do
    exe="$(find "$ASAN_BUILD/tests" -type f -name "$t" | head -1)"
    [ -n "$exe" ] || continue
    echo "   $t" >&2
    SDPA_CLI="$ASAN_BUILD/sdpa" RC_PARAMS="seed=20261129 max_success=60" \
      "$exe" --gtest_brief=1 --gtest_filter="$gtest_filter" >"$ASAN_BUILD/$t.log" 2>&1 || {
      tail -n 60 "$ASAN_BUILD/$t.log" >&2
      exit 1
    }
  done
  ctest --test-dir "$ASAN_BUILD" --output-on-failure -j "$JOBS" --timeout 300 \
    -R "^(fuzz_replay_|cli_smoke$)"
  unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
fi

# ---- 2. fuzzing -------------------------------------------------------------------------------
if [[ "$SKIP" != *" fuzz "* ]]; then
  step "fuzzing each target for ${FUZZ_SECONDS} s"
  if [[ "$SKIP" != *" asan "* ]]; then
    SDPA_FUZZ_BUILD_DIR="$ASAN_BUILD" "$ROOT/fuzz/run.sh" "$FUZZ_SECONDS"
  else
    "$ROOT/fuzz/run.sh" "$FUZZ_SECONDS"
  fi
fi

# ---- 3. valgrind ------------------------------------------------------------------------------
if [[ "$SKIP" != *" valgrind "* ]]; then
  step "valgrind memcheck on each command of $BUILD/sdpa"
  SDPA_BIN="$BUILD/sdpa"
  if [ ! -x "$SDPA_BIN" ]; then
    cmake --build "$BUILD" -j "$JOBS" --target sdpa_cli
  fi
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  # Small inputs written without NumPy: (1, 2, 5, 4) query, (1, 2, 7, 4) key, (1, 2, 7, 3) value.
  python3 - "$tmp" <<'EOF'
import struct, sys, random
def save(path, shape, values, descr="<f4", fmt="f"):
    shape_text = "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_text)
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%d%s" % (len(values), fmt), *values))
rng = random.Random(8)
def normal(shape):
    n = 1
    for d in shape: n *= d
    return [rng.gauss(0, 1) for _ in range(n)]
d = sys.argv[1]
save(d + "/q.npy", (1, 2, 5, 4), normal((1, 2, 5, 4)))
save(d + "/k.npy", (1, 2, 7, 4), normal((1, 2, 7, 4)))
save(d + "/v.npy", (1, 2, 7, 3), normal((1, 2, 7, 3)))
save(d + "/do.npy", (1, 2, 5, 3), normal((1, 2, 5, 3)))
save(d + "/m.npy", (5, 7), [rng.random() < 0.7 for _ in range(35)], "|b1", "?")
EOF
  # valgrind 3.19 (Debian 12) cannot decode RDTSCP, which libhwy 1.0.3 executes while it loads
  # (a static initializer calls hwy::platform::TimerResolution through the PLT): every program
  # linked with Highway dies with SIGILL under valgrind. A preloaded stand-in for that one
  # function, which nothing in sdpa uses, lets memcheck run; the kernels themselves are
  # untouched (valgrind reports no AVX-512, so Highway dispatches to AVX2, which it decodes).
  cat >"$tmp/hwy_timer_shim.cpp" <<'SHIM'
#include <cstdint>
namespace hwy::platform {
std::uint64_t TimerResolution() { return 1; }
}  // namespace hwy::platform
SHIM
  c++ -shared -fPIC -O1 "$tmp/hwy_timer_shim.cpp" -o "$tmp/libhwy_timer_shim.so"
  export LD_PRELOAD="$tmp/libhwy_timer_shim.so${LD_PRELOAD:+:$LD_PRELOAD}"
  # definite leaks and memory errors fail the run; OpenMP's thread pool shows as "possibly lost".
  vg=(valgrind --quiet --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite
    --show-leak-kinds=definite)
  runs=(
    "attention --query $tmp/q.npy --key $tmp/k.npy --value $tmp/v.npy --out $tmp/o.npy --lse $tmp/l.npy --mask $tmp/m.npy --causal lower-right --threads 2 --impl fast"
    "attention --query $tmp/q.npy --key $tmp/k.npy --value $tmp/v.npy --out $tmp/o2.npy --impl reference --grad-output $tmp/do.npy --grad-query $tmp/dq.npy --grad-key $tmp/dk.npy --grad-value $tmp/dv.npy"
    "attention --query $tmp/q.npy --key $tmp/k.npy --value $tmp/v.npy --out $tmp/o3.npy --impl fast --grad-output $tmp/do.npy --grad-query $tmp/dq3.npy --grad-key $tmp/dk3.npy --grad-value $tmp/dv3.npy"
    "softmax --logits 1000,10,5 --json"
    "softmax --logits 1e30,-1e30,0,-inf --dtype float32"
  )
  # The other commands, where this build has them, at their smallest settings.
  help="$("$SDPA_BIN" --help)"
  for extra in ${SDPA_VALGRIND_EXTRA:-}; do runs+=("$extra"); done
  # bench measures the machine's FMA peak on every run and report runs the whole lab and
  # benchmark: each takes over ten minutes under valgrind's ~50x slowdown, so only their --help
  # (argument parsing, start-up and exit). The attention runs above cover the kernels bench times.
  grep -qE '^ +bench ' <<<"$help" && runs+=("bench --help")
  grep -qE '^ +lab ' <<<"$help" && runs+=("lab softmax --quick --json")
  grep -qE '^ +report ' <<<"$help" && runs+=("report --help")
  for r in "${runs[@]}"; do
    echo "   valgrind sdpa $r" >&2
    # shellcheck disable=SC2086  # the runs are word lists
    "${vg[@]}" "$SDPA_BIN" $r >/dev/null
  done
  # An error path too: a malformed input must be refused without leaking.
  printf 'not a numpy file' >"$tmp/bad.npy"
  set +e
  "${vg[@]}" "$SDPA_BIN" attention --query "$tmp/bad.npy" --key "$tmp/k.npy" \
    --value "$tmp/v.npy" --out "$tmp/bad_out.npy" 2>/dev/null
  rc=$?
  set -e
  if [ "$rc" -ne 2 ]; then
    echo "valgrind: the refused input gave exit status $rc (expected 2; 99 is a memcheck error)" >&2
    exit 1
  fi
fi
step "all hardening checks passed"
