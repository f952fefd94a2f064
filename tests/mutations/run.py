"""Break the product on purpose, in a scratch copy, and check that the test meant to catch it fails.

Issue 32 found four tests that passed on a broken product. For each, a small deliberate break
(a mutation) of the product, applied to a copy of this repository, never to the checkout:

    mutation            product file                            test that must fail
    reuse-fails         component/engine.py                     tests/reliability/test_soak.py
    backend-leak        backend/engine.py                       tests/reliability/test_soak.py
    guests-see-roots    local/jailer.py                         tests/local/test_isolation.py::test_guests_cannot_see_each_other_or_server_state
    admin-faulted       local/faults.py                         tests/local/test_faults.py::test_admin_routes_are_not_faulted
    refused-create-row  local/faults.py                         tests/reliability/test_list_memory.py

Each test also runs once on an unmutated copy, where it must pass. Usage (from the repository,
with its .venv built by `make native`):

    .venv/bin/python tests/mutations/run.py                 # every mutation, then the controls
    .venv/bin/python tests/mutations/run.py backend-leak    # some of them
    .venv/bin/python tests/mutations/run.py --tests-from REV   # tests/ and pyproject.toml of
                                                            # REV (e.g. before issue 32) instead

The soak runs for SOAK_SECONDS (60 unless set) in each copy. Exit status 0 when every mutation
made its test fail for the stated reason and every control passed. Not collected by pytest
(the file name does not start with test_); about 8 minutes on a loaded 2-core machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = "langflow_sandbox_createos"

SOAK = "tests/reliability/test_soak.py"
ISOLATION = "tests/local/test_isolation.py::test_guests_cannot_see_each_other_or_server_state"
ADMIN = "tests/local/test_faults.py::test_admin_routes_are_not_faulted"
LIST_MEMORY = "tests/reliability/test_list_memory.py"


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    path: str  # relative to the repository
    anchor: str  # must occur exactly once
    replacement: str
    test: str
    expect: str  # must appear in the failing run's output: it failed for this reason


MUTATIONS = [
    Mutation(
        "reuse-fails",
        "every Guest Reuse run that finds its guest fails (the first run, which creates it, works),"
        " with a message a real fault could give",
        f"{PKG}/component/engine.py",
        '    sandbox_id = str(record["id"])\n    wanted_pause = int(spec["auto_pause_after_seconds"])\n',
        '    sandbox_id = str(record["id"])\n'
        "    if reused:  # MUTATION\n"
        "        raise SandboxExecutionError(\n"
        '            f"CreateOS: could not find or create the reused guest {name} within 20 s; retry later."\n'
        "        )\n"
        '    wanted_pause = int(spec["auto_pause_after_seconds"])\n',
        SOAK,
        "roles that did not mostly succeed: {'component-reuse'",
    ),
    Mutation(
        "backend-leak",
        "every backend run leaks 24 KiB",
        f"{PKG}/backend/engine.py",
        "        del session\n        config = _read_settings()\n",
        "        del session\n"
        "        _MUTATION_LEAK.append(bytearray(24 * 1024))  # MUTATION\n"
        "        config = _read_settings()\n",
        SOAK,
        "the heap in use grew",
    ),
    Mutation(
        "guests-see-roots",
        "every guest sees the server's state dir, and in it every other guest's root",
        f"{PKG}/local/jailer.py",
        '        argv += ["--bind", str(req.layout.fs), "/", "--proc", "/proc", "--dev", "/dev"]\n',
        '        argv += ["--bind", str(req.layout.fs), "/", "--proc", "/proc", "--dev", "/dev"]\n'
        '        argv += ["--ro-bind", str(self.state_dir), str(self.state_dir)]  # MUTATION\n',
        ISOLATION,
        "AssertionError: {'stdout': '== workspace ==",  # the probe's output, not a timeout
    ),
    Mutation(
        "admin-faulted",
        "/_local/stats answers the injected faults like a /v1 route",
        f"{PKG}/local/faults.py",
        '        "exec_stream",\n    }\n)',
        '        "exec_stream",\n        "local_stats",  # MUTATION\n    }\n)',
        ADMIN,
        "assert stats.status_code == 200",
    ),
    Mutation(
        "refused-create-row",
        "1 in 20 creates refused by an injected status still makes its guest",
        f"{PKG}/local/faults.py",
        "        if answer is not None:\n            await self._answer(answer, scope, receive, send)\n",
        "        if answer is not None:\n"
        '            if route == "create" and answer.status and random.random() < 0.05:  # MUTATION\n'
        "\n"
        "                async def _discard(message: Message) -> None:\n"
        "                    return None\n"
        "\n"
        "                await self.app(scope, receive, _discard)\n"
        "            await self._answer(answer, scope, receive, send)\n",
        LIST_MEMORY,
        "assert client.list(prefix=name) == []",
    ),
]
# module-level state a mutation needs, inserted after the anchor
PRELUDE = {"backend-leak": ("GUEST_TIMEOUT_STATUS = 124\n", "_MUTATION_LEAK: list[bytearray] = []\n")}


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def make_copy(scratch: Path, tests_from: str | None) -> Path:
    """The repository's tracked files (as in the working tree) and the built extension."""
    root = scratch / "repo"
    for rel in tracked_files():
        src = REPO / rel
        if src.is_file():
            dst = root / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    for so in (REPO / PKG).glob("_createos*.so"):
        shutil.copy2(so, root / PKG / so.name)
    if tests_from:  # tests/ and pytest's configuration (pyproject.toml) of that revision
        shutil.rmtree(root / "tests")
        archive = subprocess.run(
            ["git", "archive", tests_from, "tests", "pyproject.toml"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
        for name in ("mutations",):  # this script, if REV has it, is not needed there
            shutil.rmtree(root / "tests" / name, ignore_errors=True)
    return root


def replace_once(path: Path, anchor: str, replacement: str) -> None:
    text = path.read_text()
    count = text.count(anchor)
    if count != 1:
        raise SystemExit(f"{path}: the mutation's anchor occurs {count} times, not once:\n{anchor}")
    path.write_text(text.replace(anchor, replacement))


def apply(root: Path, m: Mutation) -> None:
    target = root / m.path
    replace_once(target, m.anchor, m.replacement)
    if m.name in PRELUDE:
        after, line = PRELUDE[m.name]
        replace_once(target, after, after + line)


def run_test(root: Path, test: str, log: Path) -> tuple[int, str, float]:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    env.setdefault("SOAK_SECONDS", "60")
    check = subprocess.run(
        [sys.executable, "-c", f"import {PKG}; print({PKG}.__file__)"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not check.startswith(str(root)):
        raise SystemExit(f"the copy imports {PKG} from {check}, not from {root}")
    started = time.monotonic()
    with open(log, "w") as fh:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", test],
            cwd=root,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            check=False,
        )
    return done.returncode, log.read_text(errors="replace"), time.monotonic() - started


def first_error(output: str) -> str:
    """The failing line and the first line of its error (an assertion preferred)."""
    source = ""
    candidates: list[str] = []
    for line in output.splitlines():
        if line.startswith(">"):
            source = line[1:].strip()
        elif line.startswith("E ") and line[1:].strip():
            candidates.append(f"{source} -> {line[1:].strip()}" if source else line[1:].strip())
    preferred = [c for c in candidates if "AssertionError" in c or "Failed:" in c or "assert " in c]
    return ((preferred or candidates or [""])[0])[:300]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--tests-from", metavar="REV", help="use tests/ of this git revision")
    parser.add_argument("--no-controls", action="store_true", help="skip the unmutated runs")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copies and logs")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if not args.names or m.name in args.names]
    unknown = set(args.names) - {m.name for m in MUTATIONS}
    if unknown:
        parser.error(f"unknown mutation(s): {', '.join(sorted(unknown))}")
    scratch = Path(tempfile.mkdtemp(prefix="createos-mutations-"))
    rows: list[tuple[str, str, str, str]] = []
    ok = True
    try:
        for m in chosen:
            root = make_copy(scratch / m.name, args.tests_from)
            apply(root, m)
            rc, output, seconds = run_test(root, m.test, scratch / f"{m.name}.log")
            caught = rc not in (0, 4, 5) and m.expect in output
            verdict = (
                "CAUGHT" if caught else ("NOT CAUGHT (passed)" if rc == 0 else f"failed otherwise (rc {rc})")
            )
            ok &= caught
            rows.append((m.name, m.test, f"{verdict} in {seconds:.0f} s", first_error(output)))
            print(f"{m.name}: {m.what}\n  {m.test}: {rows[-1][2]}\n  {rows[-1][3]}", flush=True)
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
        if not args.no_controls:
            for test in dict.fromkeys(m.test for m in chosen):
                root = make_copy(scratch / "control", args.tests_from)
                rc, output, seconds = run_test(
                    root, test, scratch / f"control-{Path(test.split('::')[0]).stem}.log"
                )
                verdict = "passed" if rc == 0 else f"FAILED (rc {rc})"
                ok &= rc == 0
                rows.append(("(unmutated)", test, f"{verdict} in {seconds:.0f} s", first_error(output)))
                print(f"unmutated: {test}: {rows[-1][2]}\n  {rows[-1][3]}", flush=True)
                shutil.rmtree(root, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print(f"scratch copies and logs kept in {scratch}")
    print("\nmutation | test | result")
    for name, test, verdict, _ in rows:
        print(f"{name} | {test} | {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
