#!/usr/bin/env bash
# Installs the Debian packages the project needs, once. Idempotent: does nothing
# when every package is already installed. Used by `make test`, `make run` and CI.
set -euo pipefail
packages=(
  build-essential pkg-config
  libcurl4-openssl-dev libjansson-dev   # the native client's libraries
  bubblewrap util-linux                 # namespaces for createos-local guests (bwrap, setpriv, nsenter)
  iproute2 nftables slirp4netns libseccomp2  # each guest's own network (NAT, egress rules) and seccomp filter
  python3 python3-pip procps            # what createos-local's devbox:1 image offers its guests
  clang libclang-rt-14-dev              # libFuzzer harnesses (make fuzz)
  clang-format                          # make format-c (csrc/ in the style of .clang-format)
  ca-certificates
  chromium                              # headless browser check of the canvas (tests/e2e)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
echo "installing system packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
