#!/usr/bin/env bash
# Builds the libraries the self-contained wheels link statically: OpenSSL, nghttp2, jansson and
# libcurl (HTTP and HTTPS only, HTTP(S) proxies, no SOCKS), from the Debian sources scripts/fetch-debian-sources.py
# unpacked, with `zig cc` for ARCH (x86_64 or aarch64) on glibc 2.28 (manylinux_2_28). Static,
# position-independent, no shared objects. Cached: a second run with the same sources does
# nothing; a library already built for the same sources (and, for curl, the same patch) is kept
# (rm -rf DEPS/ARCH rebuilds all).
#
#   scripts/build-static-deps.sh x86_64 build/deps
#   -> build/deps/x86_64/prefix/{include,lib/{libcurl,libnghttp2,libssl,libcrypto,libjansson}.a}
#   -> build/deps/x86_64/bin/{cc,ar,ranlib}   the zig cc wrappers (used for the extension too)
#
# ZIG: the zig binary (default: the one of the `ziglang` package of $PYTHON, default python3).
# JOBS: parallel jobs (default: nproc).
set -euo pipefail
ARCH=${1:?usage: scripts/build-static-deps.sh x86_64|aarch64 DEPS_DIR}
DEPS=$(mkdir -p "${2:?usage: scripts/build-static-deps.sh ARCH DEPS_DIR}" && cd "$2" && pwd)
GLIBC=2.28
JOBS=${JOBS:-$(nproc)}
case $ARCH in
  x86_64) OPENSSL_TARGET=linux-x86_64 ;;
  aarch64) OPENSSL_TARGET=linux-aarch64 ;;
  *) echo "unsupported ARCH $ARCH (x86_64 or aarch64)" >&2; exit 2 ;;
esac
TRIPLE=$ARCH-linux-gnu
SRC=$DEPS/src
OUT=$DEPS/$ARCH
PREFIX=$OUT/prefix
[ -f "$SRC/VERSIONS" ] || { echo "no $SRC/VERSIONS: run scripts/fetch-debian-sources.py $DEPS" >&2; exit 1; }
PATCHES=$(cd "$(dirname "$0")/patches" && pwd)
inputs="$(cat "$SRC/VERSIONS") glibc $GLIBC"
# what curl is built from besides its sources: a new patch rebuilds curl alone
curl_recipe="no-socks $(sha256sum "$PATCHES/curl-no-socks.patch" | cut -c1-16)"
stamp="$inputs $(sha256sum "$0" | cut -c1-16) $curl_recipe"
if [ -f "$OUT/.complete" ] && [ "$(cat "$OUT/.complete")" = "$stamp" ]; then
  exit 0
fi
if [ ! -f "$OUT/.inputs" ] || [ "$(cat "$OUT/.inputs")" != "$inputs" ]; then
  rm -rf "$OUT"
fi

ZIG=${ZIG:-$("${PYTHON:-python3}" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')}
[ -x "$ZIG" ] || { echo "zig not found ($ZIG): pip install ziglang" >&2; exit 1; }
mkdir -p "$OUT/bin" "$OUT/work" "$PREFIX"
echo "$inputs" >"$OUT/.inputs"
# Wrappers: configure scripts want one word per tool. -O2 always: zig cc turns UBSan traps on
# in unoptimised builds, which belong to no release build.
cat >"$OUT/bin/cc" <<EOF
#!/bin/sh
exec "$ZIG" cc -target $TRIPLE.$GLIBC -fno-sanitize=undefined "\$@"
EOF
printf '#!/bin/sh\nexec "%s" ar "$@"\n' "$ZIG" >"$OUT/bin/ar"
printf '#!/bin/sh\nexec "%s" ranlib "$@"\n' "$ZIG" >"$OUT/bin/ranlib"
chmod +x "$OUT/bin/"*
export CC=$OUT/bin/cc AR=$OUT/bin/ar RANLIB=$OUT/bin/ranlib
export CFLAGS="-O2 -fPIC -ffunction-sections -fdata-sections"
export ZIG_GLOBAL_CACHE_DIR=${ZIG_GLOBAL_CACHE_DIR:-$DEPS/zig-cache}
log() { echo "[$ARCH] $*"; }
fresh() { rm -rf "$OUT/work/$1" && cp -a "$SRC/$1" "$OUT/work/$1" && cd "$OUT/work/$1"; }
# a library is built once per recipe (its sources, and what the second argument names)
built() { [ -f "$OUT/.built-$1" ] && [ "$(cat "$OUT/.built-$1")" = "${2:-}" ]; }
mark() { echo "${2:-}" >"$OUT/.built-$1"; }

# OpenSSL: TLS for libcurl. What the control plane and proxies need stays (TLS 1.2/1.3, the
# usual ciphers, X.509); engines, loadable modules, the legacy provider, QUIC, DTLS, SSLv3 and
# the apps do not. OPENSSLDIR is /etc/ssl, Debian's and Ubuntu's (the CA bundle itself is
# chosen by the extension: csrc/client.c, ca_probe).
if ! built openssl; then
log "openssl"
fresh openssl
./Configure "$OPENSSL_TARGET" --prefix="$PREFIX" --libdir=lib --openssldir=/etc/ssl \
  no-shared no-module no-dso no-engine no-apps no-docs no-tests no-legacy no-comp no-quic \
  no-ssl3 no-dtls no-srp no-gost no-idea no-seed no-md2 no-rc5 no-whirlpool no-mdc2 \
  no-sm2 no-sm3 no-sm4 no-afalgeng no-uplink \
  CC="$CC" AR="$AR" RANLIB="$RANLIB" CFLAGS="$CFLAGS" >configure.log
make -s -j"$JOBS" build_libs >build.log 2>&1 || { tail -40 build.log >&2; exit 1; }
make -s install_dev >>build.log 2>&1
mark openssl
fi

# nghttp2 and jansson ship CMake builds (no configure script in their Debian sources).
CMAKE=${CMAKE:-$(command -v "$(dirname "$(command -v "${PYTHON:-python3}")")/cmake" || command -v cmake || true)}
[ -n "$CMAKE" ] || { echo "cmake not found: pip install cmake" >&2; exit 1; }
cmake_build() {
  "$CMAKE" -S . -B out -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR="$ARCH" \
    -DCMAKE_C_COMPILER="$CC" -DCMAKE_AR="$AR" -DCMAKE_RANLIB="$RANLIB" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="$CFLAGS" -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
    "$@" >configure.log 2>&1 || { tail -40 configure.log >&2; exit 1; }
  "$CMAKE" --build out -j "$JOBS" >build.log 2>&1 || { tail -40 build.log >&2; exit 1; }
  "$CMAKE" --install out >>build.log 2>&1
}

if ! built nghttp2; then
log "nghttp2"
fresh nghttp2
cmake_build -DENABLE_LIB_ONLY=ON -DBUILD_SHARED_LIBS=OFF -DBUILD_STATIC_LIBS=ON -DENABLE_DOC=OFF \
  -DBUILD_TESTING=OFF -DWITH_LIBXML2=OFF -DWITH_JEMALLOC=OFF
mark nghttp2
fi

if ! built jansson; then
log "jansson"
fresh jansson
cmake_build -DJANSSON_BUILD_SHARED_LIBS=OFF -DJANSSON_BUILD_DOCS=OFF -DJANSSON_WITHOUT_TESTS=ON \
  -DJANSSON_EXAMPLES=OFF -DUSE_URANDOM=ON
mark jansson
fi

# libcurl: HTTP(S) with HTTP/2, proxies (HTTP and HTTPS), the threaded resolver; every other
# protocol and optional dependency off. SOCKS is compiled out (patches/curl-no-socks.patch and
# CURL_DISABLE_SOCKS: libcurl's configure has no switch for it short of --disable-proxy, which
# would take the HTTP(S) proxies too): a SOCKS proxy from ALL_PROXY & co is refused
# (CURLE_NOT_BUILT_IN) before any connection. The CA defaults are Debian's; the extension passes
# the bundle it finds (csrc/client.c) or SSL_CERT_FILE / CURL_CA_BUNDLE, to the control plane's
# TLS and to an HTTPS proxy's.
if ! built curl "$curl_recipe"; then
log "curl"
fresh curl
patch -p1 -s --no-backup-if-mismatch <"$PATCHES/curl-no-socks.patch"
PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig PKG_CONFIG_LIBDIR=$PREFIX/lib/pkgconfig CPPFLAGS="-DCURL_DISABLE_SOCKS" \
./configure --host="$TRIPLE" --prefix="$PREFIX" --libdir="$PREFIX/lib" \
  --disable-shared --enable-static --disable-dependency-tracking --with-pic \
  --with-openssl="$PREFIX" --with-nghttp2="$PREFIX" \
  --enable-http --enable-proxy --enable-ipv6 --enable-threaded-resolver --enable-cookies \
  --disable-ftp --disable-file --disable-ldap --disable-ldaps --disable-rtsp --disable-dict \
  --disable-telnet --disable-tftp --disable-pop3 --disable-imap --disable-smb --disable-smtp \
  --disable-gopher --disable-mqtt --disable-ipfs --disable-websockets --disable-manual --disable-docs \
  --disable-ntlm --disable-kerberos-auth --disable-negotiate-auth --disable-aws --disable-netrc \
  --disable-alt-svc --disable-hsts \
  --without-zlib --without-brotli --without-zstd --without-libpsl --without-libidn2 \
  --without-libssh2 --without-libssh --without-librtmp --without-gssapi --without-libgsasl \
  --without-nghttp3 --without-ngtcp2 --without-quiche --without-msh3 \
  --with-ca-bundle=/etc/ssl/certs/ca-certificates.crt --with-ca-path=/etc/ssl/certs \
  LIBS="-lpthread" >configure.log 2>&1 || { tail -40 configure.log >&2; exit 1; }
make -s -j"$JOBS" -C lib >build.log 2>&1 || { tail -40 build.log >&2; exit 1; }
make -s -C lib install >>build.log 2>&1 && make -s -C include install >>build.log 2>&1
install -m 644 libcurl.pc "$PREFIX/lib/pkgconfig/"
mark curl "$curl_recipe"
fi

rm -rf "$OUT/work"
echo "$stamp" >"$OUT/.complete"
log "done: $(ls "$PREFIX/lib"/*.a | xargs -n1 basename | tr '\n' ' ')"
