#!/usr/bin/env python3
"""Size, shape and concept counts of a checkout, measured the same way before and after a redesign.

    scripts/code_metrics.py [ROOT] [--rev REV] [--json]

ROOT is a checkout (default: the repository this script sits in). With --rev REV the files of
that commit are measured (`git -C ROOT archive REV` into a temporary folder), so a working
tree's uncommitted changes do not count; without it the working tree is measured as it is.
Stdlib only; it also runs the `duplicates` command when one is on PATH (section 4). It reads
files, runs none of them and writes nothing but its report to stdout.

Works on the flat layout (langflow_sandbox_createos/*.py) and on a foldered one (core/,
backend/, ...): every rule below looks at file contents, not at file names, except where said.

Rules (also printed, short, in the report)
------------------------------------------
Paths are relative to the package folder langflow_sandbox_createos/ unless they start with
csrc/ or another top-level name. "Lines" are physical lines (what `wc -l` counts).

1. Modules per folder: every *.py under the package, folder = first directory level below it,
   the package's own files as "(root)". .pyi stubs, JSON and other data are not counted.
2. Longest Python functions: every def/async def, nested ones and methods included (a nested
   function also counts inside its parent), lines from the `def` line (decorators not counted)
   to end_lineno; named path:qualname (Class.method, outer.inner). C: csrc/*.c (not
   csrc/fuzz/), comments, strings and preprocessor lines blanked, then a brace scan: a `{` at
   depth 0 whose header ends in `)` and has no `=` opens a function; lines from the header's
   first line to the matching `}`.
3. Import circles: an edge A -> B for every import in A that names package module B, absolute
   (`langflow_sandbox_createos.x`) or relative; `from P import n` goes to P.n when that is a
   module, else to P. No implicit edge to parent packages (importing P.x runs P/__init__
   first, but counting that would make every __init__ that imports a submodule a circle with
   it): a package's __init__ is in a circle only when a module really imports a name from it.
   Each edge is `eager` (module level), `lazy` (inside a function) or `type-only` (under `if
   TYPE_CHECKING:`). Strongly connected components (Tarjan) of more than one module are
   reported with every edge inside them, once over all edges and once over eager edges only
   (an eager circle is one that import order can break). The C extension (_createos: a .so or
   .pyi, no .py) is no node. importlib.import_module is not seen.
4. duplicates: `duplicates --repo DIR --most 200 --seconds 120` on the package, csrc/ and
   tests/ separately; the count is the number of pairs its first line states.
5. Concept carriers; each count lists its file:line places. guest/ (runs inside the microVM)
   and local/ (createos-local, the stand-in control plane, whose records carry the same field
   names as requests) are left out of (a)-(c): any path with a folder named guest or local.
   (a) create-sandbox spec builders: a function (or module level) holding a dict display
       whose keys include "shape", "rootfs" and "auto_pause_after_seconds" (the fields every
       create request carries), plus a function that calls super().NAME() where NAME is the
       name of a function found by the first rule (an override that edits the spec).
   (b) grace constants: an assignment at module or class level to a name containing GRACE;
       listed per name (EXEC_GRACE_SECONDS is the exec-timeout grace; cli.py's
       ACTIVE_GRACE_SECONDS is an age threshold for cleanup, shown apart).
   (c) API key: reads = calls of a function named api_key with no arguments (settings.api_key())
       plus the strings "CREATEOS_API_KEY"/"CREATEOS_SANDBOX_API_KEY" used as a call argument,
       a subscript being read, or an element of what a for/comprehension iterates (not when
       only compared or collected into a set); digests = a call of a hashlib function (or
       hmac/blake2*/sha* imported from hashlib) whose arguments mention a name ending in "key",
       or a call of api_key(); places = the enclosing function.
   (d) version strings: the version in pyproject.toml's [project] table, found as a string
       literal in pyproject.toml, setup.py, createos_langflow.py, the package's .py/.pyi/.json
       files and csrc/ (tests, docs and benchmarks are not shipped code). "defined" = the
       literal is the whole value of something named *version* (Python assignment, TOML key,
       C #define, a top-level JSON key); every other occurrence (inside a longer string, a
       nested JSON key such as a saved flow's metadata) is "embedded".
   (e) places that create a guest: a call of a method named create on an expression whose
       source text ends in "client" (the native client's POST /v1/sandboxes), or of run_program
       on one without a sandbox_id keyword (it creates its guest itself).
   (f) admission blocks: a call of a method named enter or try_enter_spare on an expression
       whose source text ends in "line" (an admission line), outside core/admission.py; listed
       with the number of modules they are in.
   (g) hand-written native-error mappings: an except handler whose body calls to_lfx_error.
       The calls of native_errors (the one mapping, a context manager) are listed apart.
   (h) keeper test files: the files under tests/ named test_*keeper*.py or test_*lease*.py
       (tests/keeper_child.py, the driver they share, is not one). Not limited to the package.

Against the numbers in the issue (measured at d5bde57), and how main (6ae0d12) compares
-------------------------------------------------------------------------------------------
- "10,782 lines of Python in 42 files": the commit has 10,782 lines in 41 *.py files (section
  1 counts .py only). `duplicates` reads 42 files in the package there, the 41 and most likely
  the _createos.pyi stub, which may be where 42 came from. /work/scratch-old, a checkout of
  d5bde57, has 140 uncommitted lines in local/testing.py (10,922 as a working tree): the saved
  reports are therefore made with --rev, from the commits themselves.
- "about 4.6k lines of C": csrc/*.c is 4,597 lines; headers and csrc/fuzz/ are shown apart.
- "1 import circle executor.py <-> executor_pool.py": the same single circle over all edges.
  Its edge executor_pool -> executor is lazy (inside a function), so there is no eager circle.
- "create-spec built in 5 places": the same 5 (backend CreateOSBackend.run, components/
  sandbox_run _spec, executor _Run._create_spec, warm_pool PoolKey.create_spec, executor_pool
  ExecutorPoolKey.create_spec through super()), at both commits.
- "EXEC_GRACE_SECONDS defined 3 times": the same 3 at both commits; cli.py's
  ACTIVE_GRACE_SECONDS (a cleanup age threshold, not an exec grace) is listed by its name.
- "key digested in 3 places": 3 hashlib calls on the key at d5bde57 (runtime, backend,
  executor_pool). At 6ae0d12 there is one (runtime.key_digest); the functions that read the
  key grow from 5 to 7 (pool_keeper, and settings._holds_the_key reading the environment).
- "version written in 4 places": the same 4 "defined" (pyproject, __init__, csrc/module.c,
  extension.json) at both commits; 4 more "embedded" copies (the User-Agent strings in
  runtime.py and csrc/client.c, and two in the starter flow's saved metadata) are listed apart.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE = "langflow_sandbox_createos"
SKIP_CONCEPT_FOLDERS = ("guest", "local")
SPEC_KEYS = frozenset({"shape", "rootfs", "auto_pause_after_seconds"})
KEY_VARIABLES = frozenset({"CREATEOS_API_KEY", "CREATEOS_SANDBOX_API_KEY"})
HASH_NAMES = frozenset(
    {"blake2b", "blake2s", "md5", "sha1", "sha224", "sha256", "sha384", "sha512", "new", "pbkdf2_hmac"}
)


# ---------------------------------------------------------------------------------------------
# reading the tree


@dataclass
class Module:
    name: str  # dotted: langflow_sandbox_createos.components.sandbox_run
    rel: str  # path below the package folder: components/sandbox_run.py
    lines: int
    tree: ast.Module | None
    is_pkg: bool


def count_lines(text: str) -> int:
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def load_modules(root: Path) -> tuple[list[Module], list[str]]:
    pkg = root / PACKAGE
    modules: list[Module] = []
    problems: list[str] = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        if "__pycache__" in rel.split("/"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        parts = [PACKAGE, *rel[: -len(".py")].split("/")]
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        try:
            tree: ast.Module | None = ast.parse(text, filename=str(path))
        except SyntaxError as exc:
            tree = None
            problems.append(f"{rel}: not parsed ({exc.msg}, line {exc.lineno})")
        modules.append(Module(".".join(parts), rel, count_lines(text), tree, is_pkg))
    return modules, problems


def folder_of(rel: str) -> str:
    return rel.split("/", 1)[0] + "/" if "/" in rel else "(root)"


def in_skipped_folder(rel: str) -> bool:
    return any(part in SKIP_CONCEPT_FOLDERS for part in rel.split("/")[:-1])


# ---------------------------------------------------------------------------------------------
# 1 and 2: sizes, longest functions


def sizes(modules: list[Module]) -> dict[str, Any]:
    folders: dict[str, dict[str, int]] = defaultdict(lambda: {"modules": 0, "lines": 0})
    for m in modules:
        entry = folders[folder_of(m.rel)]
        entry["modules"] += 1
        entry["lines"] += m.lines
    ordered = sorted(folders.items(), key=lambda item: (item[0] != "(root)", item[0]))
    largest = sorted(modules, key=lambda m: (-m.lines, m.rel))[:10]
    return {
        "folders": [{"folder": name, **counts} for name, counts in ordered],
        "total_modules": len(modules),
        "total_lines": sum(m.lines for m in modules),
        "largest_modules": [{"path": m.rel, "lines": m.lines} for m in largest],
    }


def python_functions(modules: list[Module]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def walk(node: ast.AST, prefix: str, rel: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = f"{prefix}.{child.name}" if prefix else child.name
                if not isinstance(child, ast.ClassDef):
                    end = child.end_lineno or child.lineno
                    found.append(
                        {"name": f"{rel}:{qual}", "line": child.lineno, "lines": end - child.lineno + 1}
                    )
                walk(child, qual, rel)
            else:
                walk(child, prefix, rel)

    for m in modules:
        if m.tree is not None:
            walk(m.tree, "", m.rel)
    return sorted(found, key=lambda f: (-f["lines"], f["name"]))


def _blank_c(text: str) -> str:
    """C source with comments, string and char literals and preprocessor lines turned into
    spaces, newlines kept (so offsets and line numbers still match)."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            # a preprocessor line, with its backslash continuations
            while i < n and not (text[i] == "\n" and text[i - 1] != "\\"):
                if text[i] != "\n":
                    out[i] = " "
                i += 1
            continue
        if c == "\n":
            line_start = True
            i += 1
            continue
        if c in " \t":
            i += 1
            continue
        line_start = False
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            for j in range(i, end):
                if out[j] != "\n":
                    out[j] = " "
            i = end
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                out[i] = " "
                i += 1
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            for k in range(i, min(j + 1, n)):
                if out[k] != "\n":
                    out[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(out)


def _close(text: str, start: int) -> int:
    """The offset just after the `)` that closes the `(` at `start`; 0 when it is not closed."""
    depth = 0
    for j in range(start, len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return 0


def c_functions(path: Path, label: str) -> list[dict[str, Any]]:
    text = _blank_c(path.read_text(encoding="utf-8", errors="replace"))
    found: list[dict[str, Any]] = []
    depth = 0
    header_start = 0  # offset just after the last `;` or `}` at depth 0
    opened_at = -1
    opened: dict[str, Any] | None = None
    for i, c in enumerate(text):
        if c == "{":
            if depth == 0:
                header = text[header_start:i]
                # a macro call standing alone before it (`OWNED_KWDS(c_exec)` with no `;`) is not
                # part of this function's header
                while (m := re.match(r"\s*[A-Za-z_]\w*\s*\(", header)) and (
                    close := _close(header, m.end() - 1)
                ):
                    if not header[close:].strip():
                        break
                    header_start += close
                    header = header[close:]
                stripped = header.strip()
                opened = None
                if stripped.endswith(")") and "=" not in stripped and "(" in stripped:
                    before_paren = stripped[: stripped.index("(")].split()
                    name = re.sub(r"^\W+", "", before_paren[-1]) if before_paren else ""
                    if re.fullmatch(r"[A-Za-z_]\w*", name) and before_paren[0] not in (
                        "struct",
                        "union",
                        "enum",
                    ):
                        first = header_start + (len(header) - len(header.lstrip()))
                        opened = {"name": f"{label}:{name}", "line": text.count("\n", 0, first) + 1}
                        opened_at = i
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                if opened is not None and opened_at >= 0:
                    end_line = text.count("\n", 0, i) + 1
                    opened["lines"] = end_line - opened["line"] + 1
                    found.append(opened)
                opened, opened_at = None, -1
                header_start = i + 1
        elif c == ";" and depth == 0:
            header_start = i + 1
    return found


def c_sizes(root: Path) -> dict[str, Any]:
    csrc = root / "csrc"
    groups = {
        "csrc/*.c": sorted(csrc.glob("*.c")),
        "csrc/*.h": sorted(csrc.glob("*.h")),
        "csrc/fuzz/ (.c, .h)": sorted([*csrc.glob("fuzz/*.c"), *csrc.glob("fuzz/*.h")]),
    }
    table = []
    for name, paths in groups.items():
        lines = sum(count_lines(p.read_text(encoding="utf-8", errors="replace")) for p in paths)
        table.append({"group": name, "files": len(paths), "lines": lines})
    functions: list[dict[str, Any]] = []
    for p in groups["csrc/*.c"]:
        functions.extend(c_functions(p, f"csrc/{p.name}"))
    functions.sort(key=lambda f: (-f["lines"], f["name"]))
    return {"groups": table, "function_count": len(functions), "longest_functions": functions[:10]}


# ---------------------------------------------------------------------------------------------
# 3: import graph


@dataclass
class Edge:
    source: str
    target: str
    rel: str
    line: int
    kind: str  # eager, lazy, type-only


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(dotted: str, known: set[str]) -> str | None:
    """The longest prefix of `dotted` that is a package module."""
    parts = dotted.split(".")
    while parts:
        name = ".".join(parts)
        if name in known:
            return name
        parts.pop()
    return None


def native_modules(root: Path) -> set[str]:
    """Dotted names of the package's extension modules (a .so/.pyd or a .pyi stub, no .py)."""
    pkg = root / PACKAGE
    found = set()
    for pattern in ("*.so", "*.pyd", "*.pyi"):
        for path in pkg.rglob(pattern):
            rel = path.relative_to(pkg)
            stem = path.name.split(".", 1)[0]
            if not (path.parent / f"{stem}.py").exists():
                found.add(".".join([PACKAGE, *rel.parent.parts, stem]))
    return found


def import_edges(modules: list[Module], native: frozenset[str] | set[str] = frozenset()) -> list[Edge]:
    known = {m.name for m in modules}
    edges: list[Edge] = []

    for m in modules:
        if m.tree is None:
            continue

        def add(target: str | None, line: int, kind: str, m: Module = m) -> None:
            edge = Edge(m.name, target or "", m.rel, line, kind)
            if target is not None and target != m.name and edge not in edges:
                edges.append(edge)

        def visit(node: ast.AST, kind: str, m: Module = m) -> None:
            for child in ast.iter_child_nodes(node):
                child_kind = kind
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    child_kind = "lazy" if kind == "eager" else kind
                if isinstance(child, ast.If) and _is_type_checking(child.test):
                    for stmt in child.body:
                        visit_stmt(stmt, "type-only")
                    for stmt in child.orelse:
                        visit_stmt(stmt, kind)
                    continue
                visit_stmt(child, child_kind)

        def visit_stmt(node: ast.AST, kind: str, m: Module = m) -> None:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if (
                        alias.name == PACKAGE or alias.name.startswith(PACKAGE + ".")
                    ) and alias.name not in native:
                        add(_resolve(alias.name, known), node.lineno, kind)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = m.name.split(".") if m.is_pkg else m.name.split(".")[:-1]
                    if node.level > 1:
                        base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + (node.module.split(".") if node.module else []))
                else:
                    base = node.module or ""
                if base == PACKAGE or base.startswith(PACKAGE + "."):
                    for alias in node.names:
                        sub = f"{base}.{alias.name}"
                        if sub not in native:  # the C extension is no node of the graph
                            add(sub if sub in known else _resolve(base, known), node.lineno, kind)
            visit(node, kind)

        visit(m.tree, "eager")
    return edges


def tarjan(nodes: list[str], succ: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    result: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(succ.get(start, ())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop(0)
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(succ.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                result.append(sorted(component))
    return result


def circles(modules: list[Module], native: set[str]) -> dict[str, Any]:
    edges = import_edges(modules, native)
    nodes = sorted(m.name for m in modules)
    short = {m.name: m.rel for m in modules}

    def sccs(kinds: set[str]) -> list[dict[str, Any]]:
        succ: dict[str, set[str]] = defaultdict(set)
        for e in edges:
            if e.kind in kinds:
                succ[e.source].add(e.target)
        found = []
        for comp in tarjan(nodes, succ):
            if len(comp) < 2:
                continue
            members = set(comp)
            inside = sorted(
                (e for e in edges if e.kind in kinds and e.source in members and e.target in members),
                key=lambda e: (e.rel, e.line),
            )
            found.append(
                {
                    "modules": [short[c] for c in comp],
                    "edges": [
                        {"from": f"{e.rel}:{e.line}", "to": short[e.target], "kind": e.kind} for e in inside
                    ],
                }
            )
        return sorted(found, key=lambda c: c["modules"])

    kinds_count: dict[str, int] = defaultdict(int)
    for e in edges:
        kinds_count[e.kind] += 1
    return {
        "edges": len(edges),
        "edges_by_kind": dict(sorted(kinds_count.items())),
        "all_edges": sccs({"eager", "lazy", "type-only"}),
        "eager_edges_only": sccs({"eager"}),
    }


# ---------------------------------------------------------------------------------------------
# 4: duplicates


def duplicates(root: Path) -> dict[str, Any]:
    exe = shutil.which("duplicates")
    out: dict[str, Any] = {"command": exe, "trees": []}
    for sub in (PACKAGE, "csrc", "tests"):
        entry: dict[str, Any] = {"tree": sub + "/"}
        if exe is None:
            entry["pairs"] = None
            entry["summary"] = "not run: no duplicates command on PATH"
        elif not (root / sub).is_dir():
            entry["pairs"] = None
            entry["summary"] = "no such folder"
        else:
            cmd = [exe, "--repo", str(root / sub), "--most", "200", "--seconds", "120"]
            proc = subprocess.run(cmd, cwd=root / sub, capture_output=True, text=True, timeout=300)
            lines = proc.stdout.splitlines()
            first = lines[0] if lines else proc.stderr.strip()
            m = re.match(r"(\d+) pairs? of places \((\d+) files? read\)", first)
            if m:
                entry["pairs"], entry["files_read"] = int(m.group(1)), int(m.group(2))
            elif first.startswith("no duplicates"):
                entry["pairs"] = 0
            else:
                entry["pairs"] = None
            entry["summary"] = first
            entry["rows"] = [line for line in lines[1:] if re.match(r"D\d+ ", line)]
            entry["notes"] = [line for line in lines if line.startswith(("left out:", "incomplete:"))]
        out["trees"].append(entry)
    return out


# ---------------------------------------------------------------------------------------------
# 5: concept carriers


def _functions_with_parents(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """(qualname, node) for the module itself ("<module>") and every function, outermost first."""
    scopes: list[tuple[str, ast.AST]] = [("<module>", tree)]

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = f"{prefix}.{child.name}" if prefix else child.name
                if not isinstance(child, ast.ClassDef):
                    scopes.append((qual, child))
                walk(child, qual)
            else:
                walk(child, prefix)

    walk(tree, "")
    return scopes


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a scope, not descending into nested functions (they are their own scope)."""
    out: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            todo.extend(ast.iter_child_nodes(node))
    return out


def _str_keys(node: ast.Dict) -> set[str]:
    return {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def _call_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _place(rel: str, line: int, qual: str) -> dict[str, Any]:
    return {"where": f"{rel}:{line}", "scope": qual}


def spec_builders(modules: list[Module]) -> list[dict[str, Any]]:
    places: list[dict[str, Any]] = []
    builder_names: set[str] = set()
    scoped = [
        (m, qual, scope)
        for m in modules
        if m.tree is not None and not in_skipped_folder(m.rel)
        for qual, scope in _functions_with_parents(m.tree)
    ]
    for m, qual, scope in scoped:
        keys: set[str] = set()
        first_line = None
        for node in _own_nodes(scope):
            found: set[str] = set()
            if isinstance(node, ast.Dict):
                found = _str_keys(node)
            elif (  # request["auto_pause_after_seconds"] = ...: a dict filled key by key
                isinstance(node, ast.Subscript)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)
            ):
                found = {node.slice.value}
            if found & SPEC_KEYS:
                keys |= found
                first_line = first_line or node.lineno
        if keys >= SPEC_KEYS and first_line is not None:
            places.append({**_place(m.rel, first_line, qual), "how": "dict with shape, rootfs, auto_pause"})
            builder_names.add(qual.rsplit(".", 1)[-1])
    for m, qual, scope in scoped:
        for node in _own_nodes(scope):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in builder_names
                and isinstance(node.func.value, ast.Call)
                and _call_name(node.func.value) == "super"
            ):
                places.append(
                    {**_place(m.rel, node.lineno, qual), "how": f"edits super().{node.func.attr}()"}
                )
                break
    return sorted(places, key=lambda p: p["where"])


def _receiver(node: ast.Call) -> str:
    """The source text of what a method is called on (``self.client`` of ``self.client.create()``)."""
    return ast.unparse(node.func.value) if isinstance(node.func, ast.Attribute) else ""


def _scoped_calls(modules: list[Module]) -> list[tuple[Module, str, ast.Call]]:
    """Every call in the package's host code (guest/ and local/ left out), with its scope."""
    return [
        (m, qual, node)
        for m in modules
        if m.tree is not None and not in_skipped_folder(m.rel)
        for qual, scope in _functions_with_parents(m.tree)
        for node in _own_nodes(scope)
        if isinstance(node, ast.Call)
    ]


def guest_creates(modules: list[Module]) -> list[dict[str, Any]]:
    """(e) Calls that create a guest: ``<...client>.create(...)``, and ``<...client>.run_program``
    without a ``sandbox_id`` (it creates one itself)."""
    places = []
    for m, qual, node in _scoped_calls(modules):
        name = _call_name(node)
        keywords = {k.arg for k in node.keywords}
        if name == "create" and _receiver(node).endswith("client"):
            places.append({**_place(m.rel, node.lineno, qual), "how": f"{_receiver(node)}.create"})
        elif name == "run_program" and _receiver(node).endswith("client") and "sandbox_id" not in keywords:
            places.append({**_place(m.rel, node.lineno, qual), "how": "run_program without sandbox_id"})
    return sorted(places, key=lambda p: p["where"])


def admission_blocks(modules: list[Module]) -> list[dict[str, Any]]:
    """(f) Calls that take a slot of an admission line: ``enter`` or ``try_enter_spare`` on
    something whose last name ends in ``line`` (core/admission.py's own code left out)."""
    places = []
    for m, qual, node in _scoped_calls(modules):
        if m.rel == "core/admission.py" or _call_name(node) not in ("enter", "try_enter_spare"):
            continue
        if re.search(r"line$", _receiver(node)):
            places.append(
                {**_place(m.rel, node.lineno, qual), "how": f"{_receiver(node)}.{_call_name(node)}"}
            )
    return sorted(places, key=lambda p: p["where"])


def error_mappings(modules: list[Module]) -> list[dict[str, Any]]:
    """(g) Hand-written mappings of native errors to lfx's: ``except`` handlers whose body
    calls ``to_lfx_error``. Uses of the mapping context manager (``with native_errors(...)``)
    are listed apart."""
    places = []
    for m in modules:
        if m.tree is None or in_skipped_folder(m.rel):
            continue
        for qual, scope in _functions_with_parents(m.tree):
            for node in _own_nodes(scope):
                if isinstance(node, ast.ExceptHandler) and any(
                    isinstance(sub, ast.Call) and _call_name(sub) == "to_lfx_error"
                    for stmt in node.body
                    for sub in ast.walk(stmt)
                ):
                    places.append({**_place(m.rel, node.lineno, qual), "how": "except ... to_lfx_error"})
    return sorted(places, key=lambda p: p["where"])


def error_mapping_uses(modules: list[Module]) -> list[dict[str, Any]]:
    places = []
    for m, qual, node in _scoped_calls(modules):
        if _call_name(node) == "native_errors":
            places.append({**_place(m.rel, node.lineno, qual), "how": "native_errors"})
    return sorted(places, key=lambda p: p["where"])


def keeper_test_files(root: Path) -> list[str]:
    """(h) Test files of the guest keeper's rule: files under tests/ named like ``test_*keeper*.py``
    or ``test_*lease*.py`` (the shared driver, tests/keeper_child.py, is no test file)."""
    tests = root / "tests"
    if not tests.is_dir():
        return []
    found = {p for pattern in ("test_*keeper*.py", "test_*lease*.py") for p in tests.rglob(pattern)}
    return sorted(p.relative_to(root).as_posix() for p in found if "__pycache__" not in p.parts)


def grace_constants(modules: list[Module]) -> list[dict[str, Any]]:
    places: list[dict[str, Any]] = []
    for m in modules:
        if m.tree is None or in_skipped_folder(m.rel):
            continue
        bodies: list[tuple[str, list[ast.stmt]]] = [("<module>", m.tree.body)]
        bodies += [(n.name, n.body) for n in ast.walk(m.tree) if isinstance(n, ast.ClassDef)]
        for scope, body in bodies:
            for stmt in body:
                targets: list[ast.expr] = []
                if isinstance(stmt, ast.Assign):
                    targets = stmt.targets
                elif isinstance(stmt, ast.AnnAssign):
                    targets = [stmt.target]
                for t in targets:
                    names = [t] if isinstance(t, ast.Name) else [e for e in getattr(t, "elts", [])]
                    for name in names:
                        if isinstance(name, ast.Name) and "GRACE" in name.id.upper():
                            places.append({**_place(m.rel, stmt.lineno, scope), "name": name.id})
    return sorted(places, key=lambda p: (p["name"], p["where"]))


def _hash_names(tree: ast.Module) -> set[str]:
    """Names bound by `from hashlib import ...` in this module."""
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "hashlib"
        for alias in node.names
    }


def api_key_places(modules: list[Module]) -> dict[str, list[dict[str, Any]]]:
    reads: list[dict[str, Any]] = []
    digests: list[dict[str, Any]] = []
    for m in modules:
        if m.tree is None or in_skipped_folder(m.rel):
            continue
        from_hashlib = _hash_names(m.tree)
        for qual, scope in _functions_with_parents(m.tree):
            own = _own_nodes(scope)
            # strings a for/comprehension iterates, or that are call arguments or read subscripts
            iterated: set[int] = set()
            for node in own:
                it = None
                if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                    it = node.iter
                if isinstance(it, (ast.Tuple, ast.List)):
                    iterated.update(id(e) for e in it.elts)
            read_lines: list[tuple[int, str]] = []
            for node in own:
                if isinstance(node, ast.Call):
                    if _call_name(node) == "api_key" and not node.args and not node.keywords:
                        read_lines.append((node.lineno, "api_key()"))
                    for arg in node.args:
                        if isinstance(arg, ast.Constant) and arg.value in KEY_VARIABLES:
                            read_lines.append((node.lineno, f"{arg.value} as an argument"))
                elif (
                    isinstance(node, ast.Subscript)
                    and isinstance(node.ctx, ast.Load)
                    and isinstance(node.slice, ast.Constant)
                    and node.slice.value in KEY_VARIABLES
                ):
                    read_lines.append((node.lineno, f"[{node.slice.value!r}]"))
                elif isinstance(node, ast.Constant) and id(node) in iterated and node.value in KEY_VARIABLES:
                    read_lines.append((node.lineno, f"iterates {node.value}"))
            for line in sorted({line for line, _ in read_lines}):
                how = ", ".join(sorted({h for n, h in read_lines if n == line}))
                reads.append({**_place(m.rel, line, qual), "how": how})
            for node in own:
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                is_hash = (
                    isinstance(func, ast.Attribute)
                    and isinstance(func.value, ast.Name)
                    and func.value.id == "hashlib"
                    and func.attr in HASH_NAMES
                ) or (isinstance(func, ast.Name) and func.id in from_hashlib)
                if not is_hash:
                    continue
                mentions_key = False
                for arg in node.args:
                    for sub in ast.walk(arg):
                        if isinstance(sub, ast.Name) and re.search(r"(^|_)key$", sub.id):
                            mentions_key = True
                        if isinstance(sub, ast.Call) and _call_name(sub) == "api_key":
                            mentions_key = True
                if mentions_key:
                    digests.append({**_place(m.rel, node.lineno, qual), "how": ast.unparse(func)})
    return {"reads": reads, "digests": digests}


def project_version(root: Path) -> str | None:
    """pyproject's [project] version; when it is dynamic, the package's ``__version__``."""
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return None
    init = root / PACKAGE / "__init__.py"
    found = (
        re.search(r'^__version__\s*=\s*"([^"]+)"', init.read_text(encoding="utf-8"), re.M)
        if init.is_file()
        else None
    )
    package_version = found.group(1) if found else None
    text = pyproject.read_text(encoding="utf-8")
    try:
        import tomllib

        return tomllib.loads(text).get("project", {}).get("version") or package_version
    except ImportError:  # Python 3.10
        section = re.search(r"^\[project\]\s*$(.*?)(^\[|\Z)", text, re.M | re.S)
        found = re.search(r'^version\s*=\s*"([^"]+)"', section.group(1), re.M) if section else None
        return found.group(1) if found else package_version


def version_places(root: Path) -> dict[str, Any]:
    version = project_version(root)
    if not version:
        return {"version": None, "defined": [], "embedded": []}
    candidates = [
        root / "pyproject.toml",
        root / "setup.py",
        root / "setup.cfg",
        root / "createos_langflow.py",
    ]
    pkg = root / PACKAGE
    candidates += sorted(p for ext in ("*.py", "*.pyi", "*.json") for p in pkg.rglob(ext))
    candidates += sorted(p for ext in ("*.c", "*.h") for p in (root / "csrc").rglob(ext))
    quoted = re.escape(version)
    defining = [
        re.compile(rf"""^\s*\w*version\w*\s*(:[^=]+)?=\s*(["']){quoted}\2\s*(#.*)?$""", re.I),  # Python, TOML
        re.compile(rf'^\s*#\s*define\s+\w*VERSION\w*\s+"{quoted}"', re.I),  # C
    ]
    defined: list[dict[str, Any]] = []
    embedded: list[dict[str, Any]] = []
    for path in candidates:
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        top_json_lines: set[int] = set()
        if path.suffix == ".json":
            try:
                data = json.loads(text)
            except ValueError:
                data = None
            if isinstance(data, dict):
                for key, value in data.items():
                    if "version" in key.lower() and value == version:
                        hit = re.search(rf'^\s*"{re.escape(key)}"\s*:\s*"{quoted}"', text, re.M)
                        if hit:
                            top_json_lines.add(text.count("\n", 0, hit.start()) + 1)
        for number, line in enumerate(text.splitlines(), start=1):
            if not re.search(rf"""["']{quoted}["']|["'][^"'\n]*{quoted}""", line):
                continue
            place = {"where": f"{rel}:{number}", "text": line.strip()[:100]}
            if number in top_json_lines or (path.suffix != ".json" and any(p.search(line) for p in defining)):
                defined.append(place)
            else:
                embedded.append(place)
    return {"version": version, "defined": defined, "embedded": embedded}


# ---------------------------------------------------------------------------------------------
# report


def measure(root: Path, label: str) -> dict[str, Any]:
    modules, problems = load_modules(root)
    functions = python_functions(modules)
    grace = grace_constants(modules)
    by_name: dict[str, int] = defaultdict(int)
    for g in grace:
        by_name[g["name"]] += 1
    return {
        "measured": label,
        "problems": problems,
        "python": {**sizes(modules), "function_count": len(functions), "longest_functions": functions[:15]},
        "c": c_sizes(root),
        "import_circles": circles(modules, native_modules(root)),
        "duplicates": duplicates(root),
        "concepts": {
            "create_spec": spec_builders(modules),
            "grace_constants": grace,
            "grace_by_name": dict(sorted(by_name.items())),
            "api_key": api_key_places(modules),
            "version": version_places(root),
            "guest_creates": guest_creates(modules),
            "admission_blocks": admission_blocks(modules),
            "error_mappings": error_mappings(modules),
            "error_mapping_uses": error_mapping_uses(modules),
            "keeper_test_files": keeper_test_files(root),
        },
    }


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def _places(items: list[dict[str, Any]], extra: str | None = None) -> list[str]:
    out = []
    for item in items:
        tail = f" ({item[extra]})" if extra and item.get(extra) else ""
        scope = f" `{item['scope']}`" if "scope" in item else ""
        out.append(f"- {item['where']}{scope}{tail}")
    return out or ["- (none)"]


def markdown(r: dict[str, Any]) -> str:
    py, c, circ, dup, con = r["python"], r["c"], r["import_circles"], r["duplicates"], r["concepts"]
    key, ver = con["api_key"], con["version"]
    lines = [
        f"# Code metrics: {r['measured']}",
        "",
        "Made by `scripts/code_metrics.py`; its docstring states every rule. Paths are below",
        f"`{PACKAGE}/` unless they start with `csrc/` or another top-level name.",
        "",
        "## Headline",
        "",
    ]
    lines += _table(
        ["measure", "count"],
        [
            ["Python modules in the package", py["total_modules"]],
            ["Python lines in the package", f"{py['total_lines']:,}"],
            ["C lines, csrc/*.c", f"{c['groups'][0]['lines']:,}"],
            ["import circles (SCC > 1), all edges", len(circ["all_edges"])],
            ["import circles, eager edges only", len(circ["eager_edges_only"])],
            *[[f"duplicates pairs, {t['tree']}", t["pairs"]] for t in dup["trees"]],
            ["create-request builders", len(con["create_spec"])],
            ["places that create a guest", len(con["guest_creates"])],
            [
                "admission blocks (places / modules)",
                f"{len(con['admission_blocks'])} / {_modules_of(con['admission_blocks'])}",
            ],
            ["hand-written native-error mappings", len(con["error_mappings"])],
            ["keeper test files", len(con["keeper_test_files"])],
            *[[f"grace constant `{name}` definitions", n] for name, n in con["grace_by_name"].items()],
            ["API key reads", len(key["reads"])],
            ["API key digests (hash calls)", len(key["digests"])],
            [f"version {ver['version']} defined", len(ver["defined"])],
            [f"version {ver['version']} embedded in other strings", len(ver["embedded"])],
        ],
    )
    if r["problems"]:
        lines += ["", "Not parsed:", *[f"- {p}" for p in r["problems"]]]

    lines += ["", "## 1. Python modules and lines per folder", ""]
    rows = [[f["folder"], f["modules"], f"{f['lines']:,}"] for f in py["folders"]]
    rows.append(["**total**", f"**{py['total_modules']}**", f"**{py['total_lines']:,}**"])
    lines += _table(["folder", "modules", "lines"], rows)
    lines += ["", "C (physical lines):", ""]
    lines += _table(
        ["files", "count", "lines"], [[g["group"], g["files"], f"{g['lines']:,}"] for g in c["groups"]]
    )

    lines += ["", "## 2. Largest modules and longest functions", "", "10 largest Python modules:", ""]
    lines += _table(["module", "lines"], [[m["path"], m["lines"]] for m in py["largest_modules"]])
    lines += ["", f"15 longest of {py['function_count']} Python functions and methods (def line to end):", ""]
    lines += _table(
        ["function", "line", "lines"], [[f["name"], f["line"], f["lines"]] for f in py["longest_functions"]]
    )
    lines += ["", f"10 longest of {c['function_count']} C functions in csrc/*.c:", ""]
    lines += _table(
        ["function", "line", "lines"], [[f["name"], f["line"], f["lines"]] for f in c["longest_functions"]]
    )

    lines += [
        "",
        "## 3. Import circles",
        "",
        f"{circ['edges']} import edges between package modules ("
        + ", ".join(f"{n} {k}" for k, n in circ["edges_by_kind"].items())
        + "). A package's `__init__` gets no implicit edge from its submodules' imports; the C extension"
        " is no node.",
    ]
    for title, found in (
        ("All edges", circ["all_edges"]),
        ("Eager (module-level) edges only", circ["eager_edges_only"]),
    ):
        lines += ["", f"{title}: {len(found)} circle(s)."]
        for i, comp in enumerate(found, start=1):
            lines += ["", f"{i}. " + " <-> ".join(comp["modules"])]
            lines += [f"   - {e['from']} -> {e['to']} ({e['kind']})" for e in comp["edges"]]

    lines += ["", "## 4. duplicates", ""]
    if dup["command"] is None:
        lines.append("No `duplicates` command on PATH: not run.")
    else:
        lines.append("`duplicates --repo DIR --most 200 --seconds 120`, one tree at a time:")
        lines.append("")
        lines += _table(
            ["tree", "pairs", "its summary line"],
            [[t["tree"], t["pairs"], t["summary"]] for t in dup["trees"]],
        )
        for t in dup["trees"]:
            for note in t.get("notes", []):
                lines.append(f"\n{t['tree']}: {note}")

    lines += ["", "## 5. Concept carriers", ""]
    lines += [
        f"(a) create-request builders: {len(con['create_spec'])}",
        "",
        *_places(con["create_spec"], "how"),
        "",
        f"(b) grace constants (module or class level, name contains GRACE): {len(con['grace_constants'])}",
        "",
        *([f"- {g['where']} `{g['name']}`" for g in con["grace_constants"]] or ["- (none)"]),
        "",
        f"(c) API key reads: {len(key['reads'])}",
        "",
        *_places(key["reads"], "how"),
        "",
        f"API key digests (a hashlib call on a key): {len(key['digests'])}",
        "",
        *_places(key["digests"], "how"),
        "",
        f"(d) version {ver['version']} defined: {len(ver['defined'])}",
        "",
        *([f"- {v['where']}: `{v['text']}`" for v in ver["defined"]] or ["- (none)"]),
        "",
        f"embedded in other strings or nested data: {len(ver['embedded'])}",
        "",
        *([f"- {v['where']}: `{v['text']}`" for v in ver["embedded"]] or ["- (none)"]),
        "",
        f"(e) places that create a guest: {len(con['guest_creates'])}",
        "",
        *_places(con["guest_creates"], "how"),
        "",
        f"(f) admission blocks: {len(con['admission_blocks'])} in {_modules_of(con['admission_blocks'])} module(s)",
        "",
        *_places(con["admission_blocks"], "how"),
        "",
        f"(g) hand-written native-error mappings: {len(con['error_mappings'])}",
        "",
        *_places(con["error_mappings"], "how"),
        "",
        f"uses of the mapping context manager: {len(con['error_mapping_uses'])}",
        "",
        *_places(con["error_mapping_uses"]),
        "",
        f"(h) keeper test files: {len(con['keeper_test_files'])}",
        "",
        *([f"- {path}" for path in con["keeper_test_files"]] or ["- (none)"]),
        "",
    ]
    return "\n".join(lines)


def _modules_of(items: list[dict[str, Any]]) -> int:
    return len({item["where"].rsplit(":", 1)[0] for item in items})


def describe(root: Path) -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"the files under {root}"
    return f"working tree of {head}" + (" (with uncommitted changes to tracked files)" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--rev", help="measure this commit of ROOT (git archive), not its working tree")
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    if not (root / PACKAGE).is_dir() and not args.rev:
        parser.error(f"{root} has no {PACKAGE}/ folder")
    if args.rev:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", f"{args.rev}^{{commit}}"],
            capture_output=True,
            text=True,
        )
        if sha.returncode != 0:
            parser.error(f"{args.rev}: not a commit of {root}")
        with tempfile.TemporaryDirectory(prefix="code-metrics-") as tmp:
            archive = Path(tmp) / "tree.tar"
            subprocess.run(["git", "-C", str(root), "archive", "-o", str(archive), args.rev], check=True)
            tree = Path(tmp) / "tree"
            with tarfile.open(archive) as tar:
                if sys.version_info >= (3, 12):
                    tar.extractall(tree, filter="data")
                else:
                    tar.extractall(tree)
            result = measure(
                tree, f"commit {sha.stdout.strip()} (git archive; working-tree changes not counted)"
            )
    else:
        result = measure(root, describe(root))
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
