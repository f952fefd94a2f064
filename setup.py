"""Builds the native client `langflow_sandbox_createos._createos` against the
system libcurl and jansson, found through pkg-config.

The extension is built on the Limited API of CPython 3.10 (Py_LIMITED_API=0x030A0000): the
module is `_createos.abi3.so` and a wheel is tagged `cp310-abi3`, one wheel for CPython 3.10
and every later version (not for the free-threaded build, which has no stable ABI: there the
build is version-specific).

Environment switches:
  CREATEOS_FULL_API=1   a version-specific build (`_createos.cpython-3XY-*.so`, wheel tag
                        cp3XY-cp3XY) instead of the abi3 one: `make bench-abi3` compares both
  CREATEOS_STATIC_PREFIX=DIR
                        link DIR/lib's static libcurl, nghttp2, OpenSSL and jansson into the
                        extension (scripts/build-static-deps.sh; `make dist`), export nothing
                        but PyInit__createos, and look for the system CA bundle in the places
                        csrc/client.c lists
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
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

PACKAGES_HINT = (
    "The native client needs the libcurl and jansson development headers.\n"
    "  Debian/Ubuntu: sudo apt-get install libcurl4-openssl-dev libjansson-dev pkg-config\n"
    "  Homebrew:      brew install curl jansson pkg-config\n"
    "  Fedora:        sudo dnf install libcurl-devel jansson-devel pkgconf-pkg-config"
)
# What a source build needs, by what is missing: the first failing probe names its packages.
# (A prebuilt wheel needs none of this: pip picks it wherever one matches, docs/operations.md.)
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
BUILD_PROBES = [
    (
        "a C compiler",
        "",
        "  Debian/Ubuntu: sudo apt-get install gcc\n"
        "  Fedora/RHEL:   sudo dnf install gcc\n"
        "  macOS:         xcode-select --install",
    ),
    (
        "the Python headers (Python.h)",
        "#include <Python.h>",
        f"  Debian/Ubuntu: sudo apt-get install python3-dev (or python{PY}-dev)\n"
        f"  Fedora/RHEL:   sudo dnf install python3-devel (or python{PY.replace('.', '')}-devel)",
    ),
    ("the libcurl headers (curl/curl.h)", "#include <curl/curl.h>", PACKAGES_HINT),
    ("the jansson headers (jansson.h)", "#include <jansson.h>", PACKAGES_HINT),
]
# The stable ABI of CPython 3.10: the oldest Python the project supports (requires-python).
LIMITED_API = 0x030A0000
LIMITED_TAG = "cp310"


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


def use_limited_api() -> bool:
    # a free-threaded CPython (3.13t) has no stable ABI
    return not os.environ.get("CREATEOS_FULL_API") and not sysconfig.get_config_var("Py_GIL_DISABLED")


def static_libraries(prefix: str) -> tuple[list[str], list[str]]:
    """Compiler and linker flags for the static libraries scripts/build-static-deps.sh built."""
    lib = Path(prefix) / "lib"
    archives = [lib / f"lib{name}.a" for name in ("curl", "nghttp2", "ssl", "crypto", "jansson")]
    missing = [str(a) for a in archives if not a.exists()]
    if missing:
        sys.exit(f"error: CREATEOS_STATIC_PREFIX: missing {', '.join(missing)}")
    exports = Path(__file__).parent / "csrc" / "exports.map"
    return (
        [f"-I{Path(prefix) / 'include'}", "-DCURL_STATICLIB", "-DCOS_CA_PROBE=1"],
        [*map(str, archives), f"-Wl,--version-script={exports}", "-Wl,--gc-sections", "-ldl"],
    )


def package_version() -> str:
    """The package's version, written once, in langflow_sandbox_createos/__init__.py."""
    text = (Path(__file__).parent / "langflow_sandbox_createos" / "__init__.py").read_text(encoding="utf-8")
    found = re.search(r'^__version__ = "([0-9A-Za-z.+-]+)"$', text, re.M)
    if found is None:
        raise SystemExit('setup.py: no __version__ = "..." line in langflow_sandbox_createos/__init__.py')
    return found.group(1)


def native_extension() -> Extension:
    here = Path(__file__).parent
    sources = sorted(str(p.relative_to(here)) for p in (here / "csrc").glob("*.c"))
    static = os.environ.get("CREATEOS_STATIC_PREFIX")
    override = os.environ.get("CREATEOS_CFLAGS"), os.environ.get("CREATEOS_LIBS")
    if static:
        cflags, libs = static_libraries(static)
    else:
        cflags = override[0].split() if override[0] is not None else pkg_config("--cflags")
        libs = override[1].split() if override[1] is not None else pkg_config("--libs")
    extra_compile = ["-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers", *cflags]
    extra_link = [*libs, "-lpthread"]
    macros = [("_GNU_SOURCE", "1"), ("COS_VERSION", f'"{package_version()}"')]
    if use_limited_api():
        macros.append(("Py_LIMITED_API", f"0x{LIMITED_API:08X}"))
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
        define_macros=macros,
        py_limited_api=use_limited_api(),
    )


class BuildExt(build_ext):
    """Names the missing system packages when the build cannot start (no compiler, no
    Python.h, no libcurl or jansson headers) instead of a raw compiler error; an in-place build
    removes the other build's module (abi3 or version-specific), which would otherwise shadow
    it (CPython tries ``.cpython-3XY-*.so`` before ``.abi3.so``)."""

    def build_extensions(self) -> None:
        self.check_build_environment()
        super().build_extensions()

    def check_build_environment(self) -> None:
        from setuptools.errors import CompileError, ExecError

        ext = self.extensions[0]
        with tempfile.TemporaryDirectory() as tmp:
            for what, include, hint in BUILD_PROBES:
                src = Path(tmp) / "probe.c"
                src.write_text(f"{include}\nint cos_probe(void) {{ return 0; }}\n")
                try:
                    self.compiler.compile(
                        [str(src)],
                        output_dir=tmp,
                        macros=ext.define_macros,
                        include_dirs=[*ext.include_dirs, *self.include_dirs],
                        extra_postargs=[a for a in ext.extra_compile_args if a.startswith(("-I", "-D"))],
                    )
                except (CompileError, ExecError, OSError) as exc:
                    compiler = " ".join(getattr(self.compiler, "compiler_so", [])[:1]) or "cc"
                    sys.exit(
                        f"error: cannot build the native client: {what} missing "
                        f"(compiler: {compiler}; {str(exc).strip()[:300]}).\n"
                        f"Install it, then build again:\n{hint}\n"
                        "Or install a prebuilt wheel: docs/operations.md, Packaging."
                    )

    def run(self) -> None:
        super().run()
        if self.inplace:
            for ext in self.extensions:
                built = Path(self.get_ext_fullpath(ext.name))
                stem = ext.name.rpartition(".")[2]
                for other in built.parent.glob(f"{stem}.*.so"):
                    if other.name != built.name:
                        other.unlink()


options = {"bdist_wheel": {"py_limited_api": LIMITED_TAG}} if use_limited_api() else {}
setup(ext_modules=[native_extension()], cmdclass={"build_ext": BuildExt}, options=options)
