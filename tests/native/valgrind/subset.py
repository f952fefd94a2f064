"""A representative subset of the native client for valgrind (not collected by pytest).

    python tests/native/valgrind/subset.py URL KEY
runs every kind of call once or twice, success and failure paths, then closes
the client so every allocation of the core is released.
"""

from __future__ import annotations

import contextlib
import sys

from langflow_sandbox_createos import _createos


def main(url: str, key: str) -> None:
    c = _createos.Client(url, key, control_timeout=30)
    c.whoami()
    c.shapes()
    c.rootfs()
    view = c.create({"shape": "s-1vcpu-256mb", "name": "vg-subset"})
    sid = view["id"]
    c.list(prefix="vg-")
    c.upload(sid, "/workspace/a.txt", b"hello")
    assert c.download(sid, "/workspace/a.txt", max_bytes=10) == b"hello"
    with contextlib.suppress(_createos.UnavailableError):
        c.download(sid, "/workspace/a.txt", max_bytes=2)
    chunks = []
    r = c.exec(
        sid, "bash", ["-c", "echo out; echo err >&2"], timeout=30, on_output=lambda s, t: chunks.append(t)
    )
    assert r.stdout == "out\n", r
    r = c.exec(sid, "python3", ["-c", "print('x' * 5000)"], timeout=30, max_output_bytes=100, stream=False)
    assert r.stdout_truncated
    r = c.exec(sid, "bash", ["-c", "echo early; sleep 20"], timeout=1.0)
    assert r.timed_out
    with contextlib.suppress(_createos.NotFoundError):
        c.get("sb-missing")
    c.put_egress(sid, ["10.0.0.1:443"])
    c.get_egress(sid)
    c.delete(sid)
    r = c.run_program({"shape": "s-1vcpu-256mb"}, "echo", ["hi"], files=[("/workspace/f", b"x")], timeout=30)
    assert r.stdout == "hi\n"
    c.run_program({"shape": "s-1vcpu-256mb"}, "true", timeout=30, delete="background")
    c.drain_deletes(timeout=10)
    c.stats()
    c.close()
    del c
    with contextlib.suppress(_createos.ConfigError):
        _createos.Client("http://example.com", key)
    print("subset ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
