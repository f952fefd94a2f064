"""Every call the guest's seccomp filter claims to refuse is refused in a real guest, with the
filter's own answer, on every ABI a guest process can reach.

The list comes from the filter's tables (``BLOCKED``, ``CLONE_NAMESPACE_FLAGS`` in
``local/seccomp.py``), so an entry added there is probed by construction. The call numbers
come from the kernel's headers (``asm/unistd_64.h``, ``unistd_32.h``, ``unistd_x32.h``), not
from libseccomp, which the filter itself uses. The probe (``seccomp_probe.c``) stacks a filter
of its own that answers ``SECCOMP_RET_TRACE`` to the call it makes: with no tracer the call
fails with ``ENOSYS`` before it runs, unless the guest's filter has an action of higher
precedence (``ERRNO``, ``KILL``). So nothing probed ever runs, and the verdict is the guest
filter's: ``EPERM``, death by ``SIGSYS``, or ``ENOSYS`` (let through). The same probes run on
the host first, where every verdict must be the probe's own ``ENOSYS``.
"""

from __future__ import annotations

import errno
import platform
import re
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
from cp_helpers import sh

from langflow_sandbox_createos.local.seccomp import BLOCKED, CLONE_NAMESPACE_FLAGS

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="the probe and the 32-bit ABIs are x86_64's"
)

PROBE_SOURCE = Path(__file__).with_name("seccomp_probe.c")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "local-control-plane.md"
X32_SYSCALL_BIT = 0x40000000
SIGCHLD = 17
NATIVE_GETPID, I386_GETPID, CLONE, CLONE3 = 39, 20, 56, 435
REFUSED = sorted(name for names in BLOCKED.values() for name in names)

Verdict = tuple[str, int]  # ("exit", errno) or ("signal", number)
TRACED: Verdict = ("exit", errno.ENOSYS)  # the probe's own answer: the guest filter let it through
KILLED: Verdict = ("signal", signal.SIGSYS)


def _table(header: str) -> dict[str, int]:
    """The kernel's call numbers for one ABI, from its uapi header (x32's with their bit set)."""
    macros = subprocess.run(
        ["gcc", "-E", "-dM", "-"], input=f"#include <asm/{header}.h>\n", capture_output=True, text=True
    )
    assert macros.returncode == 0, macros.stderr
    table = {}
    for name, value in re.findall(r"#define __NR_(\w+) (.+)", macros.stdout):
        x32 = re.fullmatch(r"\(__X32_SYSCALL_BIT \+ (\d+)\)", value)
        table[name] = X32_SYSCALL_BIT + int(x32.group(1)) if x32 else int(value)
    assert len(table) > 300, (header, len(table))
    return table


@pytest.fixture(scope="module")
def tables() -> dict[str, dict[str, int]]:
    return {
        abi: _table(f"unistd_{suffix}") for abi, suffix in (("native", "64"), ("i386", "32"), ("x32", "x32"))
    }


@pytest.fixture(scope="module")
def probe_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    binary = tmp_path_factory.mktemp("seccomp") / "probe"
    built = subprocess.run(
        ["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(binary), str(PROBE_SOURCE)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    return binary


def _parse(stdout: str, probes: Iterable[str]) -> dict[str, Verdict]:
    seen = {}
    for line in stdout.splitlines():
        spec, kind, number = line.split()
        seen[spec] = (kind, int(number))
    assert list(seen) == list(probes), stdout
    return seen


def on_host(binary: Path, probes: dict[str, str]) -> dict[str, Verdict]:
    done = subprocess.run([str(binary), *probes.values()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    by_spec = _parse(done.stdout, probes.values())
    return {label: by_spec[spec] for label, spec in probes.items()}


def in_guest(
    client: httpx.Client, sandbox_id: str, binary: Path, probes: dict[str, str]
) -> dict[str, Verdict]:
    put = client.put(
        f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/root/probe"}, content=binary.read_bytes()
    )
    assert put.status_code == 200, put.text
    out = sh(client, sandbox_id, "chmod +x /root/probe && exec /root/probe " + " ".join(probes.values()))
    assert out["exit_code"] == 0, out
    by_spec = _parse(out["stdout"], probes.values())
    return {label: by_spec[spec] for label, spec in probes.items()}


def _show(verdicts: dict[str, Verdict], expected: dict[str, Verdict]) -> dict[str, Any]:
    """Only the probes whose verdict differs, each as (seen, expected), errnos by name."""

    def name(v: Verdict) -> str:
        return errno.errorcode.get(v[1], str(v[1])) if v[0] == "exit" else signal.Signals(v[1]).name

    return {k: (name(v), name(expected[k])) for k, v in verdicts.items() if v != expected.get(k)}


def test_every_refused_call_answers_the_filters_errno_in_a_guest(
    client: httpx.Client, sandbox: dict[str, Any], probe_binary: Path, tables: dict[str, dict[str, int]]
) -> None:
    """Each call of ``BLOCKED`` that x86_64 has (54 of 57) answers EPERM in a guest, ``clone``
    with each ``CLONE_NEW*`` flag EPERM, ``clone3`` ENOSYS; ``clone`` without them and ``getpid``
    are let through. A call x86_64 does not have (``stime``, ``vm86``, ``vm86old``) must be an
    i386 one, refused with that ABI (the next test): a misspelt name, which the filter would
    skip, fails here. Fails on ac8509d with io_uring's three calls no longer added to the filter
    (``io_uring_setup`` ENOSYS: let through)."""
    native = tables["native"]
    unknown = [n for n in REFUSED if n not in native and n not in tables["i386"]]
    assert not unknown, f"not a call of x86_64 or i386: {unknown}"
    probes = {name: f"native:{native[name]}:0" for name in REFUSED if name in native}
    probes |= {
        f"clone {flag}": f"clone:{CLONE}:{value | SIGCHLD}" for flag, value in CLONE_NAMESPACE_FLAGS.items()
    }
    probes |= {
        "clone3": f"clone3:{CLONE3}:0",
        "clone": f"clone:{CLONE}:{SIGCHLD}",
        "getpid": f"native:{NATIVE_GETPID}:0",
    }

    # on the host nothing refuses: every call is the probe's ENOSYS, clone3's EINVAL the kernel's
    host_expected = {label: TRACED for label in probes} | {"clone3": ("exit", errno.EINVAL)}
    host = on_host(probe_binary, probes)
    assert host == host_expected, _show(host, host_expected)

    refused: Verdict = ("exit", errno.EPERM)
    expected = {label: refused for label in probes} | {"clone3": ("exit", errno.ENOSYS)}
    expected |= {"clone": TRACED, "getpid": TRACED}
    guest = in_guest(client, sandbox["id"], probe_binary, probes)
    assert guest == expected, _show(guest, expected)


def test_the_i386_and_x32_abis_kill_the_caller_in_a_guest(
    client: httpx.Client, sandbox: dict[str, Any], probe_binary: Path, tables: dict[str, dict[str, int]]
) -> None:
    """The filter is written for x86_64's table, so a call through ``int 0x80`` (i386) or with the
    x32 bit set kills the process: every refused call each ABI has, and an allowed one
    (``getpid``). Fails when the filter answers another ABI's calls instead of killing (a call
    that reached the kernel through the filter would be the probe's ENOSYS)."""
    probes = {f"i386 {n}": f"i386:{tables['i386'][n]}:0" for n in REFUSED if n in tables["i386"]}
    probes |= {f"x32 {n}": f"x32:{tables['x32'][n]}:0" for n in REFUSED if n in tables["x32"]}
    probes |= {
        "i386 getpid": f"i386:{I386_GETPID}:0",
        "x32 getpid": f"x32:{X32_SYSCALL_BIT + NATIVE_GETPID}:0",
    }
    assert len(probes) > 100, len(probes)

    host = on_host(probe_binary, probes)  # the kernel has both ABIs' entry points; nothing refuses
    assert host == dict.fromkeys(probes, TRACED), _show(host, dict.fromkeys(probes, TRACED))
    guest = in_guest(client, sandbox["id"], probe_binary, probes)
    assert guest == dict.fromkeys(probes, KILLED), _show(guest, dict.fromkeys(probes, KILLED))


def test_the_documented_list_is_the_filters() -> None:
    """docs/local-control-plane.md's table names exactly the calls of ``BLOCKED`` (and ``clone``),
    so a call dropped from the table, where the probes above would no longer look, is still
    seen: the docs promise it."""
    text = DOCS.read_text()
    table = text[text.index("| What | Calls |", text.index("## Seccomp filter")) :]
    rows = table[: table.index("\n\n")]
    documented = set(re.findall(r"`(\w+)`", "\n".join(r.split("|")[2] for r in rows.splitlines()[2:])))
    assert documented == {*REFUSED, "clone"}, documented ^ {*REFUSED, "clone"}
