#!/usr/bin/env bash
# Set up everything on Debian 12, build, and run every test (CI runs exactly this).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_missing "${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}"
configure_and_build
echo "== ctest" >&2
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" --timeout 900
# Sanitizer build, fuzzing and valgrind, when present.
if [ -x "$ROOT/scripts/test-hardening.sh" ]; then
  "$ROOT/scripts/test-hardening.sh"
fi
echo "== all tests passed" >&2
