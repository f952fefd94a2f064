"""Memory safety at the Python boundary: buffers owned for the whole call, hostile mappings and
sequences refused with clear errors, NUL bytes kept, bounds on numbers, half-made objects."""

from __future__ import annotations

import gc
import hashlib
import threading
from typing import Any

import pytest

from langflow_sandbox_createos import _createos
from langflow_sandbox_createos.local.testing import LocalControlPlane

from .conftest import SHAPE

E = _createos


def test_files_cleared_by_another_thread_during_run_program_are_still_sent(
    client: E.Client, cp: LocalControlPlane
) -> None:
    """The caller's own list is cleared while the create is slow: the bytes must stay alive
    (the old code kept only the list and segfaulted inside libcurl)."""
    data = hashlib.sha256(b"seed").digest() * (1 << 20)  # 32 MiB
    files = [("/workspace/big.bin", bytes(data))]
    del data
    cp.set_faults({"rules": [{"route": "create", "latency_ms": 1500, "times": 1}]})
    started = threading.Event()

    def clear() -> None:
        started.wait()
        threading.Event().wait(0.5)
        files.clear()
        gc.collect()

    t = threading.Thread(target=clear)
    t.start()
    started.set()
    r = client.run_program({"shape": SHAPE}, "sha256sum", ["/workspace/big.bin"], files=files, timeout=60)
    t.join()
    assert files == []
    expected = hashlib.sha256(hashlib.sha256(b"seed").digest() * (1 << 20)).hexdigest()
    assert r.exit_code == 0 and r.stdout.split()[0] == expected, r


class LyingItems(dict):  # type: ignore[type-arg]
    def __init__(self, items: Any) -> None:
        super().__init__(shape=SHAPE)
        self._items = items

    def items(self) -> Any:  # type: ignore[override]
        return self._items


@pytest.mark.parametrize("items", [[12345], [("k",)], [("k", 1, 2)], ["ab"], [None], [(1, "v")]], ids=repr)
def test_mapping_items_that_are_not_pairs_are_type_errors(
    client: E.Client, sandbox: dict[str, Any], items: Any
) -> None:
    bad = LyingItems(items)
    sid = sandbox["id"]
    with pytest.raises(TypeError):
        client.create(bad)
    with pytest.raises(TypeError):
        client.fork(sid, bad)
    with pytest.raises(TypeError):
        client.patch(sid, bad)
    with pytest.raises(TypeError):
        client.exec(sid, "true", env=bad, timeout=5)
    with pytest.raises(TypeError):
        client.run_program({"shape": SHAPE}, "true", env=bad, timeout=5)


def test_items_list_mutated_by_nested_user_code_is_snapshotted(client: E.Client) -> None:
    """items() hands out a list it keeps; a nested mapping's items() clears it mid-conversion."""
    outer_items: list[tuple[str, Any]] = []

    class Clearing(dict):  # type: ignore[type-arg]
        def items(self) -> Any:  # type: ignore[override]
            outer_items.clear()
            gc.collect()
            return [("x", "y" * 100)]

    class Outer(dict):  # type: ignore[type-arg]
        def items(self) -> Any:  # type: ignore[override]
            return outer_items

    outer_items.extend([("a", Clearing()), ("b", "z" * 1000), ("c", [1, 2, 3])])
    # the conversion itself must finish on the snapshot; the server then refuses the spec
    with pytest.raises(E.CreateOSError):
        client.create(Outer())

    seq: list[Any] = []

    class ClearingSeq(dict):  # type: ignore[type-arg]
        def items(self) -> Any:  # type: ignore[override]
            seq.clear()
            gc.collect()
            return []

    seq.extend([ClearingSeq(), "w" * 1000, "v" * 1000])
    with pytest.raises(E.CreateOSError):
        client.create({"shape": seq})


def test_out_of_range_numbers_are_value_errors(client: E.Client, sandbox: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="JSON range"):
        client.create({"shape": SHAPE, "auto_pause_after_seconds": 1 << 70})
    with pytest.raises(ValueError, match="JSON range"):
        client.create({"shape": SHAPE, "x": -(1 << 64)})
    for bad in (-1, E.MAX_OUTPUT_BYTES_LIMIT + 1, (1 << 62)):
        with pytest.raises(ValueError, match="max_output_bytes"):
            client.exec(sandbox["id"], "true", timeout=5, max_output_bytes=bad)
        with pytest.raises(ValueError, match="max_output_bytes"):
            client.run_program({"shape": SHAPE}, "true", timeout=5, max_output_bytes=bad)
    with pytest.raises(OverflowError):
        client.exec(sandbox["id"], "true", timeout=5, max_output_bytes=1 << 80)
    r = client.exec(sandbox["id"], "echo", ["ok"], timeout=10, max_output_bytes=E.MAX_OUTPUT_BYTES_LIMIT)
    assert r.stdout == "ok\n"


def test_surrogates_are_refused_not_sent(client: E.Client, sandbox: dict[str, Any]) -> None:
    with pytest.raises(UnicodeEncodeError):
        client.create({"shape": SHAPE, "name": "a\udcffb"})
    with pytest.raises(UnicodeEncodeError):
        client.exec(sandbox["id"], "cat", stdin="\ud800", timeout=5)


def test_stdin_keeps_embedded_nul(client: E.Client, sandbox: dict[str, Any]) -> None:
    r = client.exec(sandbox["id"], "od", ["-An", "-c"], stdin="abc\x00def", timeout=10)
    assert r.exit_code == 0
    assert r.stdout.split() == ["a", "b", "c", "\\0", "d", "e", "f"], r.stdout
    r = client.run_program({"shape": SHAPE}, "wc", ["-c"], stdin="x\x00y\x00", timeout=30)
    assert r.stdout.strip() == "4"


# Every byte below 0x20, the two JSON must escape, DEL, and UTF-8 of two, three and four
# bytes, U+2028 and U+FFFF among them: jsonquote.c writes the stdin field of the exec body.
EVERY_KIND_OF_TEXT = "".join(map(chr, range(0x20))) + '"\\/\x7f é € \u2028 \uffff 😀 end' * 300


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_stdin_reaches_the_guest_byte_for_byte(
    client: E.Client, sandbox: dict[str, Any], stream: bool
) -> None:
    """The exec body's stdin is quoted by the client's own JSON writer, not jansson's: the
    guest must read back exactly the UTF-8 of the text sent."""
    want = hashlib.sha256(EVERY_KIND_OF_TEXT.encode()).hexdigest()
    r = client.exec(
        sandbox["id"], "sha256sum", stdin=EVERY_KIND_OF_TEXT, timeout=10, stream=stream, on_output=None
    )
    assert r.exit_code == 0, r.stderr
    assert r.stdout.split()[0] == want


def test_json_keys_keep_embedded_nul(client: E.Client) -> None:
    """A key is sent whole: the server sees (and refuses) "A\\x00B", not a silently cut "A".
    jansson before 2.14 cannot hold it: refused with ValueError, still never cut."""
    if "json_keys_with_nul" in E.build_features:
        with pytest.raises(E.UnavailableError, match=r"A\\x00B"):
            client.create({"shape": SHAPE, "envs": {"A\x00B": "v"}})
    else:
        with pytest.raises(ValueError, match=r"needs jansson 2\.14"):
            client.create({"shape": SHAPE, "envs": {"A\x00B": "v"}})


def test_methods_on_an_uninitialised_client_raise_runtime_error() -> None:
    c = E.Client.__new__(E.Client)
    for call in (c.whoami, c.shapes, lambda: c.get("sb-x"), lambda: c.exec("sb-x", "true", timeout=1)):
        with pytest.raises(RuntimeError, match="not initialised"):
            call()
    assert c.pending_deletes() == 0 and c.drain_deletes() == []
    c.close()


def test_failed_init_leaves_nothing_half_made(cp: LocalControlPlane) -> None:
    c = E.Client.__new__(E.Client)
    with pytest.raises(ValueError, match="user_agent"):
        c.__init__(cp.url, cp.api_key, user_agent="bad\x01")  # type: ignore[misc]
    with pytest.raises(RuntimeError, match="not initialised"):
        c.whoami()
    c.__init__(cp.url, cp.api_key)  # type: ignore[misc]
    assert c.whoami()
    c.close()


def test_exec_result_takes_part_in_gc() -> None:
    r = E.ExecResult(stdout="x")
    assert gc.is_tracked(r)
    holder: list[Any] = []
    cyc = E.ExecResult(error=holder)
    holder.append(cyc)
    del cyc, holder
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is E.ExecResult and isinstance(o.error, list)]
