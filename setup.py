"""Builds the native client `langflow_sandbox_createos._createos` against the
system libcurl and jansson, found through pkg-config.

Environment switches:
  CREATEOS_SANITIZE=1   build with AddressSanitizer + UndefinedBehaviorSanitizer
  CREATEOS_DEBUG=1      build with -O0 -g
  CREATEOS_CFLAGS, CREATEOS_LIBS
                        compiler and linker flags for libcurl and jansson instead of
                        pkg-config's (a build against other copies of the libraries:
                        `make native-oldlibs`)

Supported: libcurl >= 7.74.0, jansson >= 2.13 (docs/native-client.md says what newer
versions add); csrc/common.h refuses older headers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup

PACKAGES_HINT = (
    "The native client needs the libcurl and jansson development headers.\n"
    "  Debian/Ubuntu: sudo apt-get install libcurl4-openssl-dev libjansson-dev pkg-config\n"
    "  Homebrew:      brew install curl jansson pkg-config\n"
    "  Fedora:        sudo dnf install libcurl-devel jansson-devel pkgconf-pkg-config"
)


def pkg_config(*args: str) -> list[str]:
    exe = shutil.which("pkg-config")
    if exe is None:
        sys.exit("error: pkg-config was not found.\n" + PACKAGES_HINT)
    try:
        out = subprocess.run(
            [exe, *args, "libcurl", "jansson"], check=True, capture_output=True, text=True
        ).stdout
    except subprocess.CalledProcessError as exc:
        sys.exit(
            f"error: pkg-config could not find libcurl/jansson ({exc.stderr.strip()}).\n" + PACKAGES_HINT
        )
    return out.split()


def native_extension() -> Extension:
    here = Path(__file__).parent
    sources = sorted(str(p.relative_to(here)) for p in (here / "csrc").glob("*.c"))
    override = os.environ.get("CREATEOS_CFLAGS"), os.environ.get("CREATEOS_LIBS")
    cflags = override[0].split() if override[0] is not None else pkg_config("--cflags")
    libs = override[1].split() if override[1] is not None else pkg_config("--libs")
    extra_compile = ["-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers", *cflags]
    extra_link = [*libs, "-lpthread"]
    if os.environ.get("CREATEOS_DEBUG"):
        extra_compile += ["-O0", "-g"]
    if os.environ.get("CREATEOS_SANITIZE"):
        san = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
        extra_compile += [*san, "-O1", "-g"]
        extra_link += san
    return Extension(
        "langflow_sandbox_createos._createos",
        sources=sources,
        include_dirs=["csrc"],
        extra_compile_args=extra_compile,
        extra_link_args=extra_link,
        define_macros=[("_GNU_SOURCE", "1")],
    )


setup(ext_modules=[native_extension()])
