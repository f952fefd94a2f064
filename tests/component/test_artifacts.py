"""Unit tests of the bounded tar reader (no guest needed)."""

from __future__ import annotations

import base64
import gzip
import io
import random
import tarfile
import time

import pytest

from langflow_sandbox_createos import artifacts
from langflow_sandbox_createos.artifacts import extract, sanitize_member_path


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return gzip.compress(raw.getvalue())


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("./a.txt", "a.txt"),
        ("a.txt", "a.txt"),
        ("./sub/dir/b.bin", "sub/dir/b.bin"),
        (".env", ".env"),
        ("./.hidden/.x", ".hidden/.x"),
        ("sub//./c", "sub/c"),
        ("a..b", "a..b"),
        ("../evil", None),
        ("./../evil", None),
        ("a/../../b", None),
        ("a/..", None),
        ("/etc/passwd", None),
        ("//x", None),
        (".", None),
        ("./", None),
        ("", None),
    ],
)
def test_sanitize_member_path(name: str, expected: str | None) -> None:
    assert sanitize_member_path(name) == expected


def test_text_binary_dotfiles_and_directories() -> None:
    binary = bytes(range(256))
    dir_info = tarfile.TarInfo("./sub")
    dir_info.type = tarfile.DIRTYPE
    archive = _tar(
        [
            (dir_info, None),
            _file("./sub/report.txt", "héllo\n".encode()),
            _file("./sub/blob.bin", binary),
            _file("./.env", b"A=1\n"),
            _file("./empty", b""),
        ]
    )
    out = extract(archive)
    assert not out.truncated and out.notes == []
    rows = {row["path"]: row for row in out.rows()}
    assert set(rows) == {"sub/report.txt", "sub/blob.bin", ".env", "empty"}
    assert rows["sub/report.txt"] == {"path": "sub/report.txt", "size": 7, "text": "héllo\n", "base64": None}
    assert rows["sub/blob.bin"]["text"] is None
    assert base64.b64decode(rows["sub/blob.bin"]["base64"]) == binary
    assert rows["sub/blob.bin"]["size"] == 256
    assert rows["empty"] == {"path": "empty", "size": 0, "text": "", "base64": None}


def test_traversal_absolute_and_special_members_are_skipped_and_reported() -> None:
    archive = _tar(
        [
            _file("../escape.txt", b"x"),
            _file("./a/../../escape2.txt", b"x"),
            _file("/etc/evil", b"x"),
            _special("./link", tarfile.SYMTYPE, "/etc/passwd"),
            _special("./hard", tarfile.LNKTYPE, "./ok.txt"),
            _special("./fifo", tarfile.FIFOTYPE),
            _special("./dev", tarfile.CHRTYPE),
            _file("./ok.txt", b"fine"),
        ]
    )
    out = extract(archive)
    assert [f.path for f in out.files] == ["ok.txt"]
    assert not out.truncated
    assert "Skipped 3 entries with an absolute or '..' path." in out.message
    assert "Skipped 4 entries that are not regular files" in out.message


def test_file_count_limit() -> None:
    archive = _tar([_file(f"./f{i:03}", b"x") for i in range(300)])
    out = extract(archive)
    assert len(out.files) == artifacts.MAX_FILES == 256
    assert out.truncated
    assert "only the first 256 are returned" in out.message


def test_total_size_limit_skips_what_does_not_fit() -> None:
    three_mib = b"a" * (3 * 1024 * 1024)
    archive = _tar([_file("./big1", three_mib), _file("./big2", three_mib), _file("./small", b"s")])
    out = extract(archive)
    assert [f.path for f in out.files] == ["big1", "small"]
    assert out.truncated
    assert "big2 (3145728 bytes)" in out.message


def _bomb(decompressed_gib: int) -> bytes:
    """A tar.gz whose single member claims `decompressed_gib` GiB of zeros, built from repeated
    gzip members so building it costs nothing."""
    header = tarfile.TarInfo("./bomb")
    header.size = decompressed_gib * 1024**3
    block = gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9)
    return gzip.compress(header.tobuf(format=tarfile.GNU_FORMAT)) + block * (16 * decompressed_gib)


def test_gzip_bomb_costs_at_most_the_budget() -> None:
    bomb = _bomb(4)
    assert len(bomb) < artifacts.MAX_ARCHIVE_BYTES  # fits through the transfer limit
    started = time.monotonic()
    out = extract(bomb)
    assert time.monotonic() - started < 5
    assert out.files == [] and out.truncated
    assert "expands to more than" in out.message


def test_bounded_reader_stops_at_budget() -> None:
    inner = gzip.GzipFile(fileobj=io.BytesIO(gzip.compress(b"z" * 100_000)), mode="rb")
    reader = artifacts._BoundedReader(inner, 1000)
    assert len(reader.read(600)) == 600
    assert len(reader.read(600)) == 400
    with pytest.raises(artifacts._BudgetExceeded):
        reader.read(1)
    exact = artifacts._BoundedReader(io.BytesIO(b"abc"), 3)  # type: ignore[arg-type]
    assert exact.read(10) == b"abc" and exact.read(10) == b""


def test_archive_cut_short_returns_the_files_before_the_cut() -> None:
    # compressed content does not compress again, so half the archive holds about half the files
    noisy = [_file(f"./n{i}", random.Random(i).randbytes(200_000)) for i in range(4)]
    whole = _tar(noisy)
    out = extract(whole[: len(whole) // 2])
    assert out.truncated
    assert 1 <= len(out.files) < 4
    assert "ends early" in out.message


@pytest.mark.parametrize("payload", [b"", b"not a gzip at all", gzip.compress(b"not a tar" * 100)])
def test_garbage_is_reported_not_raised(payload: bytes) -> None:
    out = extract(payload)
    assert out.files == []
    assert out.truncated
    assert out.message


def test_empty_directory_archive() -> None:
    dir_info = tarfile.TarInfo(".")
    dir_info.type = tarfile.DIRTYPE
    out = extract(_tar([(dir_info, None)]))
    assert out.files == [] and not out.truncated and out.message == ""
