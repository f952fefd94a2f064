"""Guest path mapping for the files API, with symlink containment.

Only ``/workspace`` and ``/tmp`` are writable in a createos-local guest, so uploads and
downloads are limited to those trees; any other absolute path is refused with 400.
A path whose resolved location (symlinks followed) leaves the sandbox's directory is refused.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

from .envelope import ApiError, bad_request
from .guest import GuestLayout


def _within(path: Path, base: Path) -> bool:
    return path == base or base in path.parents


def normalise(raw: str | None) -> str:
    if not raw:
        raise bad_request("query parameter path is required", "path")
    if not raw.startswith("/"):
        raise bad_request(f"path must be absolute: {raw!r}", "path")
    if "\x00" in raw:
        raise bad_request("path must not contain NUL bytes", "path")
    return posixpath.normpath(raw).replace("//", "/")


def _split(layout: GuestLayout, guest_path: str) -> tuple[Path, str]:
    mounted = layout.mount_for(guest_path)
    if mounted is None:
        raise bad_request(
            f"createos-local keeps guest files only under /workspace and /tmp, not {guest_path!r}", "path"
        )
    return mounted


def host_path_for_write(layout: GuestLayout, guest_path: str) -> Path:
    base, rel = _split(layout, guest_path)
    if not rel:
        raise bad_request(f"{guest_path} is a directory", "path")
    base_real = base.resolve()
    target = base / rel
    probe = target.parent
    while not probe.exists() and probe != base:
        probe = probe.parent
    if not _within(probe.resolve(), base_real):
        raise bad_request(f"path {guest_path!r} escapes the sandbox through a symlink", "path")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise bad_request(f"a parent of {guest_path!r} is not a directory", "path") from exc
    if not _within(target.parent.resolve(), base_real):
        raise bad_request(f"path {guest_path!r} escapes the sandbox through a symlink", "path")
    if target.is_dir() and not target.is_symlink():
        raise bad_request(f"{guest_path} is a directory", "path")
    return target


def host_path_for_read(layout: GuestLayout, guest_path: str) -> Path:
    base, rel = _split(layout, guest_path)
    target = (base / rel).resolve()
    if not _within(target, base.resolve()) or not target.exists():
        raise ApiError(404, f"file not found: {guest_path}", "file_not_found")
    if not target.is_file():
        raise bad_request(f"{guest_path} is not a regular file", "path")
    return target


def open_upload(target: Path) -> tuple[int, Path]:
    """A fresh temporary file next to ``target`` (renamed over it once complete)."""
    tmp = target.with_name(f".{target.name}.upload-{os.getpid()}-{id(target):x}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    return fd, tmp
