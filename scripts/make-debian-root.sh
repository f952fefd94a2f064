#!/usr/bin/env bash
# A minimal Debian root for the wheel proofs (tests/packaging/test_foreign_roots.py), made with
# debootstrap from Debian's mirror: variant minbase plus python3, python3-venv, ca-certificates
# and whatever else is named. No compiler and no libcurl/jansson headers: the wheel must bring
# everything. A foreign architecture (arm64 on x86_64) runs under qemu-user-static through
# binfmt_misc (registered here when it is not yet). Cached: a complete root is reused as is; one
# of the same suite and architecture that lacks some of the packages named gets them with apt-get.
#
#   scripts/make-debian-root.sh trixie amd64 build/proof-roots/trixie-amd64
#   scripts/make-debian-root.sh bookworm arm64 build/proof-roots/bookworm-arm64 openssl
#
# Needs root, debootstrap, and for arm64 qemu-user-static and binfmt-support (apt-get install).
set -euo pipefail
SUITE=${1:?usage: scripts/make-debian-root.sh SUITE ARCH DEST [PACKAGE...]}
ARCH=${2:?usage: scripts/make-debian-root.sh SUITE ARCH DEST [PACKAGE...]}
DEST=${3:?usage: scripts/make-debian-root.sh SUITE ARCH DEST [PACKAGE...]}
shift 3
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
include=$(IFS=,; echo "python3,python3-venv,ca-certificates${*:+,$*}")
[ -f "$DEST/.complete" ] && [ "$(cat "$DEST/.complete")" = "$SUITE $ARCH $include" ] && exit 0

foreign=()
if [ "$ARCH" != "$(dpkg --print-architecture)" ]; then
  qemu=$(dpkg-architecture -a "$ARCH" -qDEB_HOST_GNU_CPU 2>/dev/null || echo "$ARCH")
  [ "$qemu" = arm64 ] && qemu=aarch64
  mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  if [ ! -e "/proc/sys/fs/binfmt_misc/qemu-$qemu" ]; then
    command -v update-binfmts >/dev/null || { echo "apt-get install qemu-user-static binfmt-support" >&2; exit 1; }
    update-binfmts --enable "qemu-$qemu"
  fi
  foreign=(--foreign)
fi

# the same suite and architecture, made with fewer packages: add the others
if [ -f "$DEST/.complete" ] && [ "$(cut -d' ' -f1,2 "$DEST/.complete")" = "$SUITE $ARCH" ]; then
  { chroot "$DEST" apt-get update -q && chroot "$DEST" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -q --no-install-recommends ${include//,/ } && chroot "$DEST" apt-get clean; } \
    >>"$DEST.log" 2>&1 || { tail -30 "$DEST.log" >&2; exit 1; }
  echo "$SUITE $ARCH $include" >"$DEST/.complete"
  exit 0
fi

command -v debootstrap >/dev/null || { echo "debootstrap missing: apt-get install debootstrap" >&2; exit 1; }
rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
debootstrap --variant=minbase --arch="$ARCH" --include="$include" "${foreign[@]}" \
  "$SUITE" "$DEST" "$MIRROR" >"$DEST.log" 2>&1 || { tail -30 "$DEST.log" >&2; exit 1; }
if [ ${#foreign[@]} -gt 0 ]; then
  chroot "$DEST" /debootstrap/debootstrap --second-stage >>"$DEST.log" 2>&1 \
    || { tail -30 "$DEST.log" >&2; exit 1; }
fi
chroot "$DEST" apt-get clean
echo "$SUITE $ARCH $include" >"$DEST/.complete"
