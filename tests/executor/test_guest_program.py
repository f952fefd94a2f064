"""The guest runner's one text, assembled from the shared frame format and the guest modules:
it compiles, it is one program (one definition of each name), and its frames and spec MACs are
the host's, byte for byte. No guest needed."""

from __future__ import annotations

import ast
import json
import os
import threading
import time
from typing import Any

import pytest

from langflow_sandbox_createos.executor import framing
from langflow_sandbox_createos.executor.guest import RUNNER_MODULES, module_text, runner_source
from langflow_sandbox_createos.executor.reader import FrameReader


def _runner() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "runner_under_test"}
    exec(compile(runner_source(), "createos-runner.py", "exec"), namespace)
    return namespace


def _defined(tree: ast.Module) -> list[str]:
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return names


def test_the_text_compiles_and_defines_main() -> None:
    runner = _runner()
    assert callable(runner["main"])
    tree = ast.parse(runner_source())
    assert _defined(tree).count("MAGIC") == 1
    # the shared frame format comes first, then the guest modules in their fixed order
    assert RUNNER_MODULES[0] == "langflow_sandbox_createos.executor.framing"
    assert RUNNER_MODULES[-2:] == (
        "langflow_sandbox_createos.executor.guest.main",
        "langflow_sandbox_createos.executor.guest.zygote",  # a reused guest's warm runner
    )
    # one future import, at the top; no import of this package is left at module level
    futures = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    assert len(futures) == 1 and tree.body.index(futures[0]) == 0
    assert not [
        n.module
        for n in tree.body
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("langflow_sandbox_createos")
    ]


def test_no_module_redefines_a_name_of_another() -> None:
    """In one text a later definition would silently replace an earlier module's."""
    seen: dict[str, str] = {}
    for name in RUNNER_MODULES:
        for defined in _defined(ast.parse(module_text(name))):
            assert defined not in seen, f"{defined} is defined in {seen.get(defined)} and {name}"
            seen[defined] = name


def test_guest_frames_are_the_hosts_byte_for_byte() -> None:
    """The guest's Frames and the host's encode_frame write the same line for the same frame
    (the guest adds a newline before it), and the host's reader accepts it."""
    runner = _runner()
    key = os.urandom(32)
    read_fd, write_fd = os.pipe()
    try:
        runner["Frames"](write_fd, key).emit("ready", lfx="0.1", installed=False)
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        written = pipe.read()
    assert written == "\n" + framing.encode_frame(key, 0, "ready", lfx="0.1", installed=False)
    mac = written.split(" ")[2]
    assert mac == framing.frame_mac(key, 0, "ready", '{"lfx":"0.1","installed":false,"t":"ready"}')
    frames: list[dict[str, Any]] = []
    FrameReader(key=key, on_frame=frames.append, on_plain=lambda line: None).feed(written)
    assert frames == [{"lfx": "0.1", "installed": False, "t": "ready"}]


def test_host_and_guest_agree_on_the_spec_mac() -> None:
    runner = _runner()
    key, body = os.urandom(32), b'{"graph": {}}'
    assert runner["spec_mac"](key, body) == framing.spec_mac(key, body)
    assert runner["spec_mac"](key, body[:-1]) != framing.spec_mac(key, body)  # a partial upload fails


def test_the_guest_exits_with_the_hosts_exit_statuses() -> None:
    runner = _runner()
    for name in ("EXIT_TIMEOUT", "EXIT_NO_LFX", "EXIT_INSTALL_FAILED", "EXIT_FAILED"):
        assert runner[name] == getattr(framing, name)


def test_an_import_the_order_cannot_satisfy_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module that imports from one after it would leave a name undefined in the guest."""
    from langflow_sandbox_createos.executor import guest

    order = list(RUNNER_MODULES)
    order.remove("langflow_sandbox_createos.executor.guest.frames")
    order.append("langflow_sandbox_createos.executor.guest.frames")
    monkeypatch.setattr(guest, "RUNNER_MODULES", tuple(order))
    guest.runner_source.cache_clear()
    try:
        with pytest.raises(ValueError, match="comes later in RUNNER_MODULES"):
            guest.runner_source()
    finally:
        monkeypatch.undo()
        guest.runner_source.cache_clear()


def _deliver_later(path: Any, key: bytes, spec: dict[str, Any], after: float) -> threading.Thread:
    """Upload as createos-local does (the directory, then a temporary file renamed into place),
    after a first, incomplete write in place (a control plane whose upload is not atomic)."""
    body = json.dumps(spec).encode()
    data = framing.spec_mac(key, body).encode() + b"\n" + body

    def deliver() -> None:
        time.sleep(after)
        path.parent.mkdir(exist_ok=True)  # the runner makes it first; an older one did not
        path.write_bytes(data[: len(data) // 2])
        time.sleep(0.2)
        temporary = path.parent / ".upload-1"
        temporary.write_bytes(data)
        os.rename(temporary, path)

    thread = threading.Thread(target=deliver)
    thread.start()
    return thread


@pytest.mark.parametrize("inotify", [True, False])
def test_a_waiting_runner_wakes_on_its_spec_upload(tmp_path: Any, inotify: bool) -> None:
    """With inotify the runner sleeps until the upload (its look-anyway timer is 30 s here);
    without, it polls at the host's interval."""
    runner = _runner()
    runner["SPEC_RECHECK_SECONDS"] = 30.0
    if not inotify:

        class NoInotify(runner["_DirectoryWatch"]):  # type: ignore[misc, name-defined]
            def __init__(self) -> None:
                self.fd = -1

        runner["_DirectoryWatch"] = NoInotify
    key = bytes(range(32))
    path = tmp_path / "run" / "spec"
    frames = runner["Frames"](os.open(os.devnull, os.O_WRONLY), key)
    delivery = _deliver_later(path, key, {"timeout": 5}, after=0.3)
    started = time.monotonic()
    spec = runner["_await_spec"](frames, key, str(path), 60.0, 0.05 if not inotify else 30.0)
    delivery.join()
    assert spec == {"timeout": 5}
    assert time.monotonic() - started < 5  # the upload woke it, not the 30 s timer
    assert not path.exists()  # read once, then removed


def test_a_waiting_runner_takes_only_the_spec_its_host_signed(tmp_path: Any) -> None:
    """A reused guest's standby waits in a directory other runs of its domain can write: a spec
    signed with any other key (another run's secret, none) is never run, and the host's own,
    arriving later, is; each waiting runner has a directory of its own, removed with the spec."""
    runner = _runner()
    key, other = bytes(range(32)), bytes(range(1, 33))
    path = tmp_path / "standby" / "w-1" / "spec"
    frames = runner["Frames"](os.open(os.devnull, os.O_WRONLY), key)
    forged = json.dumps({"timeout": 5, "forged": True}).encode()

    def forge() -> None:
        time.sleep(0.2)
        path.write_bytes(framing.spec_mac(other, forged).encode() + b"\n" + forged)

    forger = threading.Thread(target=forge)
    forger.start()
    delivery = _deliver_later(path, key, {"timeout": 5}, after=0.6)
    spec = runner["_await_spec"](frames, key, str(path), 60.0, 0.05)
    forger.join()
    delivery.join()
    assert spec == {"timeout": 5}
    assert not path.parent.exists()  # its directory went with it
