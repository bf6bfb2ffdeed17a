#!/usr/bin/env bash
# Set up everything on Debian 12 and run the main job: the lab report in quick mode.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_missing "${BUILD_PACKAGES[@]}"
configure_and_build
cd "$ROOT"
"$BUILD/sdpa" report --quick --out "$ROOT/report"
echo "== report written: $ROOT/report/index.html (and report.md)"
