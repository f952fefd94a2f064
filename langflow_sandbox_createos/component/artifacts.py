"""Read the files a guest wrote back out of a `.tar.gz`, with every cost bounded.

The archive comes from the guest, so nothing in it is trusted:

- the compressed size is capped by the download (`MAX_ARCHIVE_BYTES`, enforced by the
  native client while the bytes arrive);
- decompression goes through a reader that stops at a byte budget, so a gzip bomb costs
  at most that budget in memory and CPU, whatever its ratio;
- at most `MAX_FILES` files and `MAX_TOTAL_BYTES` of file content come back;
- only regular files are read: symlinks, hard links, devices and fifos are skipped, and
  so is any member with an absolute path or a `..` component. Nothing is written to disk;
- before `tarfile` parses anything, the inflated bytes are walked header by header and an
  extended header (a pax record set, a GNU long name or link) larger than
  `MAX_EXTENDED_HEADER_BYTES` stops the read there: on CPython before 3.11.10 / 3.12.6 a
  crafted pax header made `tarfile`'s parser take time quadratic in its length while holding
  the GIL (CVE-2024-6232; 248 bytes of gzip froze a whole Langflow for 65 s), and no deadline
  checked between reads can interrupt that;
- the read is bounded in time as well: a member that declares more bytes than the budget
  has left stops the read at once (tarfile would otherwise skip over it one empty 10 KiB
  read at a time, for ever when the archive ends early), an archive that keeps being read
  after its end stops, and the whole read stops at a deadline (`MAX_SECONDS`);
- file names that are not valid UTF-8, or hold control or bidi-override characters, are
  returned escaped (`\\xNN`, `\\uNNNN`) with `path_escaped` set, so every row serialises.

Whatever was cut or skipped is described in `Extraction.notes`, never silently dropped.
"""

from __future__ import annotations

import base64
import gzip
import io
import tarfile
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Protocol

MAX_FILES = 256
MAX_TOTAL_BYTES = 5 * 1024 * 1024
MAX_ARCHIVE_BYTES = 5 * 1024 * 1024
# Tar adds a 512-byte header per member (more for long names and pax records), pads every
# member to 512 bytes and the archive to 10 KiB: room for that around MAX_TOTAL_BYTES.
DECOMPRESSED_SLACK = 2 * 1024 * 1024
# Wall clock for reading one archive (a few MiB inflate in well under a second); only a
# crafted archive gets near it.
MAX_SECONDS = 20.0
# Reads after the end of the data that tarfile may make on a well-formed archive; more means
# it is skipping past the end of a member the archive does not hold.
_READS_AFTER_END = 8
# An extended header (pax `x`/`g`, GNU long name `L` / long link `K`) bigger than this is
# refused before tarfile parses it. A long path is at most PATH_MAX (4096) bytes; pax adds a
# few short records. tarfile's pax parser costs time quadratic in the header's length on
# CPython < 3.11.10 / 3.12.6 (CVE-2024-6232): 8 KiB keeps that to milliseconds.
MAX_EXTENDED_HEADER_BYTES = 8 * 1024
_EXTENDED_TYPES = frozenset(b"xgLK")
_BLOCK = 512

ROW_COLUMNS = ("path", "size", "text", "base64", "path_escaped")

# Unicode bidi controls: they reorder how a name is displayed (U+202E shows `exe.txt` as
# `txt.exe`), so they are escaped like control characters.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


class _BudgetExceeded(Exception):
    """The archive expands beyond the decompression budget."""


class _Declared(Exception):
    """A member declares more bytes than the budget has left."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class _Overtime(Exception):
    """Reading took longer than the deadline."""


class _PastEnd(Exception):
    """The reader keeps being asked for data after the archive ended."""


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _BoundedReader(io.RawIOBase):
    """A read-only stream over `inner` that raises once more than `budget` bytes were asked for
    and exist. `gzip.GzipFile.read(n)` inflates at most what is asked, so the budget bounds
    the work too, not only the memory. It also raises when read past `deadline` (a
    `time.monotonic()` value), and when asked for more data again and again after the end."""

    def __init__(self, inner: _Readable, budget: int, deadline: float | None = None) -> None:
        super().__init__()
        self._inner = inner
        self._left = budget
        self._deadline = deadline
        self._empty_reads = 0
        self.consumed = 0

    @property
    def left(self) -> int:
        return self._left

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = self._left + 1
        if size == 0:
            return b""
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise _Overtime
        if self._left <= 0:
            if self._inner.read(1):
                raise _BudgetExceeded
            chunk = b""
        else:
            chunk = self._inner.read(min(size, self._left))
        if not chunk:
            self._empty_reads += 1
            if self._empty_reads > _READS_AFTER_END:
                raise _PastEnd
        self._left -= len(chunk)
        self.consumed += len(chunk)
        return chunk

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


@dataclass(frozen=True)
class ArtifactFile:
    path: str
    data: bytes
    path_escaped: bool = False  # `path` is `escape_name` of the real name

    @property
    def size(self) -> int:
        return len(self.data)

    def row(self) -> dict[str, Any]:
        """One Files row: the text when the bytes are UTF-8, else base64."""
        row: dict[str, Any] = {"path": self.path, "size": self.size, "text": None, "base64": None}
        try:
            row["text"] = self.data.decode("utf-8")
        except UnicodeDecodeError:
            row["base64"] = base64.b64encode(self.data).decode("ascii")
        row["path_escaped"] = self.path_escaped
        return row


@dataclass
class Extraction:
    files: list[ArtifactFile] = field(default_factory=list)
    truncated: bool = False  # a limit was hit or the archive was damaged: files are missing
    notes: list[str] = field(default_factory=list)

    @property
    def message(self) -> str:
        return " ".join(self.notes)

    def rows(self) -> list[dict[str, Any]]:
        return [f.row() for f in self.files]


def sanitize_member_path(name: str) -> str | None:
    """The relative path to report for a member, or None when it must be skipped.

    Absolute paths and any `..` component are refused rather than rewritten, so a crafted
    name can never be made to look like another file. `.` components and empty segments
    are dropped; dotfiles and directory components are kept."""
    if not name or name.startswith("/"):
        return None
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return "/".join(parts)


def _needs_escape(char: str) -> bool:
    code = ord(char)
    return code < 0x20 or 0x7F <= code < 0xA0 or 0xD800 <= code < 0xE000 or char in _BIDI


def escape_name(name: str) -> tuple[str, bool]:
    """`name` made safe to show and serialise, and whether it was changed.

    `name` is decoded from the archive with `surrogateescape`, so a byte that is not valid
    UTF-8 arrives as a lone surrogate U+DC80..U+DCFF: it becomes `\\xNN` (the raw byte).
    C0 controls and DEL become `\\xNN` too (they are that byte); C1 controls and bidi
    controls become `\\uNNNN` (the code point, whose UTF-8 bytes the name holds). When any
    escape is made, backslashes are doubled too, so the escaped form is unambiguous;
    a name that needs no escape is returned as it is."""
    if not any(_needs_escape(char) for char in name):
        return name, False
    out: list[str] = []
    for char in name:
        code = ord(char)
        if char == "\\":
            out.append("\\\\")
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x80 and _needs_escape(char):
            out.append(f"\\x{code:02x}")
        elif _needs_escape(char):
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out), True


class _Oversized(Exception):
    """An extended header larger than MAX_EXTENDED_HEADER_BYTES, at `offset`."""

    def __init__(self, offset: int, size: int) -> None:
        super().__init__(offset, size)
        self.offset = offset
        self.size = size


def _header_size(block: bytes) -> int | None:
    """The size field of a tar header block (octal, or GNU base-256), None when unreadable."""
    field = block[124:136]
    if field[:1] in (b"\x80", b"\xff"):  # base-256: a positive number is all tarfile accepts here
        return int.from_bytes(field[1:], "big") if field[:1] == b"\x80" else None
    digits = field.split(b"\0", 1)[0].strip()
    try:
        return int(digits or b"0", 8)
    except ValueError:
        return None


def _check_extended_headers(data: bytes, limit: int) -> None:
    """Walk the tar headers of `data` (inflated bytes); raise _Oversized at the first extended
    header over `limit` bytes. A header that does not parse ends the walk: tarfile then
    reports it as it would."""
    offset = 0
    while offset + _BLOCK <= len(data):
        block = data[offset : offset + _BLOCK]
        if block == bytes(_BLOCK):  # end of archive
            return
        size = _header_size(block)
        if size is None:
            return
        if block[156] in _EXTENDED_TYPES and size > limit:
            raise _Oversized(offset, size)
        offset += _BLOCK + -(-size // _BLOCK) * _BLOCK


def _inflate(archive: bytes, budget: int, deadline: float) -> tuple[bytes, BaseException | None]:
    """The archive's tar bytes (at most `budget` of them) and why inflating stopped early:
    None at the end of a valid gzip stream, else _BudgetExceeded, _Overtime, or the gzip
    error. Never raises."""
    reader = _BoundedReader(gzip.GzipFile(fileobj=io.BytesIO(archive), mode="rb"), budget, deadline)
    chunks: list[bytes] = []
    try:
        while chunk := reader.read(64 * 1024):
            chunks.append(chunk)
    except (_BudgetExceeded, _Overtime, _PastEnd, EOFError, OSError, zlib.error) as exc:
        return b"".join(chunks), exc
    return b"".join(chunks), None


def _stop_note(stopped: BaseException, budget: int, max_seconds: float, got_some: bool) -> str:
    """Why the tar read ended where inflating (or the header check) stopped."""
    after = "reading stopped there and any files after that point were not returned."
    if isinstance(stopped, _Oversized):
        return (
            f"The archive holds an extended tar header (pax record or GNU long name) of {stopped.size} "
            f"bytes, over the {MAX_EXTENDED_HEADER_BYTES} allowed; {after}"
        )
    if isinstance(stopped, _BudgetExceeded):
        return f"The archive expands to more than {_mib(budget)}; {after}"
    if isinstance(stopped, _Overtime):
        return f"Reading the archive took more than {max_seconds:g} s; {after}"
    if got_some:
        return (
            "The archive ends early (it was cut at the transfer limit, or the archive step in the guest "
            f"was stopped): the files before that point are returned ({stopped or 'end of data'})."
        )
    return f"The archive could not be read: {stopped or 'no data'}."


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB"


class _Reading:
    """What one read of an archive returned and skipped so far, and the notes that say so."""

    def __init__(self, budget: int, max_files: int, max_total_bytes: int, max_seconds: float) -> None:
        self.budget = budget
        self.max_files = max_files
        self.max_total_bytes = max_total_bytes
        self.max_seconds = max_seconds
        self.out = Extraction()
        self.unsafe = self.special = self.duplicate = self.escaped = 0
        self.over_size: list[str] = []
        self.total = 0
        self.seen: set[tuple[str, bool]] = set()

    def members(self, tar: tarfile.TarFile) -> None:
        """Every member of the stream, until the files or the budget run out."""
        for member in tar:
            # a member's data is inflated (read or skipped) up to offset_data + size: when that
            # is beyond the budget, stop now rather than walk there
            if member.size > 0 and member.offset_data + member.size > self.budget:
                raise _Declared(member.size)
            if not self._member(tar, member):
                return

    def _member(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> bool:
        """Read or skip one member; False once no more files may be returned."""
        if member.isdir():
            return True
        path = sanitize_member_path(member.name)
        if path is None:
            self.unsafe += 1
            return True
        if not member.isreg():
            self.special += 1
            return True
        shown, was_escaped = escape_name(path)
        if (shown, was_escaped) in self.seen:
            self.duplicate += 1
            return True
        if len(self.out.files) >= self.max_files:
            self.cut(
                f"More than {self.max_files} files were written; only the first {self.max_files} are returned."
            )
            return False
        if member.size > self.max_total_bytes - self.total:
            self.over_size.append(f"{shown} ({member.size} bytes)")
            return True
        handle = tar.extractfile(member)
        data = handle.read() if handle is not None else b""
        self.seen.add((shown, was_escaped))
        self.escaped += was_escaped
        self.total += len(data)
        self.out.files.append(ArtifactFile(shown, data, was_escaped))
        return True

    def cut(self, note: str) -> None:
        """Files are missing: say why."""
        self.out.truncated = True
        self.out.notes.append(note)

    def stopped_early(self, stopped: BaseException | None, exc: BaseException, got_some: bool) -> None:
        """tarfile ran out of bytes (or met a damaged block): why, and what came back."""
        if stopped is not None:  # tarfile ran out of the bytes inflating gave it: say why
            self.cut(_stop_note(stopped, self.budget, self.max_seconds, got_some))
        elif got_some:
            detail = "it declares more data than it holds" if isinstance(exc, _PastEnd) else str(exc)
            self.cut(
                "The archive ends early (it was cut at the transfer limit, or the archive step in the guest "
                f"was stopped): the files before that point are returned ({detail})."
            )
        else:
            self.cut(f"The archive could not be read: {exc}.")

    def finish(self) -> Extraction:
        """The extraction, with a note for each kind of entry that was skipped."""
        out = self.out
        if self.over_size:
            out.truncated = True
            shown_list = ", ".join(self.over_size[:5]) + (
                f" and {len(self.over_size) - 5} more" if len(self.over_size) > 5 else ""
            )
            out.notes.append(
                f"Skipped files that do not fit in the {_mib(self.max_total_bytes)} total: {shown_list}."
            )
        if self.unsafe:
            out.notes.append(
                f"Skipped {_plural(self.unsafe, 'entry', 'entries')} with an absolute or '..' path."
            )
        if self.special:
            out.notes.append(
                f"Skipped {_plural(self.special, 'entry', 'entries')} that are not regular files "
                "(symlinks, hard links, devices or fifos)."
            )
        if self.duplicate:
            out.notes.append(
                f"Skipped {_plural(self.duplicate, 'entry', 'entries')} repeating the path of an earlier file "
                "(the first one is returned)."
            )
        if self.escaped:
            out.notes.append(
                f"{_plural(self.escaped, 'file name', 'file names')} held bytes that are not UTF-8, control or bidi "
                "characters: shown escaped (\\xNN, \\uNNNN, backslash doubled) with path_escaped true."
            )
        return out


def extract(
    archive: bytes,
    *,
    max_files: int = MAX_FILES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
    max_decompressed_bytes: int | None = None,
    max_seconds: float = MAX_SECONDS,
) -> Extraction:
    """The regular files in a gzip-compressed tar, within the limits. Never raises on bad input,
    and returns within `max_seconds` whatever the archive declares."""
    budget = (
        max_decompressed_bytes if max_decompressed_bytes is not None else max_total_bytes + DECOMPRESSED_SLACK
    )
    reading = _Reading(budget, max_files, max_total_bytes, max_seconds)
    deadline = time.monotonic() + max_seconds
    # Inflated first, at most the budget, so every tar header can be checked before tarfile
    # parses it; tarfile then reads those bytes.
    inflated, stopped = _inflate(archive, budget, deadline)
    try:
        _check_extended_headers(inflated, MAX_EXTENDED_HEADER_BYTES)
    except _Oversized as exc:
        inflated, stopped = inflated[: exc.offset], exc
    reader = _BoundedReader(io.BytesIO(inflated), budget, deadline)
    after = "reading stopped there and any files after that point were not returned."
    try:
        if isinstance(stopped, (_Overtime, _BudgetExceeded)) and not inflated:
            raise stopped
        # utf-8 + surrogateescape whatever the host's locale: undecodable bytes survive as
        # lone surrogates, which escape_name turns into visible \xNN escapes
        stream = io.BufferedReader(reader)
        with tarfile.open(fileobj=stream, mode="r|", encoding="utf-8", errors="surrogateescape") as tar:
            reading.members(tar)
        if stopped is not None:  # the bytes tarfile had ended at a block boundary, where inflating stopped
            reading.cut(_stop_note(stopped, budget, max_seconds, bool(reading.out.files or reader.consumed)))
    except _BudgetExceeded:
        reading.cut(f"The archive expands to more than {_mib(budget)}; {after}")
    except _Declared as exc:
        reading.cut(
            f"The archive declares an entry of {exc.size} bytes, beyond the {_mib(budget)} it may expand to; "
            f"{after}"
        )
    except _Overtime:
        reading.cut(f"Reading the archive took more than {max_seconds:g} s; {after}")
    except (_PastEnd, EOFError, tarfile.ReadError) as exc:
        reading.stopped_early(stopped, exc, bool(reading.out.files or reader.consumed))
    except (OSError, zlib.error, tarfile.TarError, ValueError) as exc:  # BadGzipFile is an OSError
        reading.cut(f"The archive could not be read: {exc}.")
    return reading.finish()
