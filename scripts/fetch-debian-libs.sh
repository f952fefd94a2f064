#!/usr/bin/env bash
# Fetches the oldest libcurl and jansson the native client supports, as Debian 11 (bullseye)
# ships them (libcurl 7.74.0, jansson 2.13.1: headers and libraries), plus what those libraries
# load that this machine lacks, and extracts them into DEST/root with dpkg-deb. Everything is
# verified: InRelease against Debian's archive keyring (gpgv), the Packages index against
# InRelease, each .deb against the Packages index (SHA-256). Downloads are cached in DEST;
# a second run does nothing. Used by `make native-oldlibs`.
#
#   scripts/fetch-debian-libs.sh build/oldlibs
#   -> build/oldlibs/root/usr/include/{jansson.h,x86_64-linux-gnu/curl/}
#   -> build/oldlibs/root/usr/lib/x86_64-linux-gnu/{libcurl.so.4,libjansson.so.4,libssl.so.1.1,...}
set -euo pipefail
DEST=${1:?usage: scripts/fetch-debian-libs.sh DEST}
MIRROR=${DEBIAN_MIRROR:-https://deb.debian.org/debian}
SUITE=bullseye
ARCH=amd64
# libcurl4 of bullseye links OpenSSL 1.1 and OpenLDAP 2.4, which Debian 12 no longer has;
# everything else it loads (nghttp2, libssh2, libpsl, librtmp, krb5, ...) keeps its soname.
PACKAGES=(libcurl4 libcurl4-openssl-dev libjansson4 libjansson-dev libssl1.1 libldap-2.4-2)
# Debian's archive keys (package debian-archive-keyring): InRelease carries a signature by
# each current archive key, and gpgv wants to check every one.
KEYRINGS=(/usr/share/keyrings/debian-archive-keyring.gpg)

mkdir -p "$DEST/debs"
DEST=$(cd "$DEST" && pwd)
if [ -f "$DEST/root/.complete" ]; then
  exit 0
fi
for k in "${KEYRINGS[@]}"; do
  [ -f "$k" ] || { echo "missing $k (package debian-archive-keyring)" >&2; exit 1; }
done
fetch() { curl -fsSL --retry 3 -o "$2" "$1"; }

cd "$DEST"
fetch "$MIRROR/dists/$SUITE/InRelease" InRelease.new
gpgv $(printf -- '--keyring %s ' "${KEYRINGS[@]}") --output Release InRelease.new 2>gpgv.log \
  || { cat gpgv.log >&2; echo "InRelease: bad signature" >&2; exit 1; }
mv InRelease.new InRelease

index=main/binary-$ARCH/Packages.xz
want=$(awk -v f="$index" '/^SHA256:/ {s=1; next} /^[^ ]/ {s=0} s && $3 == f {print $1}' Release)
[ -n "$want" ] || { echo "Release lists no $index" >&2; exit 1; }
if [ ! -f Packages.xz ] || [ "$(sha256sum < Packages.xz | cut -d' ' -f1)" != "$want" ]; then
  fetch "$MIRROR/dists/$SUITE/$index" Packages.xz
fi
[ "$(sha256sum < Packages.xz | cut -d' ' -f1)" = "$want" ] || { echo "$index: bad checksum" >&2; exit 1; }
xz -dc Packages.xz > Packages

rm -rf root.new && mkdir root.new
for p in "${PACKAGES[@]}"; do
  read -r file sum version < <(awk -v p="$p" '
    /^Package: / {pkg = $2; file = ""; sum = ""; ver = ""}
    pkg == p && /^Filename: / {file = $2}
    pkg == p && /^SHA256: / {sum = $2}
    pkg == p && /^Version: / {ver = $2}
    /^$/ && pkg == p && file != "" {print file, sum, ver; exit}' Packages)
  [ -n "${file:-}" ] || { echo "$p is not in $SUITE" >&2; exit 1; }
  deb=debs/$(basename "$file")
  if [ ! -f "$deb" ] || [ "$(sha256sum < "$deb" | cut -d' ' -f1)" != "$sum" ]; then
    fetch "$MIRROR/$file" "$deb"
  fi
  [ "$(sha256sum < "$deb" | cut -d' ' -f1)" = "$sum" ] || { echo "$deb: bad checksum" >&2; exit 1; }
  dpkg-deb -x "$deb" root.new
  echo "$p $version"
done
# every library libcurl and jansson load must resolve, from root or from this machine
libdir=root.new/usr/lib/x86_64-linux-gnu
missing=$(LD_LIBRARY_PATH="$libdir" ldd "$libdir/libcurl.so.4" "$libdir/libjansson.so.4" | grep 'not found' || true)
[ -z "$missing" ] || { echo "unresolved libraries:" >&2; echo "$missing" >&2; exit 1; }
rm -rf root && mv root.new root
touch root/.complete
