# Shared by scripts/main.sh and scripts/test.sh: install what is missing, configure, build.
# Safe to run again: apt is asked only for packages that are not installed, and the build is
# incremental.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${SDPA_BUILD_DIR:-$ROOT/build}"
JOBS="${SDPA_JOBS:-$(nproc)}"

# Debian 12 packages: the build, then what the tests and the report use.
BUILD_PACKAGES=(g++ cmake make ninja-build pkg-config libhwy-dev libcli11-dev nlohmann-json3-dev
  libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev librapidcheck-dev pybind11-dev python3-dev
  python3-numpy python3-pytest libomp-dev libopenblas-dev librandom123-dev gnuplot-nox
  openmpi-bin libopenmpi-dev libcpp-httplib-dev libjs-chart.js)
TEST_PACKAGES=(python3-torch chromium clang-14 clang-format-14 libclang-rt-14-dev valgrind libgoogle-perftools4
  python3-websockets)

install_missing() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "== installing: ${missing[*]}" >&2
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
}

configure_and_build() {
  echo "== configuring and building in $BUILD" >&2
  local gen=()
  [ -f "$BUILD/CMakeCache.txt" ] || gen=(-G Ninja)
  cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DPython_EXECUTABLE=/usr/bin/python3 "$@"
  cmake --build "$BUILD" -j "$JOBS"
}
