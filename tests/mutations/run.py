"""Break the product on purpose, in a scratch copy, and check that the test meant to catch it fails.

The breaks are data: tests/mutations/mutations.toml, one [[mutation]] each with its edits (file,
anchor, replacement), the test that must fail and the text that says it failed for the right
reason. For each, the repository's tracked files (as in the working tree) and the built
extension are copied to a scratch directory, the edits applied there (never to the checkout),
and the test run alone, with the checkout's .venv. Then every test named runs once on an
unmutated copy, where it must pass (the control). Mutations run one after another, each test in
one pytest process: 2-core friendly. docs/operations.md, "Mutations".

    .venv/bin/python tests/mutations/run.py                  # every mutation, then the controls
    .venv/bin/python tests/mutations/run.py --ci             # the CI subset (ci = true)
    .venv/bin/python tests/mutations/run.py doctor-wrong-range seccomp-io-uring
    .venv/bin/python tests/mutations/run.py --list           # names, tests, what each breaks
    .venv/bin/python tests/mutations/run.py --check          # every anchor applies; no test run
    .venv/bin/python tests/mutations/run.py --tests-from REV # tests/ and pyproject.toml of REV

`make mutations` runs it (MUTATIONS_ARGS passes arguments). Exit status 0 when every mutation
run made its test fail with its `expect` text and every control passed. A mutation marked
`awaits` (its test is written on another branch) runs like the others and is reported with what
the lead must check; `--skip-awaiting` leaves those out. Not collected by pytest (the file name
does not start with test_); tests/unit/test_mutations.py checks the table against the code.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (the test extra installs tomli there)
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
TABLE = Path(__file__).with_name("mutations.toml")
PKG = "langflow_sandbox_createos"
DISTRIBUTION = "langflow-sandbox-createos"


@dataclasses.dataclass(frozen=True)
class Edit:
    path: str  # relative to the repository
    anchor: str  # must occur exactly once
    replacement: str


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    issue: int
    what: str
    test: str  # pytest arguments
    expect: str  # must appear in the failing run's output: it failed for this reason
    edits: tuple[Edit, ...]
    ci: bool = False
    awaits: str = ""
    env: tuple[tuple[str, str], ...] = ()

    @property
    def test_args(self) -> list[str]:
        return shlex.split(self.test)

    @property
    def test_files(self) -> list[str]:
        return [arg.split("::", 1)[0] for arg in self.test_args if not arg.startswith("-")]


def load(path: Path = TABLE) -> list[Mutation]:
    """The table, checked for shape (unknown or missing fields, duplicate names)."""
    with open(path, "rb") as fh:
        rows: list[dict[str, Any]] = tomllib.load(fh)["mutation"]
    known = {f.name for f in dataclasses.fields(Mutation)} | {"edit"}
    mutations = []
    for row in rows:
        unknown = set(row) - known
        if unknown:
            raise SystemExit(f"{path}: mutation {row.get('name')!r} has unknown fields {sorted(unknown)}")
        edits = tuple(Edit(e["path"], e["anchor"], e["replacement"]) for e in row.pop("edit", []))
        if not edits:
            raise SystemExit(f"{path}: mutation {row.get('name')!r} has no [[mutation.edit]]")
        env = tuple(sorted((str(k), str(v)) for k, v in row.pop("env", {}).items()))
        mutations.append(Mutation(**row, edits=edits, env=env))
    names = [m.name for m in mutations]
    if len(set(names)) != len(names):
        raise SystemExit(f"{path}: duplicate mutation names")
    return mutations


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def make_copy(root: Path, tests_from: str | None) -> Path:
    """The repository's tracked files (as in the working tree) and the built extension."""
    for rel in tracked_files():
        src = REPO / rel
        if src.is_file():
            dst = root / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    for so in (REPO / PKG).glob("_createos*.so"):
        shutil.copy2(so, root / PKG / so.name)
    # the distribution's metadata beside the package, as an installed copy has it (doctor reads
    # the version of the copy it runs from there; the checkout's editable install names the
    # checkout, not the copy)
    dist = Path(str(metadata.distribution(DISTRIBUTION)._path))  # type: ignore[attr-defined]
    shutil.copytree(dist, root / dist.name, ignore=shutil.ignore_patterns("direct_url.json", "RECORD"))
    if tests_from:  # tests/ and pytest's configuration (pyproject.toml) of that revision
        shutil.rmtree(root / "tests")
        archive = subprocess.run(
            ["git", "archive", tests_from, "tests", "pyproject.toml"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root


class AnchorMissing(Exception):
    pass


def apply(root: Path, m: Mutation) -> None:
    for edit in m.edits:
        target = root / edit.path
        text = target.read_text()
        count = text.count(edit.anchor)
        if count != 1:
            raise AnchorMissing(f"{edit.path}: the anchor occurs {count} times, not once:\n{edit.anchor}")
        target.write_text(text.replace(edit.anchor, edit.replacement))


def run_tests(
    root: Path, args: list[str], env_extra: dict[str, str], log: Path, stop_first: bool
) -> tuple[int, str, float]:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1", **env_extra}
    where = subprocess.run(
        [sys.executable, "-c", f"import {PKG}; print({PKG}.__file__)"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not where.startswith(str(root)):
        raise SystemExit(f"the copy imports {PKG} from {where}, not from {root}")
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        *(["-x"] if stop_first else []),
        *args,
    ]
    started = time.monotonic()
    with open(log, "w") as fh:
        done = subprocess.run(argv, cwd=root, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False)
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


def check(mutations: list[Mutation]) -> int:
    """Every mutation's edits apply to the checkout's files (in memory) and its test files exist."""
    problems = []
    for m in mutations:
        texts: dict[str, str] = {}
        for edit in m.edits:
            text = texts.get(edit.path)
            if text is None:
                text = (REPO / edit.path).read_text()
            count = text.count(edit.anchor)
            if count != 1:
                problems.append(f"{m.name}: {edit.path}: the anchor occurs {count} times, not once")
                continue
            texts[edit.path] = text.replace(edit.anchor, edit.replacement)
        problems += [f"{m.name}: no test file {f}" for f in m.test_files if not (REPO / f).is_file()]
    for problem in problems:
        print(problem)
    print(f"{len(mutations)} mutations, {len(problems)} problems")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--ci", action="store_true", help="only the CI subset (ci = true)")
    parser.add_argument("--skip-awaiting", action="store_true", help="leave out mutations marked awaits")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--check", action="store_true", help="check that every anchor applies, run nothing")
    parser.add_argument("--tests-from", metavar="REV", help="use tests/ of this git revision")
    parser.add_argument("--no-controls", action="store_true", help="skip the unmutated runs")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copies and logs")
    args = parser.parse_args()
    table = load()
    unknown = set(args.names) - {m.name for m in table}
    if unknown:
        parser.error(f"unknown mutation(s): {', '.join(sorted(unknown))}")
    chosen = [
        m
        for m in table
        if (not args.names or m.name in args.names)
        and (not args.ci or m.ci)
        and not (args.skip_awaiting and m.awaits)
    ]
    if args.list:
        for m in chosen:
            marks = " [ci]" * m.ci + " [awaits]" * bool(m.awaits)
            print(f"{m.name}{marks} (issue {m.issue}): {m.what}\n    {m.test}")
        return 0
    if args.check:
        return check(chosen)
    scratch = Path(tempfile.mkdtemp(prefix="createos-mutations-"))
    rows: list[tuple[str, str, str]] = []
    ok = True
    started = time.monotonic()
    try:
        for m in chosen:
            root = make_copy(scratch / m.name, args.tests_from)
            try:
                apply(root, m)
            except AnchorMissing as exc:
                ok = False
                rows.append((m.name, m.test, "ANCHOR MISSING"))
                print(f"{m.name}: {exc}", flush=True)
                continue
            rc, output, seconds = run_tests(root, m.test_args, dict(m.env), scratch / f"{m.name}.log", True)
            caught = rc not in (0, 4, 5) and m.expect in output
            verdict = (
                "CAUGHT" if caught else ("NOT CAUGHT (passed)" if rc == 0 else f"failed otherwise (rc {rc})")
            )
            ok &= caught
            rows.append((m.name, m.test, f"{verdict} in {seconds:.0f} s"))
            print(f"{m.name}: {m.what}\n  {m.test}: {rows[-1][2]}\n  {first_error(output)}", flush=True)
            if m.awaits:
                print(f"  awaits: {m.awaits}", flush=True)
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
        if not args.no_controls and chosen:
            root = make_copy(scratch / "control", args.tests_from)
            by_env: dict[tuple[tuple[str, str], ...], list[str]] = {}
            for m in chosen:
                by_env.setdefault(m.env, [])
                by_env[m.env] += [a for a in m.test_args if a not in by_env[m.env]]
            for env, tests in by_env.items():
                rc, output, seconds = run_tests(root, tests, dict(env), scratch / "control.log", False)
                verdict = "passed" if rc == 0 else f"FAILED (rc {rc})"
                ok &= rc == 0
                rows.append(("(unmutated)", " ".join(tests), f"{verdict} in {seconds:.0f} s"))
                print(f"unmutated: {' '.join(tests)}: {rows[-1][2]}\n  {first_error(output)}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print(f"scratch copies and logs kept in {scratch}")
    print("\nmutation | test | result")
    for name, test, verdict in rows:
        print(f"{name} | {test} | {verdict}")
    awaiting = [m.name for m in chosen if m.awaits]
    if awaiting:
        print(
            f"\nawaiting their tests from other branches (see `awaits` in {TABLE.name}): {', '.join(awaiting)}"
        )
    print(
        f"\n{len(chosen)} mutations in {time.monotonic() - started:.0f} s: {'all caught' if ok else 'NOT all caught'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
