"""What the docs say, read the way the drift tests need it (README.md and docs/*.md).

The docs and the code they describe are looked up under one root: this checkout, or the
tree `DOCS_DRIFT_ROOT` names (tests/unit/docs_drift_at.sh exports an old commit there to show
that the tests catch what was wrong with its docs). Standard library only.
"""

from __future__ import annotations

import ast
import bisect
import os
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = Path(os.environ.get("DOCS_DRIFT_ROOT") or REPO).resolve()
PACKAGE = ROOT / "langflow_sandbox_createos"

_FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
_CODE_SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
ENV_NAME = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def without_fences(text: str) -> str:
    """`text` with fenced code blocks blanked out (line numbers kept)."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def squash(text: str) -> str:
    return " ".join(text.split())


def code_spans(text: str) -> list[str]:
    return [squash(m.group(1)) for m in _CODE_SPAN.finditer(text)]


# --- tables --------------------------------------------------------------------------------


@dataclass
class Table:
    path: Path
    line: int  # of the header row, 1-based
    header: list[str]
    rows: list[tuple[int, list[str]]] = field(default_factory=list)

    def column(self, *names: str) -> int | None:
        wanted = {n.lower() for n in names}
        for index, cell in enumerate(self.header):
            if cell.strip().lower() in wanted:
                return index
        return None


def _cells(line: str) -> list[str]:
    """A table row's cells; `|` inside a code span does not split."""
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    cells, current, in_code = [], [], False
    for ch in body:
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    cells.append("".join(current).strip())
    return cells


def tables(path: Path) -> list[Table]:
    lines = without_fences(path.read_text(encoding="utf-8")).split("\n")
    found: list[Table] = []
    index = 0
    while index < len(lines) - 1:
        line, below = lines[index], lines[index + 1]
        if line.lstrip().startswith("|") and re.fullmatch(r"\s*\|?[\s:|-]*-[\s:|-]*", below):
            table = Table(path, index + 1, _cells(line))
            index += 2
            while index < len(lines) and lines[index].lstrip().startswith("|"):
                table.rows.append((index + 1, _cells(lines[index])))
                index += 1
            found.append(table)
        else:
            index += 1
    return found


# --- quoted messages ---------------------------------------------------------------------------

# The rule (docs/index.md, "Quoted messages"): these are the docs' verbatim quotes of what the
# code says, so each must be producible by the code.
MESSAGE_COLUMNS = ("message", "message starts with", "message says", "symptom")
MESSAGE_PREFIXES = (
    "CreateOS:",
    "CreateOS executor:",
    "[createos:",
    "SandboxUnavailableError:",
    "SandboxExecutionError:",
)
_BOLD_CODE = re.compile(r"\*\*(?:Log: )?`([^`]+)`\*\*")
# Stand-ins for text the code fills in.
PLACEHOLDER = re.compile(r"\[\.\.\.\]|\(\.\.\.\)|'\.\.\.'|\.\.\.|…|<[^<>`]+>|\bN\b")
_ERROR_CLASS = re.compile(r"^[A-Z][A-Za-z]*Error: ")


@dataclass(frozen=True)
class Quote:
    path: Path
    line: int
    text: str
    how: str  # which part of the rule found it

    def where(self) -> str:
        return f"{rel(self.path)}:{self.line} ({self.how})"


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def quoted_messages(path: Path) -> list[Quote]:
    text = without_fences(path.read_text(encoding="utf-8"))
    found: list[Quote] = []
    for m in _BOLD_CODE.finditer(text):
        found.append(Quote(path, _line_of(text, m.start()), squash(m.group(1)), "bold code span"))
    for m in _CODE_SPAN.finditer(text):
        span = squash(m.group(1))
        if span.startswith(MESSAGE_PREFIXES):
            found.append(Quote(path, _line_of(text, m.start()), span, "message prefix"))
    for table in tables(path):
        for column_name in MESSAGE_COLUMNS:
            column = table.column(column_name)
            if column is None:
                continue
            for line, cells in table.rows:
                if column < len(cells):
                    for span in code_spans(cells[column]):
                        found.append(Quote(path, line, span, f"table column {table.header[column]!r}"))
    quote: list[str] = []
    start = 0
    for number, line in enumerate([*text.split("\n"), ""], 1):
        if line.startswith(">"):
            if not quote:
                start = number
            quote.append(line[1:].strip())
        elif quote:
            found.append(Quote(path, start, squash(" ".join(quote)), "block quote"))
            quote = []
    unique: dict[str, Quote] = {}
    for item in found:
        unique.setdefault(f"{item.line}\0{item.text}", item)
    return list(unique.values())


def fragments(message: str) -> list[str]:
    """The literal parts of a quoted message, between placeholders."""
    message = _ERROR_CLASS.sub("", message, count=1)
    parts = PLACEHOLDER.split(message)
    out = []
    for index, part in enumerate(parts):
        if index > 0:  # "... x": the space may belong to what the placeholder stands for
            part = part.lstrip()
        if index < len(parts) - 1:
            part = part.rstrip()
        if sum(ch.isalnum() for ch in part) >= 2:
            out.append(part)
    return out


# --- what the code can say -----------------------------------------------------------------------

HOLE = None  # where a string's text is filled in at run time
_PRINTF = re.compile(r"%(?:[-+ #0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|z|j|t|L)?[diouxXeEfgGcsrpa])")
_BRACES = re.compile(r"\{[^{}\n]*\}")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
MIN_VALUE_CHARS = 3
LONG_PART = 10
Part = str | None


@dataclass(frozen=True)
class Piece:
    """Literal text between two holes (or a string's ends)."""

    text: str
    after_hole: bool  # text is filled in right before it
    before_hole: bool  # text is filled in right after it


def _split_format(text: str, pattern: re.Pattern[str]) -> list[Part]:
    out: list[Part] = []
    last = 0
    for m in pattern.finditer(text):
        out += [text[last : m.start()], HOLE]
        last = m.end()
    out.append(text[last:])
    return out


def _parts(node: ast.AST) -> list[Part] | None:
    """A string expression as literal parts and holes; None if it is not a string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        parts = _split_format(node.value.replace("%%", "\x01"), _PRINTF)
        out: list[Part] = []
        for part in parts:
            out += [HOLE] if part is HOLE else _split_format(part.replace("\x01", "%"), _BRACES)
        return out
    if isinstance(node, ast.JoinedStr):
        out = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                out.append(value.value)
            else:
                out.append(HOLE)
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _parts(node.left), _parts(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else [HOLE]) + (right if right is not None else [HOLE])
    return None


def _pieces(parts: Iterable[Part]) -> Iterator[Piece]:
    merged: list[Part] = []
    for part in parts:
        if part is HOLE:
            if not merged or merged[-1] is not HOLE:
                merged.append(HOLE)
        elif merged and merged[-1] is not HOLE:
            merged[-1] = f"{merged[-1]}{part}"
        else:
            merged.append(part)
    for index, part in enumerate(merged):
        if part:  # a hole is None, an empty literal ""
            yield Piece(
                part,
                after_hole=index > 0 and merged[index - 1] is HOLE,
                before_hole=index + 1 < len(merged) and merged[index + 1] is HOLE,
            )


def python_pieces(path: Path) -> Iterator[Piece]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    inner: set[int] = set()  # parts of a bigger string expression, read with it
    for node in ast.walk(tree):
        if id(node) in inner:
            continue
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
            parts = _parts(node.value)  # `text += "..."`: appended to what came before
            if parts is not None:
                inner.update(id(child) for child in ast.walk(node.value))
                yield from _pieces([HOLE, *parts])
            continue
        parts = _parts(node)
        if parts is None:
            continue
        for child in ast.walk(node):
            if child is not node:
                inner.add(id(child))
        yield from _pieces(parts)


_C_TOKEN = re.compile(
    r'"((?:[^"\\\n]|\\.)*)"'  # a string literal
    r"|'(?:[^'\\\n]|\\.)+'"  # a character literal
    r"|/\*.*?\*/|//[^\n]*"  # comments
    r"|([A-Za-z_]\w*)"  # an identifier (a macro between literals is a hole)
    r"|(\s+)"
    r"|(.)",
    re.S,
)
_C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}


def _c_unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: _C_ESCAPES.get(m.group(1), m.group(1)), text)


def c_pieces(path: Path) -> Iterator[Piece]:
    """Adjacent C string literals are one string; printf conversions and macros between
    literals are holes."""
    run: list[Part] = []
    pending_ident = False

    def flush() -> Iterator[Piece]:
        if any(part for part in run if part is not HOLE):
            text_parts: list[Part] = []
            for part in run:
                if part is HOLE:
                    text_parts.append(HOLE)
                else:
                    unescaped = _c_unescape(part.replace("%%", "\x01"))
                    for piece in _split_format(unescaped, _PRINTF):
                        text_parts.append(piece if piece is HOLE else piece.replace("\x01", "%"))
            yield from _pieces(text_parts)
        run.clear()

    for m in _C_TOKEN.finditer(path.read_text(encoding="utf-8", errors="replace")):
        literal, ident, space = m.group(1), m.group(2), m.group(3)
        if literal is not None:
            if pending_ident and run:
                run.append(HOLE)
            pending_ident = False
            run.append(literal)
        elif space is not None or m.group(0).startswith(("/*", "//")):
            continue
        elif ident is not None and run:
            pending_ident = True
        else:
            yield from flush()
            pending_ident = False
    yield from flush()


class Corpus:
    """Every piece of literal text some code holds, searchable the way `covers` needs."""

    def __init__(self, pieces: Iterable[Piece]) -> None:
        self.flags: dict[str, set[tuple[bool, bool]]] = {}
        for piece in pieces:
            self.flags.setdefault(piece.text, set()).add((piece.after_hole, piece.before_hole))
        texts = sorted(self.flags)
        self._joined = "\x02".join(texts)
        self._by_start = texts
        self._reversed = sorted((t[::-1], t) for t in texts)

    def __len__(self) -> int:
        return len(self.flags)

    def contains(self, fragment: str) -> bool:
        return fragment in self._joined

    def starting_with(self, prefix: str) -> Iterator[str]:
        at = bisect.bisect_left(self._by_start, prefix)
        while at < len(self._by_start) and self._by_start[at].startswith(prefix):
            yield self._by_start[at]
            at += 1

    def ending_with(self, suffix: str) -> Iterator[str]:
        key = suffix[::-1]
        at = bisect.bisect_left(self._reversed, (key, ""))
        while at < len(self._reversed) and self._reversed[at][0].startswith(key):
            yield self._reversed[at][1]
            at += 1

    def _fillers(self, text: str) -> set[tuple[bool, bool]]:
        """How `text` can stand in the code's text as a whole: a piece (not a one- or
        two-letter constant), or the value of a hole (a number, or the repr of a string the
        code holds, such as 'error')."""
        combos = {
            (after, before)
            for after, before in self.flags.get(text, ())
            if after or before or len(text) >= MIN_VALUE_CHARS
        }
        if _NUMBER.fullmatch(text) or (
            len(text) >= 2 and text[0] == text[-1] == "'" and text[1:-1] in self.flags
        ):
            combos.add((False, False))
        return combos

    def covers(self, fragment: str) -> bool:
        """Whether the code can say `fragment`: it lies inside one piece, or it is the end of
        a piece, then whole pieces (or values: a number, a quoted string the code holds), then
        the start of a piece, where each joint is a hole on one side: the code fills in text
        there. Two strings are never glued where neither side has a hole, and a piece of
        punctuation (`": "`, `" "`) joins only two long parts, so short constants cannot be
        strung into any sentence."""
        if self.contains(fragment):
            return True
        n = len(fragment)
        # position -> {(a hole may follow, the part before is long, a glue piece wants a long part next)}
        states: dict[int, set[tuple[bool, bool, bool]]] = {}
        for end in range(1, n):
            head = fragment[:end]
            for text in self.ending_with(head):
                for _after, before in self.flags[text]:
                    states.setdefault(end, set()).add((before, end >= LONG_PART, False))
            if _NUMBER.fullmatch(head):
                states.setdefault(end, set()).add((False, False, False))
        for start in range(1, n):
            for hole, long_before, wants_long in states.get(start, ()):
                rest = fragment[start:]
                if not wants_long or len(rest) >= LONG_PART:
                    for text in self.starting_with(rest):  # the last part: the start of a piece
                        if hole or any(after for after, _ in self.flags[text]):
                            return True
                    if hole and _NUMBER.fullmatch(rest):
                        return True
                for end in range(start + 1, n):  # a whole piece, or a value, in the middle
                    part = fragment[start:end]
                    glue = sum(ch.isalnum() for ch in part) < 2
                    if glue and (not long_before or wants_long):
                        continue
                    if not glue and wants_long and len(part) < LONG_PART:
                        continue
                    for after, before in self._fillers(part):
                        if hole or after:
                            states.setdefault(end, set()).add(
                                (before, not glue and len(part) >= LONG_PART, glue)
                            )
        return False


def package_python_files(root: Path = ROOT) -> list[Path]:
    return sorted(
        p for p in (root / "langflow_sandbox_createos").rglob("*.py") if "__pycache__" not in p.parts
    )


# Where lfx keeps the messages the docs quote: its sandbox dispatcher, its code-execution
# policy, the tweak protection and its settings (parsing all of lfx takes over 10 s).
LFX_MESSAGE_DIRS = ("utils", "processing", "services/settings")


@cache
def _our_pieces() -> tuple[Piece, ...]:
    """The package (createos-local included), the C core and the scripts `make run` uses."""
    pieces: list[Piece] = []
    for path in package_python_files():
        pieces += python_pieces(path)
    for path in sorted((ROOT / "csrc").glob("*.[ch]")):
        pieces += c_pieces(path)
    for path in sorted((ROOT / "scripts").glob("*.sh")):
        for line in path.read_text(encoding="utf-8").splitlines():
            for m in re.finditer(r'"((?:[^"\\]|\\.)*)"', line):
                parts = re.split(r"\$\{[^}]*\}|\$[A-Za-z_]\w*|\$\([^)]*\)", m.group(1))
                pieces += _pieces([x for part in parts for x in (part, HOLE)][:-1])
    return tuple(pieces)


@cache
def _lfx_pieces() -> tuple[Piece, ...]:
    import lfx

    base = Path(lfx.__file__).parent
    pieces: list[Piece] = []
    for folder in LFX_MESSAGE_DIRS:
        for path in sorted((base / folder).rglob("*.py")):
            pieces += python_pieces(path)
    return tuple(pieces)


@cache
def our_corpus() -> Corpus:
    return Corpus(_our_pieces())


@cache
def all_corpus() -> Corpus:
    """Ours and lfx's: lfx's messages name our values (its dispatcher quotes the backend's name)."""
    return Corpus([*_our_pieces(), *_lfx_pieces()])


# --- settings ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Documented:
    name: str
    default: str  # the Default cell (or its part for this name)
    path: Path
    line: int

    def where(self) -> str:
        return f"{rel(self.path)}:{self.line}"


def settings_tables() -> list[Table]:
    """Tables whose first column is headed Setting or Variable and that have a Default column."""
    return [
        table
        for path in doc_files()
        for table in tables(path)
        if table.header
        and table.header[0].strip().lower() in ("setting", "variable")
        and table.column("default")
    ]


def documented_settings() -> list[Documented]:
    found: list[Documented] = []
    for table in settings_tables():
        column = table.column("default")
        assert column is not None
        for line, cells in table.rows:
            names = [span for span in code_spans(cells[0]) if ENV_NAME.fullmatch(span)]
            default = cells[column] if column < len(cells) else ""
            spans = code_spans(default)
            if len(names) > 1 and len(spans) == len(names):  # `A`, `B` | `1`, `2`
                found += [
                    Documented(n, f"`{s}`", table.path, line) for n, s in zip(names, spans, strict=True)
                ]
            else:
                found += [Documented(n, default, table.path, line) for n in names]
    return found


_READERS = {"raw", "parse_int", "parse_bool", "parse_list", "getenv"}


def _string_names(tree: ast.AST) -> dict[str, set[str]]:
    """Names bound to string constants: `X = "..."` and `for x in ("...", "...")`."""
    bound: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        targets: list[tuple[ast.expr, ast.expr]] = []
        if isinstance(node, ast.Assign):
            targets = [(target, node.value) for target in node.targets]
        elif isinstance(node, (ast.For, ast.comprehension)):
            targets = [(node.target, node.iter)]
        for target, value in targets:
            if not isinstance(target, ast.Name):
                continue
            values = value.elts if isinstance(value, (ast.Tuple, ast.List)) else [value]
            for item in values:
                if isinstance(item, ast.Constant) and isinstance(item.value, str):
                    bound.setdefault(target.id, set()).add(item.value)
    return bound


def _is_environ(node: ast.expr) -> bool:
    text = ast.unparse(node)
    return text in ("os.environ", "environ", "env") or text.endswith("environ")


def names_read_by(path: Path) -> dict[str, str | None]:
    """Environment variables the module reads, with the default it gives in place (None when
    the reader decides the default itself: settings.raw and the parse_* functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    bound = _string_names(tree)
    read: dict[str, str | None] = {}

    def values(arg: ast.expr) -> set[str]:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return {arg.value}
        if isinstance(arg, ast.Name):
            return bound.get(arg.id, set())
        return set()

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            called = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if called in _READERS or (
                called == "get" and isinstance(func, ast.Attribute) and _is_environ(func.value)
            ):
                default = None
                if called in ("get", "getenv"):
                    second = node.args[1] if len(node.args) > 1 else None
                    default = second.value if isinstance(second, ast.Constant) else ""
                for name in values(node.args[0]):
                    if ENV_NAME.fullmatch(name):
                        read.setdefault(name, default)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value):
            for name in values(node.slice):
                if ENV_NAME.fullmatch(name):
                    read.setdefault(name, "")
    return read


def names_read_by_code() -> dict[str, tuple[str, str | None]]:
    """Every environment variable the package and the C core read: name -> (where, default in place)."""
    read: dict[str, tuple[str, str | None]] = {}
    for path in package_python_files():
        for name, default in names_read_by(path).items():
            read.setdefault(name, (rel(path), default))
    for path in sorted((ROOT / "csrc").glob("*.c")):
        for m in re.finditer(r'\bgetenv\("([A-Z0-9_]+)"\)', path.read_text(encoding="utf-8")):
            read.setdefault(m.group(1), (rel(path), ""))
    return read


def script_defaults(path: Path) -> tuple[set[str], dict[str, str]]:
    """The variables a shell script reads (`${NAME...}`) and the defaults it assigns
    (`NAME=${NAME:-default}`, with `$ROOT/` dropped)."""
    text = path.read_text(encoding="utf-8")
    mentioned = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)[:}-]", text))
    defaults = {
        m.group(1): m.group(2).replace("$ROOT/", "")
        for m in re.finditer(r"^\s*(?:export\s+)?([A-Z][A-Z0-9_]*)=\$\{\1:-([^}]*)\}", text, re.M)
    }
    return mentioned, defaults


@cache
def load_settings_module():  # type: ignore[no-untyped-def]
    """settings.py of the tree under test (stdlib only), not whatever is installed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_settings_under_test", PACKAGE / "core" / "settings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


_SIZE = re.compile(r"(\d+)\s*(KiB|MiB|GiB)")
UNSET_WORDS = ("none", "unset", "empty", "automatic", "the host's")


def default_matches(cell: str, value: object) -> bool:
    """Whether a Default cell states `value` (as the code has it with the variable unset)."""
    text = squash(cell)
    spans = code_spans(text)
    if value is None or value in ("", ()):
        literal = [span for span in spans if not ENV_NAME.fullmatch(span)]
        return bool(text) and text.lower().startswith(UNSET_WORDS) and not literal
    if isinstance(value, bool):
        return str(value).lower() in spans
    if isinstance(value, int):
        if str(value) in spans:
            return True
        size = _SIZE.search(text)
        scale = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
        return size is not None and int(size.group(1)) * scale[size.group(2)] == value
    if isinstance(value, tuple):
        return ",".join(value) in spans
    return str(value) in spans
