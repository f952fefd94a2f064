#!/usr/bin/env python3
"""Fetch what the self-contained wheels are built from, from Debian's mirror, verified.

Source packages (Debian 13 "trixie", the newest version in trixie or trixie-security, Debian's
patches applied by ``dpkg-source -x``): OpenSSL, nghttp2, jansson and curl. Binary packages: the
CPython 3.13 headers of each target architecture (libpython3.13-dev, only its headers are used;
the extension is built on the Limited API of 3.10, so any newer headers serve).

Verification, as scripts/fetch-debian-libs.sh does it: InRelease against Debian's archive keyring
(gpgv), each index against InRelease (SHA-256), each file against its index (SHA-256).
Everything is cached under DEST; a second run downloads nothing.

    scripts/fetch-debian-sources.py build/deps
    -> build/deps/src/{openssl,nghttp2,jansson,curl}/   unpacked, patched sources
    -> build/deps/pyinc/usr/include/python3.13/        and .../<triplet>/python3.13/pyconfig.h
    -> build/deps/src/VERSIONS                          what was unpacked
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from functools import cmp_to_key
from pathlib import Path

MIRROR = os.environ.get("DEBIAN_MIRROR", "https://deb.debian.org/debian")
SECURITY = os.environ.get("DEBIAN_SECURITY_MIRROR", "https://deb.debian.org/debian-security")
SUITES = [(MIRROR, "trixie"), (SECURITY, "trixie-security")]
SOURCES = ["openssl", "nghttp2", "jansson", "curl"]
HEADERS = {"amd64": "libpython3.13-dev", "arm64": "libpython3.13-dev"}
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


class Missing(Exception):
    """The mirror does not have a file its index lists (a mirror mid-sync)."""


def fetch(url: str, dest: Path) -> None:
    tmp = dest.with_suffix(dest.suffix + ".part")
    for attempt in range(3):
        try:
            with urllib.request.urlopen(url, timeout=120) as r, open(tmp, "wb") as f:
                shutil.copyfileobj(r, f)
            tmp.rename(dest)
            return
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise Missing(url) from exc
            if attempt == 2:
                sys.exit(f"error: {url}: {exc}")
        except OSError as exc:
            if attempt == 2:
                sys.exit(f"error: {url}: {exc}")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cached(url: str, dest: Path, want: str) -> Path:
    if not dest.exists() or sha256(dest) != want:
        fetch(url, dest)
    if sha256(dest) != want:
        sys.exit(f"error: {dest}: SHA-256 mismatch")
    return dest


def release(base: str, suite: str, cache: Path) -> dict[str, str]:
    """The SHA-256 of every index InRelease lists, once its signature checks out."""
    signed = cache / f"{suite}.InRelease"
    fetch(f"{base}/dists/{suite}/InRelease", signed)
    out = cache / f"{suite}.Release"
    proc = subprocess.run(
        ["gpgv", "--keyring", str(KEYRING), "--output", str(out), str(signed)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.exit(f"error: {suite} InRelease: bad signature\n{proc.stderr}")
    sums: dict[str, str] = {}
    section = False
    for line in out.read_text().splitlines():
        if line.startswith("SHA256:"):
            section = True
        elif not line.startswith(" "):
            section = False
        elif section:
            digest, _size, name = line.split()
            sums[name] = digest
    return sums


def stanzas(text: str) -> list[dict[str, str]]:
    out = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in block.splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields:
            out.append(fields)
    return out


def index(base: str, suite: str, name: str, sums: dict[str, str], cache: Path) -> list[dict[str, str]]:
    if name not in sums:
        sys.exit(f"error: {suite} lists no {name}")
    path = cache / f"{suite}.{name.replace('/', '_')}"
    cached(f"{base}/dists/{suite}/{name}", path, sums[name])
    return stanzas(lzma.decompress(path.read_bytes()).decode())


def newer(a: str, b: str) -> bool:
    return subprocess.run(["dpkg", "--compare-versions", a, "gt", b]).returncode == 0


def candidates(found: list[tuple[str, dict[str, str]]], package: str) -> list[tuple[str, dict[str, str]]]:
    """Every listed version of package, newest first (the next one serves when the mirror lacks
    the files of the newest)."""
    mine = [(base, st) for base, st in found if st.get("Package") == package]
    if not mine:
        sys.exit(f"error: {package} is not in {', '.join(s for _, s in SUITES)}")
    order = cmp_to_key(lambda a, b: 1 if newer(a[1]["Version"], b[1]["Version"]) else -1)
    return sorted(mine, key=order, reverse=True)


def first_available(found: list[tuple[str, dict[str, str]]], package: str, get) -> dict[str, str]:
    for base, st in candidates(found, package):
        try:
            get(base, st)
            return st
        except Missing as exc:
            print(f"note: {exc} is missing from the mirror; trying an older {package}", file=sys.stderr)
    sys.exit(f"error: no version of {package} could be downloaded")


def main() -> None:
    dest = Path(sys.argv[1] if len(sys.argv) > 1 else "build/deps").resolve()
    cache = dest / "downloads"
    cache.mkdir(parents=True, exist_ok=True)
    if not KEYRING.exists():
        sys.exit(f"error: missing {KEYRING} (package debian-archive-keyring)")
    done = dest / "src" / "VERSIONS"
    if done.exists() and (dest / "pyinc" / ".complete").exists():
        print(done.read_text(), end="")
        return

    sources: list[tuple[str, dict[str, str]]] = []
    binaries: dict[str, list[tuple[str, dict[str, str]]]] = {arch: [] for arch in HEADERS}
    for base, suite in SUITES:
        sums = release(base, suite, cache)
        sources += [(base, st) for st in index(base, suite, "main/source/Sources.xz", sums, cache)]
        for arch in HEADERS:
            name = f"main/binary-{arch}/Packages.xz"
            binaries[arch] += [(base, st) for st in index(base, suite, name, sums, cache)]

    src = dest / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    versions = []

    def get_source(base: str, st: dict[str, str]) -> None:
        files = [line.split() for line in st["Checksums-Sha256"].splitlines() if line.strip()]
        for digest, _size, name in files:
            cached(f"{base}/{st['Directory']}/{name}", cache / name, digest)

    for package in SOURCES:
        st = first_available(sources, package, get_source)
        dsc = next(cache / n for n in st["Checksums-Sha256"].split() if n.endswith(".dsc"))
        subprocess.run(
            ["dpkg-source", "--no-check", "-x", str(dsc), str(src / package)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        versions.append(f"{package} {st['Version']}")

    pyinc = dest / "pyinc"
    shutil.rmtree(pyinc, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        for arch, package in HEADERS.items():

            def get_deb(base: str, st: dict[str, str]) -> None:
                cached(f"{base}/{st['Filename']}", cache / Path(st["Filename"]).name, st["SHA256"])

            st = first_available(binaries[arch], package, get_deb)
            subprocess.run(["dpkg-deb", "-x", str(cache / Path(st["Filename"]).name), tmp], check=True)
            versions.append(f"{package}:{arch} {st['Version']}")
        (pyinc / "usr").mkdir(parents=True)
        shutil.copytree(Path(tmp) / "usr" / "include", pyinc / "usr" / "include")
    (pyinc / ".complete").touch()
    done.write_text("".join(v + "\n" for v in versions))
    print(done.read_text(), end="")


if __name__ == "__main__":
    main()
