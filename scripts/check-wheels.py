#!/usr/bin/env python3
"""Checks the wheels `make dist` made; exits non-zero on the first wrong one.

For every wheel given:
- its file name carries the tags it must: cp310-abi3, and manylinux_2_28 (or older) for x86_64
  or aarch64;
- abi3audit (--strict): the extension uses nothing outside the stable ABI of CPython 3.10;
- auditwheel show: the manylinux tag the extension's symbols allow is no newer than the file
  name's, for the same architecture, and it links no library outside the manylinux policy;
- the extension itself (pyelftools): the ELF machine matches the tag, it needs no GLIBC symbol
  version newer than the tag's, it loads only libc/libpthread/libdl/libm/librt (libcurl,
  nghttp2, OpenSSL and jansson are inside), and it exports PyInit__createos and nothing else.
With --expect ARCH,ARCH... every named architecture must have exactly one wheel.

    scripts/check-wheels.py [--expect x86_64,aarch64] dist/*.whl
"""

from __future__ import annotations

import argparse
import io
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

MACHINES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}
ALLOWED_NEEDED = re.compile(
    r"^(libc\.so\.6|libpthread\.so\.0|libdl\.so\.2|libm\.so\.6|librt\.so\.1|ld-linux.*)$"
)
NAME = re.compile(r"^(?P<dist>[^-]+)-(?P<version>[^-]+)-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")
PLAT = re.compile(r"^manylinux_(?P<major>\d+)_(?P<minor>\d+)_(?P<arch>x86_64|aarch64)$")


def tool(name: str) -> str:
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        sys.exit(f"error: {name} not found (make dist installs it into .venv)")
    return found


def check(wheel: Path) -> tuple[str, list[str], dict[str, str]]:
    problems: list[str] = []
    facts: dict[str, str] = {}
    m = NAME.match(wheel.name)
    if not m:
        return "?", [f"{wheel.name}: not a wheel file name"], facts
    plat = PLAT.match(m["plat"])
    if (m["py"], m["abi"]) != ("cp310", "abi3"):
        problems.append(f"tag {m['py']}-{m['abi']}, not cp310-abi3")
    if not plat or (int(plat["major"]), int(plat["minor"])) > (2, 28):
        problems.append(f"platform {m['plat']}, not manylinux_2_28 (or older) for x86_64/aarch64")
        return "?", problems, facts
    arch, glibc = plat["arch"], (int(plat["major"]), int(plat["minor"]))

    with zipfile.ZipFile(wheel) as z:
        sos = [n for n in z.namelist() if n.endswith(".so")]
        if sos != ["langflow_sandbox_createos/_createos.abi3.so"]:
            problems.append(f"shared objects {sos}, wanted langflow_sandbox_createos/_createos.abi3.so alone")
        if not sos:
            return arch, problems, facts
        elf = ELFFile(io.BytesIO(z.read(sos[0])))
        if elf["e_machine"] != MACHINES[arch]:
            problems.append(f"{sos[0]} is {elf['e_machine']}, the tag says {arch}")
        needed = [t.needed for s in elf.iter_sections() if isinstance(s, DynamicSection)
                  for t in s.iter_tags() if t.entry.d_tag == "DT_NEEDED"]  # fmt: skip
        facts["needs"] = " ".join(needed)
        if bad := [n for n in needed if not ALLOWED_NEEDED.match(n)]:
            problems.append(f"links {bad}: libraries outside the wheel")
        versions = {
            aux.name
            for s in elf.iter_sections()
            if isinstance(s, GNUVerNeedSection)
            for _, auxes in s.iter_versions()
            for aux in auxes
        }
        newest = max(
            (
                tuple(int(x) for x in v[6:].split("."))
                for v in versions
                if re.match(r"^GLIBC_\d+(\.\d+)*$", v)
            ),
            default=(0,),
        )
        facts["newest GLIBC symbol"] = ".".join(map(str, newest))
        if newest > glibc:
            problems.append(f"needs GLIBC_{'.'.join(map(str, newest))}, newer than the tag's {glibc}")
        dynsym = elf.get_section_by_name(".dynsym")
        exported = sorted(
            s.name
            for s in dynsym.iter_symbols()
            if s["st_shndx"] != "SHN_UNDEF" and s["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK") and s.name
        )
        facts["exports"] = " ".join(exported)
        if exported != ["PyInit__createos"]:
            problems.append(
                f"exports {exported[:8]}{'...' if len(exported) > 8 else ''}: only PyInit__createos"
            )

    audit = subprocess.run(
        [tool("abi3audit"), "--strict", "--report", str(wheel)], capture_output=True, text=True
    )
    try:
        report = json.loads(audit.stdout)
        results = report["specs"][str(wheel)]["wheel"]
        violations = sum(len(so["result"]["non_abi3_symbols"]) for so in results)
        mismatches = sum(1 for so in results if so["result"]["is_abi3_baseline_compatible"] is False)
        facts["abi3audit"] = f"{violations} violations, {mismatches} version mismatches"
        if violations or mismatches or audit.returncode:
            problems.append(f"abi3audit: {facts['abi3audit']}\n{audit.stderr}")
    except (ValueError, KeyError, TypeError):
        problems.append(f"abi3audit exited {audit.returncode}: {audit.stdout[-800:]}{audit.stderr[-800:]}")

    show = subprocess.run([tool("auditwheel"), "show", str(wheel)], capture_output=True, text=True)
    text = " ".join(show.stdout.split())
    facts["auditwheel show"] = text
    allowed = re.search(r'consistent with the following platform tag: "([^"]+)"', text)
    if show.returncode or not allowed:
        problems.append(f"auditwheel show exited {show.returncode}: {show.stdout}{show.stderr}")
    else:
        tag = PLAT.match(allowed[1])
        if not tag or tag["arch"] != arch or (int(tag["major"]), int(tag["minor"])) > glibc:
            problems.append(f"auditwheel allows {allowed[1]}, the file name says {m['plat']}")
        if "external shared libraries" in text and "libcurl" in text:
            problems.append("auditwheel: libcurl is an external library")
    return arch, problems, facts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--expect", default="", help="comma-separated architectures that must each have a wheel"
    )
    parser.add_argument("wheels", nargs="+", type=Path)
    args = parser.parse_args()
    failed = False
    arches: list[str] = []
    for wheel in args.wheels:
        arch, problems, facts = check(wheel)
        arches.append(arch)
        print(f"{'FAIL' if problems else 'ok  '} {wheel.name}")
        for k, v in facts.items():
            print(f"     {k}: {v}")
        for p in problems:
            print(f"     !! {p}")
        failed |= bool(problems)
    for want in filter(None, args.expect.split(",")):
        if arches.count(want) != 1:
            print(f"FAIL {arches.count(want)} wheels for {want}, wanted one")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
