#!/bin/sh
# Installs the built project into a scratch prefix (cmake --install), then builds and runs the
# downstream projects against it, as a user of the installed package would:
#   1. find_package(sdpa): sdpa::sdpa (static) and sdpa::sdpa_shared, default C++ standard;
#   2. pkg-config through CMake's FindPkgConfig (the shared library);
#   3. pkg-config by hand, `pkg-config --static`, linking the static archive with its private
#      dependencies (Requires.private / Libs.private);
# and checks the shared library's SONAME. Usage: run.sh CMAKE BUILD_DIR SOURCE_DIR CXX
set -eu
CMAKE="$1" BUILD="$2" SRC="$3" CXX="$4"
WORK="$BUILD/tests/downstream/work"
PREFIX="$WORK/prefix"
rm -rf "$WORK"
mkdir -p "$WORK"
"$CMAKE" --install "$BUILD" --prefix "$PREFIX" >"$WORK/install.log"
LIBDIR=$(dirname "$(find "$PREFIX" -name sdpa.pc)")/..
LIBDIR=$(cd "$LIBDIR" && pwd)

echo "== SONAME"
SONAME=$(objdump -p "$LIBDIR/libsdpa.so" | awk '/SONAME/ {print $2}')
echo "$SONAME"
case "$SONAME" in libsdpa.so.[0-9]*.[0-9]*) ;; *) echo "unexpected SONAME '$SONAME'"; exit 1 ;; esac
test -e "$LIBDIR/$SONAME"

echo "== find_package(sdpa)"
"$CMAKE" -S "$SRC/tests/downstream/cmake" -B "$WORK/cmake" -DCMAKE_CXX_COMPILER="$CXX" \
  -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release >"$WORK/cmake-configure.log"
"$CMAKE" --build "$WORK/cmake"
"$WORK/cmake/uses_static"
"$WORK/cmake/uses_shared"
# The shared one really loads libsdpa.so, from the scratch prefix.
ldd "$WORK/cmake/uses_shared" | grep -q "$PREFIX.*/$SONAME"

echo "== pkg-config (CMake's FindPkgConfig)"
export PKG_CONFIG_PATH="$LIBDIR/pkgconfig"
"$CMAKE" -S "$SRC/tests/downstream/pkgconfig" -B "$WORK/pkgconfig" -DCMAKE_CXX_COMPILER="$CXX" \
  -DCMAKE_BUILD_TYPE=Release >"$WORK/pkgconfig-configure.log"
"$CMAKE" --build "$WORK/pkgconfig"
"$WORK/pkgconfig/uses_pkgconfig"

echo "== pkg-config --static, by hand"
# -l:libsdpa.a picks the archive although libsdpa.so lies next to it.
LIBS=$(pkg-config --static --libs sdpa | sed 's/-lsdpa\b/-l:libsdpa.a/')
echo "$CXX $(pkg-config --cflags sdpa) main.cpp $LIBS"
# shellcheck disable=SC2086
"$CXX" $(pkg-config --cflags sdpa) "$SRC/tests/downstream/main.cpp" -o "$WORK/uses_static_pc" $LIBS
"$WORK/uses_static_pc"
if ldd "$WORK/uses_static_pc" | grep -q libsdpa; then echo "static link loaded libsdpa.so"; exit 1; fi
echo "downstream: all passed"
