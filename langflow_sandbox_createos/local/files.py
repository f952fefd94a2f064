"""The files API on a guest's root: every path is resolved and opened in one step.

A guest owns its root and can swap any directory for a symlink at any moment, so a path is
never checked first and opened later. Each lookup is one ``openat2(2)`` from a descriptor of
the guest's root with ``RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS``: ``..`` and symlinks
(absolute ones included) resolve as they would for the guest, inside its root, and
``/proc/*/fd``-style magic links are refused. Directories are created one component at a time
relative to the descriptor of their resolved parent, uploads are written to a fresh
``O_EXCL | O_NOFOLLOW`` temporary file in that parent and renamed within it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import posixpath
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from .envelope import ApiError, bad_request
from .mounts import RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS, openat2

RESOLVE = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
_RETRIES = 16  # openat2 answers EAGAIN when a concurrent rename races a ".." walk


def normalise(raw: str | None) -> str:
    if not raw:
        raise bad_request("query parameter path is required", "path")
    if not raw.startswith("/"):
        raise bad_request(f"path must be absolute: {raw!r}", "path")
    if "\x00" in raw:
        raise bad_request("path must not contain NUL bytes", "path")
    return posixpath.normpath(raw).replace("//", "/")


def _components(guest_path: str) -> list[str]:
    return [part for part in guest_path.split("/") if part and part != "."]


def _resolve(root_fd: int, rel: str, flags: int) -> int:
    for _ in range(_RETRIES):
        try:
            return openat2(root_fd, rel or ".", flags, RESOLVE)
        except BlockingIOError:
            continue
    raise ApiError(503, "the guest keeps renaming this path; try again", "path_busy")


@contextlib.contextmanager
def _root(fs: Path) -> Iterator[int]:
    fd = os.open(fs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def open_for_read(fs: Path, guest_path: str) -> tuple[int, int]:
    """An open descriptor of the guest's regular file and its size (404 when missing)."""
    with _root(fs) as root_fd:
        try:
            fd = _resolve(
                root_fd, "/".join(_components(guest_path)), os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
            )
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise ApiError(404, f"file not found: {guest_path}", "file_not_found") from exc
        except OSError as exc:
            raise bad_request(f"{guest_path}: {exc.strerror}", "path") from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise bad_request(f"{guest_path} is not a regular file", "path")
    os.set_blocking(fd, True)
    return fd, info.st_size


@dataclass
class Upload:
    """A temporary file in the resolved parent directory, renamed over the target on commit."""

    parent_fd: int
    tmp_name: str
    name: str
    fd: int
    guest_path: str

    def commit(self) -> None:
        os.close(self.fd)
        self.fd = -1
        try:
            os.rename(self.tmp_name, self.name, src_dir_fd=self.parent_fd, dst_dir_fd=self.parent_fd)
        except OSError as exc:
            if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise bad_request(f"{self.guest_path} is a directory", "path") from exc
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp_name, dir_fd=self.parent_fd)
        os.close(self.parent_fd)


def _make_parents(root_fd: int, parts: list[str], owner: tuple[int, int] | None, guest_path: str) -> int:
    """The O_PATH descriptor of the directory ``parts`` names, creating what is missing."""
    parent = os.dup(root_fd)
    try:
        for i, part in enumerate(parts):
            rel = "/".join(parts[: i + 1])
            try:
                child = _resolve(root_fd, rel, os.O_PATH | os.O_DIRECTORY)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=parent)
                    if owner is not None:
                        os.chown(part, *owner, dir_fd=parent, follow_symlinks=False)
                child = _resolve(root_fd, rel, os.O_PATH | os.O_DIRECTORY)
            os.close(parent)
            parent = child
    except (NotADirectoryError, FileNotFoundError) as exc:
        os.close(parent)
        raise bad_request(f"a parent of {guest_path!r} is not a directory", "path") from exc
    except BaseException:
        os.close(parent)
        raise
    return parent


def open_upload(fs: Path, guest_path: str, owner: tuple[int, int] | None) -> Upload:
    """Create the parents of ``guest_path`` (owned by ``owner``) and a temporary file beside it."""
    parts = _components(guest_path)
    if not parts:
        raise bad_request(f"{guest_path} is a directory", "path")
    with _root(fs) as root_fd:
        parent = _make_parents(root_fd, parts[:-1], owner, guest_path)
    tmp_name = f".upload-{secrets.token_hex(8)}"
    try:
        fd = os.open(
            tmp_name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=parent,
        )
        if owner is not None:
            os.fchown(fd, *owner)
    except BaseException:
        os.close(parent)
        raise
    return Upload(parent, tmp_name, parts[-1], fd, guest_path)


class FileDescriptorResponse(Response):
    """Raw bytes of an already opened file (so nothing is looked up again by path)."""

    media_type = "application/octet-stream"
    chunk_bytes = 1024 * 1024

    def __init__(self, fd: int, size: int) -> None:
        super().__init__(content=None, status_code=200, media_type=self.media_type)
        self.fd = fd
        self.size = size
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"] + [
            (b"content-length", str(size).encode())
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            if scope.get("method") == "HEAD":
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            left = self.size  # a file that grows meanwhile is cut at the length announced
            while left > 0:
                chunk = await asyncio.to_thread(os.read, self.fd, min(left, self.chunk_bytes))
                if not chunk:
                    break
                left -= len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            os.close(self.fd)
