"""Unit tests of the bounded tar reader (no guest needed)."""

from __future__ import annotations

import base64
import gzip
import io
import random
import tarfile
import threading
import time

import orjson
import pytest

from langflow_sandbox_createos.component import artifacts
from langflow_sandbox_createos.component.artifacts import extract, sanitize_member_path

from .conftest import StallWatch


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
    assert rows["sub/report.txt"] == {
        "path": "sub/report.txt",
        "size": 7,
        "text": "héllo\n",
        "base64": None,
        "path_escaped": False,
    }
    assert rows["sub/blob.bin"]["text"] is None
    assert base64.b64decode(rows["sub/blob.bin"]["base64"]) == binary
    assert rows["sub/blob.bin"]["size"] == 256
    assert rows["empty"] == {"path": "empty", "size": 0, "text": "", "base64": None, "path_escaped": False}


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
    # the member declares its 4 GiB: reading stops before inflating any of it
    assert "declares an entry of 4294967296 bytes, beyond the 7 MiB" in out.message


def test_header_data_tarfile_reads_itself_stops_at_the_header_check() -> None:
    # a GNU long name is read by tarfile, not by a member read: the header check (before
    # tarfile) stops it, as the budget did before it (and would still: it is 9 MiB)
    archive = _tar([_file("./ok", b"ok"), _file("n" * (9 * 1024 * 1024), b"x")])
    out = extract(archive)
    assert out.truncated and f"of {9 * 1024 * 1024 + 1} bytes, over the 8192 allowed" in out.message
    assert [f.path for f in out.files] == ["ok"]


def _pax_quadratic(digits: int) -> bytes:
    """CVE-2024-6232's shape: a pax header of `digits` digits, which tarfile's pax parser
    (CPython < 3.11.10 / 3.12.6) takes time quadratic in, holding the GIL."""
    header = tarfile.TarInfo("././@PaxHeader")
    header.type = tarfile.XHDTYPE
    header.size = digits
    raw = header.tobuf(format=tarfile.USTAR_FORMAT) + b"1" * digits + b"\0" * (-digits % 512 + 1024)
    return gzip.compress(raw)


def test_a_quadratic_pax_header_is_refused_before_tarfile_parses_it() -> None:
    archive = _pax_quadratic(150_000)
    assert len(archive) < 300  # the review's 248 bytes
    with StallWatch(period=0.01) as watch:
        out = _extract_in_thread(archive)
    assert watch.longest < 1.0, watch.longest  # 64.7 s of every thread before (at this size)
    assert out.files == [] and out.truncated
    assert "extended tar header (pax record or GNU long name) of 150000 bytes" in out.message
    # a pax header of an ordinary size still works: a long name tarfile writes as pax
    long_name = "d/" * 1500 + "f.txt"
    info = tarfile.TarInfo(long_name)
    info.size = 2
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(b"ok"))
    assert [f.path for f in extract(buffer.getvalue()).files] == [long_name]


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


@pytest.mark.parametrize(
    "payload",
    [b"", b"not a gzip at all", gzip.compress(b"not a tar" * 100, mtime=0)],
    ids=["empty", "text", "gzip-not-tar"],
)
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


def _declaring(name: str, size: int, *, then: bytes = b"") -> bytes:
    """A tiny tar.gz whose one member declares `size` bytes and holds none of them."""
    header = tarfile.TarInfo(name)
    header.size = size
    return gzip.compress(header.tobuf(format=tarfile.GNU_FORMAT) + then)


def _extract_in_thread(archive: bytes, seconds: float = 120.0) -> artifacts.Extraction:
    """extract() on a daemon thread, so a reader that spins fails the test instead of hanging it."""
    box: list[artifacts.Extraction] = []
    worker = threading.Thread(target=lambda: box.append(extract(archive)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert box, f"extract() still running after {seconds:g} s"
    return box[0]


@pytest.mark.parametrize("name", ["../skipped", "./big.bin"])
def test_member_declaring_a_petabyte_stops_at_once_with_a_note(name: str) -> None:
    # e8f911e: tarfile skipped the member one empty 10 KiB read at a time, ~10**11 reads
    archive = _declaring(name, 10**15)
    assert len(archive) < 200
    out = _extract_in_thread(archive)
    assert out.files == [] and out.truncated
    assert "declares an entry of 1000000000000000 bytes" in out.message


def test_member_declaring_more_than_it_holds_within_budget_ends_early() -> None:
    # a skipped member within the budget whose data is missing: the reader notices it is
    # being read past the end instead of serving hundreds of empty reads
    archive = _declaring("../skipped", 6 * 1024 * 1024)
    reads = 0
    original = artifacts._BoundedReader.read

    def counting(self: artifacts._BoundedReader, size: int | None = -1) -> bytes:
        nonlocal reads
        reads += 1
        return original(self, size)

    artifacts._BoundedReader.read = counting  # type: ignore[method-assign]
    try:
        out = _extract_in_thread(archive)
    finally:
        artifacts._BoundedReader.read = original  # type: ignore[method-assign]
    assert out.truncated and "ends early" in out.message
    assert reads < 50


def test_reading_stops_at_the_deadline() -> None:
    archive = _tar([_file("./a", b"x" * 100_000)])
    out = extract(archive, max_seconds=-1.0)
    assert out.files == [] and out.truncated
    assert "took more than -1 s" in out.message
    assert extract(archive).files[0].data == b"x" * 100_000


def test_duplicate_entries_are_reported() -> None:
    archive = _tar([_file("./a", b"first"), _file("a", b"second"), _file("./b", b"b")])
    out = extract(archive)
    assert [(f.path, f.data) for f in out.files] == [("a", b"first"), ("b", b"b")]
    assert "Skipped 1 entry repeating the path of an earlier file" in out.message


def _raw_names_tar(names: list[bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT, encoding="utf-8") as tar:
        for name in names:
            info = tarfile.TarInfo(name.decode("utf-8", "surrogateescape"))
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    return gzip.compress(raw.getvalue())


def test_unsafe_names_come_back_escaped_marked_and_serialisable() -> None:
    names = [
        b"caf\xe9.txt",  # latin-1, not UTF-8
        b"\x1b[31mred",  # ESC
        "evil\u202etxt.exe".encode(),  # right-to-left override
        "c1\u0085x".encode(),  # C1 control
        b"back\\slash\x7f",  # backslash plus DEL: the backslash is doubled
        "plain-\u00e9t\u00e9.txt".encode(),  # fine as it is
    ]
    out = extract(_raw_names_tar(names))
    rows = out.rows()
    assert [(r["path"], r["path_escaped"]) for r in rows] == [
        ("caf\\xe9.txt", True),
        ("\\x1b[31mred", True),
        ("evil\\u202etxt.exe", True),
        ("c1\\u0085x", True),
        ("back\\\\slash\\x7f", True),
        ("plain-\u00e9t\u00e9.txt", False),
    ]
    assert "5 file names held bytes that are not UTF-8" in out.message
    decoded = orjson.loads(orjson.dumps(rows))
    assert decoded == rows


def test_escaping_is_unambiguous() -> None:
    # an ESC and the four characters "\x1b" must not come back as the same row
    out = extract(_raw_names_tar([b"\x1b", b"\\x1b"]))
    assert [(r["path"], r["path_escaped"]) for r in out.rows()] == [("\\x1b", True), ("\\x1b", False)]
    assert out.notes == [
        "1 file name held bytes that are not UTF-8, control or bidi characters: "
        "shown escaped (\\xNN, \\uNNNN, backslash doubled) with path_escaped true."
    ]
