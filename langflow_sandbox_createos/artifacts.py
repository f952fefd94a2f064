"""Read the files a guest wrote back out of a `.tar.gz`, with every cost bounded.

The archive comes from the guest, so nothing in it is trusted:

- the compressed size is capped by the download (`MAX_ARCHIVE_BYTES`, enforced by the
  native client while the bytes arrive);
- decompression goes through a reader that stops at a byte budget, so a gzip bomb costs
  at most that budget in memory and CPU, whatever its ratio;
- at most `MAX_FILES` files and `MAX_TOTAL_BYTES` of file content come back;
- only regular files are read: symlinks, hard links, devices and fifos are skipped, and
  so is any member with an absolute path or a `..` component. Nothing is written to disk.

Whatever was cut or skipped is described in `Extraction.notes`, never silently dropped.
"""

from __future__ import annotations

import base64
import gzip
import io
import tarfile
import zlib
from dataclasses import dataclass, field
from typing import Any

MAX_FILES = 256
MAX_TOTAL_BYTES = 5 * 1024 * 1024
MAX_ARCHIVE_BYTES = 5 * 1024 * 1024
# Tar adds a 512-byte header per member (more for long names and pax records), pads every
# member to 512 bytes and the archive to 10 KiB: room for that around MAX_TOTAL_BYTES.
DECOMPRESSED_SLACK = 2 * 1024 * 1024

ROW_COLUMNS = ("path", "size", "text", "base64")


class _BudgetExceeded(Exception):
    """The archive expands beyond the decompression budget."""


class _BoundedReader(io.RawIOBase):
    """A read-only stream over `inner` that raises once more than `budget` bytes were asked for
    and exist. `gzip.GzipFile.read(n)` inflates at most what is asked, so the budget bounds
    the work too, not only the memory."""

    def __init__(self, inner: io.BufferedIOBase, budget: int) -> None:
        super().__init__()
        self._inner = inner
        self._left = budget
        self.consumed = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = self._left + 1
        if size == 0:
            return b""
        if self._left <= 0:
            if self._inner.read(1):
                raise _BudgetExceeded
            return b""
        chunk = self._inner.read(min(size, self._left))
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

    @property
    def size(self) -> int:
        return len(self.data)

    def row(self) -> dict[str, Any]:
        """One Files row: the text when the bytes are UTF-8, else base64."""
        try:
            return {"path": self.path, "size": self.size, "text": self.data.decode("utf-8"), "base64": None}
        except UnicodeDecodeError:
            encoded = base64.b64encode(self.data).decode("ascii")
            return {"path": self.path, "size": self.size, "text": None, "base64": encoded}


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


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB"


def extract(
    archive: bytes,
    *,
    max_files: int = MAX_FILES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
    max_decompressed_bytes: int | None = None,
) -> Extraction:
    """The regular files in a gzip-compressed tar, within the limits. Never raises on bad input."""
    budget = (
        max_decompressed_bytes if max_decompressed_bytes is not None else max_total_bytes + DECOMPRESSED_SLACK
    )
    out = Extraction()
    unsafe = special = 0
    over_size: list[str] = []
    total = 0
    seen: set[str] = set()
    reader = _BoundedReader(gzip.GzipFile(fileobj=io.BytesIO(archive), mode="rb"), budget)
    try:
        with tarfile.open(fileobj=io.BufferedReader(reader), mode="r|") as tar:
            for member in tar:
                if member.isdir():
                    continue
                path = sanitize_member_path(member.name)
                if path is None:
                    unsafe += 1
                    continue
                if not member.isreg():
                    special += 1
                    continue
                if path in seen:
                    continue
                if len(out.files) >= max_files:
                    out.truncated = True
                    out.notes.append(
                        f"More than {max_files} files were written; only the first {max_files} are returned."
                    )
                    break
                if member.size > max_total_bytes - total:
                    over_size.append(f"{path} ({member.size} bytes)")
                    continue
                handle = tar.extractfile(member)
                data = handle.read() if handle is not None else b""
                seen.add(path)
                total += len(data)
                out.files.append(ArtifactFile(path, data))
    except _BudgetExceeded:
        out.truncated = True
        out.notes.append(
            f"The archive expands to more than {_mib(budget)}; reading stopped there and any files after "
            "that point were not returned."
        )
    except (EOFError, tarfile.ReadError) as exc:
        out.truncated = True
        if out.files or reader.consumed:
            out.notes.append(
                "The archive ends early (it was cut at the transfer limit, or the archive step in the guest "
                f"was stopped): the files before that point are returned ({exc})."
            )
        else:
            out.notes.append(f"The archive could not be read: {exc}.")
    except (OSError, zlib.error, tarfile.TarError, ValueError) as exc:  # BadGzipFile is an OSError
        out.truncated = True
        out.notes.append(f"The archive could not be read: {exc}.")
    if over_size:
        out.truncated = True
        shown = ", ".join(over_size[:5]) + (f" and {len(over_size) - 5} more" if len(over_size) > 5 else "")
        out.notes.append(f"Skipped files that do not fit in the {_mib(max_total_bytes)} total: {shown}.")
    if unsafe:
        out.notes.append(
            f"Skipped {unsafe} entr{'y' if unsafe == 1 else 'ies'} with an absolute or '..' path."
        )
    if special:
        out.notes.append(
            f"Skipped {special} entr{'y' if special == 1 else 'ies'} that are not regular files "
            "(symlinks, hard links, devices or fifos)."
        )
    return out
