#!/usr/bin/env bash
# One self-contained wheel for ARCH (x86_64 or aarch64), built from the sdist SDIST with zig cc:
# the extension on the Limited API of CPython 3.10 (cp310-abi3), linked against glibc 2.28
# (manylinux_2_28) and the static libcurl, nghttp2, OpenSSL and jansson that
# scripts/build-static-deps.sh made. The wheel lands in OUTDIR.
#
#   scripts/build-wheel.sh x86_64 dist/langflow_sandbox_createos-0.3.0.tar.gz dist
#
# PYTHON: the Python that runs setuptools (default python3: any CPython >= 3.10 with
# setuptools, wheel and ziglang; its own headers are not used). DEPS: the cache (build/deps).
set -euo pipefail
ARCH=${1:?usage: scripts/build-wheel.sh x86_64|aarch64 SDIST OUTDIR}
SDIST=$(realpath "${2:?usage: scripts/build-wheel.sh ARCH SDIST OUTDIR}")
OUTDIR=$(mkdir -p "${3:?usage: scripts/build-wheel.sh ARCH SDIST OUTDIR}" && cd "$3" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
DEPS=$(mkdir -p "${DEPS:-$ROOT/build/deps}" && cd "${DEPS:-$ROOT/build/deps}" && pwd)
PLAT=manylinux_2_28_$ARCH
case $ARCH in
  x86_64 | aarch64) ;;
  *) echo "unsupported ARCH $ARCH (x86_64 or aarch64)" >&2; exit 2 ;;
esac

"$PYTHON" "$ROOT/scripts/fetch-debian-sources.py" "$DEPS" >/dev/null
PYTHON=$PYTHON "$ROOT/scripts/build-static-deps.sh" "$ARCH" "$DEPS"

work=$DEPS/wheel-$ARCH
rm -rf "$work" && mkdir -p "$work"
tar -xzf "$SDIST" -C "$work"
src=$(echo "$work"/langflow_sandbox_createos-*/)
bin=$DEPS/$ARCH/bin
# The CPython 3.13 headers of the target architecture from Debian (scripts/fetch-debian-sources.py)
# come first: the building Python's own (another version, another architecture) are never read.
pyinc=$DEPS/pyinc/usr/include
(
  cd "$src"
  export CC="$bin/cc" LDSHARED="$bin/cc -shared" AR="$bin/ar"
  export CFLAGS="-I$pyinc/python3.13 -I$pyinc -O2"
  export LDFLAGS="-s"
  export CREATEOS_STATIC_PREFIX=$DEPS/$ARCH/prefix
  export ZIG_GLOBAL_CACHE_DIR=${ZIG_GLOBAL_CACHE_DIR:-$DEPS/zig-cache}
  unset CREATEOS_FULL_API CREATEOS_CFLAGS CREATEOS_LIBS CREATEOS_SANITIZE CREATEOS_DEBUG
  "$PYTHON" setup.py -q bdist_wheel --py-limited-api cp310 --plat-name "$PLAT" -d "$OUTDIR" \
    >"$work/build.log" 2>&1 || { tail -60 "$work/build.log" >&2; exit 1; }
)
wheel=$(ls "$OUTDIR"/langflow_sandbox_createos-*-cp310-abi3-"$PLAT".whl)
rm -rf "$work"
echo "$wheel"
