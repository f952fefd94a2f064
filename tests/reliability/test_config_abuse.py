"""Configuration abuse: every setting of every surface, given empty, whitespace, non-numeric
and negative values; hostile base URLs; keys that would inject headers.

Contract (docs/backend.md "Settings", docs/executor.md "Settings", settings.py): a blank
value is unset (the documented default applies); any other unusable value fails the run
with ``SandboxUnavailableError`` naming the variable, before a guest exists. A key with
whitespace, control or non-ASCII characters is refused before any request is sent.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest
from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

from langflow_sandbox_createos.component import reuse
from langflow_sandbox_createos.core import settings
from langflow_sandbox_createos.core.native import load_native

from . import harness
from .harness import API_KEY, driver, leaks_key

pytestmark = pytest.mark.timeout(300)

# the component reads its settings on three paths: one-shot, with returned files, reused
COMPONENT = ("component", "component-files", "component-reuse")
ALL = ("backend", *COMPONENT, "executor")
MiB = 1024 * 1024


@dataclass(frozen=True)
class Var:
    name: str
    kind: str  # int | bool | domains | rootfs | shape | egress | envnames | free | key | url
    surfaces: tuple[str, ...]
    default: Any  # what a blank value means (checked through settings.py)


VARS: tuple[Var, ...] = (
    Var("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "int", ("backend",), 30),
    Var("LANGFLOW_SANDBOX_MEMORY_MB", "int", ("backend",), 192),
    Var("LANGFLOW_SANDBOX_ALLOW_NETWORK", "bool", ("backend",), False),
    Var("LANGFLOW_SANDBOX_ALLOWED_DOMAINS", "domains", ("backend",), ()),
    Var("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", "bool", ("backend",), False),
    Var("CREATEOS_SANDBOX_ROOTFS", "rootfs", ALL, "devbox:1"),
    Var("CREATEOS_SANDBOX_SHAPE", "shape", ("backend", *COMPONENT), None),
    Var("CREATEOS_SANDBOX_MAX_OUTPUT_BYTES", "int", ALL, 16 * MiB),
    Var("CREATEOS_SANDBOX_WARM_POOL", "int", ("backend",), 0),
    Var("CREATEOS_SANDBOX_MAX_GUESTS", "int", ("backend", *COMPONENT), settings.DEFAULT_SANDBOX_MAX_GUESTS),
    Var(
        "CREATEOS_SANDBOX_MAX_WAIT_SECONDS", "int", ("backend", *COMPONENT), settings.DEFAULT_MAX_WAIT_SECONDS
    ),
    Var("CREATEOS_SANDBOX_REUSE_IDLE_SECONDS", "int", COMPONENT, settings.DEFAULT_REUSE_IDLE_SECONDS),
    Var("CREATEOS_SANDBOX_CONTROL_TIMEOUT_SECONDS", "int", ALL, 60),
    Var("CREATEOS_SANDBOX_API_KEY", "key", ALL, None),
    Var("CREATEOS_SANDBOX_BASE_URL", "url", ALL, settings.DEFAULT_BASE_URL),
    Var("CREATEOS_EXECUTOR_ROOTFS", "rootfs", ("executor",), "devbox:1"),
    Var("CREATEOS_EXECUTOR_SHAPE", "rootfs", ("executor",), settings.DEFAULT_EXECUTOR_SHAPE),
    Var("CREATEOS_EXECUTOR_TIMEOUT_SECONDS", "int", ("executor",), 600),
    Var("CREATEOS_EXECUTOR_EGRESS", "egress", ("executor",), ("*",)),
    Var("CREATEOS_EXECUTOR_INSTALL_LFX", "bool", ("executor",), False),
    Var("CREATEOS_EXECUTOR_PIP", "free", ("executor",), ()),
    Var("CREATEOS_EXECUTOR_LFX_VERSION", "free", ("executor",), None),
    Var("CREATEOS_EXECUTOR_ENV", "envnames", ("executor",), ()),
    Var("CREATEOS_EXECUTOR_REUSE", "bool", ("executor",), False),
    Var("CREATEOS_EXECUTOR_REUSE_IDLE_SECONDS", "int", ("executor",), 300),
    Var("CREATEOS_EXECUTOR_REUSE_MAX_RUNS", "int", ("executor",), 4),
    Var("CREATEOS_EXECUTOR_MAX_GUESTS", "int", ("executor",), settings.DEFAULT_EXECUTOR_MAX_GUESTS),
    Var("CREATEOS_EXECUTOR_MAX_WAIT_SECONDS", "int", ("executor",), settings.DEFAULT_MAX_WAIT_SECONDS),
)
ALL_NAMES = (*(v.name for v in VARS), "CREATEOS_API_KEY")

BAD = {"non-numeric": "abc", "negative": "-5"}
BLANK = {"empty": "", "whitespace": "  \t "}

# What the refusal must say, per kind of variable (besides the variable's name).
REFUSAL = {
    "int": {"non-numeric": "is not a whole number", "negative": "below the minimum"},
    "bool": {"non-numeric": "is not a boolean", "negative": "is not a boolean"},
    "domains": {
        "non-numeric": "does not enforce hostname rules",
        "negative": "does not enforce hostname rules",
    },
    "rootfs": {"non-numeric": "HTTP 400", "negative": "HTTP 400"},
    "shape": {
        "non-numeric": "is not in the CreateOS shape catalog",
        "negative": "is not in the CreateOS shape catalog",
    },
    "egress": {"non-numeric": "is not an IPv4 address or CIDR", "negative": "is not an IPv4 address or CIDR"},
    "envnames": {"negative": "is not an environment variable name"},
    "key": {"non-numeric": "HTTP 401", "negative": "HTTP 401"},
    "url": {"non-numeric": "must be an http(s) URL", "negative": "must be an http(s) URL"},
}
# Combinations with no cell (a value of that shape is valid for that kind of variable): why.
NOT_APPLICABLE = {
    ("free", "non-numeric"): "free text handed to pip only with CREATEOS_EXECUTOR_INSTALL_LFX=true",
    ("free", "negative"): "free text handed to pip only with CREATEOS_EXECUTOR_INSTALL_LFX=true",
    ("envnames", "non-numeric"): "'abc' is a valid variable name: unset on the host, it is skipped with a "
    "warning (tests/executor)",
}


@pytest.fixture
def env(plane: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A runnable baseline: only the key, the URL and the egress acknowledgement are set."""
    monkeypatch.setattr(settings, "_lfx_sandbox_settings", lambda: None)
    for name in ALL_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CREATEOS_SANDBOX_API_KEY", plane.api_key)
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", plane.url)
    monkeypatch.setenv("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", "true")
    monkeypatch.setenv("CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION", "true")  # createos-local
    plane.clear_faults()
    yield plane
    plane.clear_faults()
    harness.drain_backend_deletes()
    plane.delete_all()
    reuse.guest_ids.clear()
    assert plane.wait_until_no_live(timeout=10) == []


def _v1_requests(plane: Any) -> int:
    requests = plane.stats()["requests"]
    return sum(n for route, n in requests.items() if route not in ("local_stats", "local_faults", "healthz"))


def _run(surface: str, **kwargs: Any) -> harness.Outcome:
    if surface == "backend":
        return driver.backend("print('config-ok')")
    if surface in COMPONENT:
        return driver.component(
            "print('config-ok')",
            component_id="CreateOSSandbox-config",
            shape="",
            collect=surface == "component-files",
            reuse=surface == "component-reuse",
            **kwargs,
        )
    return driver.executor("config-ok")


def _cases() -> list[Any]:
    return [
        pytest.param(var, surface, label, id=f"{var.name}-{surface}-{label}")
        for var in VARS
        for surface in var.surfaces
        for label in BAD
        if (var.kind, label) not in NOT_APPLICABLE
    ]


@pytest.mark.parametrize(("var", "surface", "label"), _cases())
def test_bad_value_is_refused_naming_the_variable(
    var: Var, surface: str, label: str, env: Any, monkeypatch
) -> None:
    monkeypatch.setenv(var.name, BAD[label])
    before_ids = {sb["id"] for sb in env.sandboxes()}
    before = _v1_requests(env)
    out = _run(surface)
    assert out.exc is not None, f"{var.name}={BAD[label]!r} was accepted: {out.value!r:.300}"
    assert type(out.exc) is SandboxUnavailableError, f"{type(out.exc).__name__}: {out.exc}"
    message = str(out.exc)
    # (image and executor shape names are judged by the control plane: its 400 must name them)
    assert var.name in message, message
    assert REFUSAL[var.kind][label] in message, message
    assert not leaks_key(message) and not any(leaks_key(t) for t in out.exc_texts())
    created = {sb["id"] for sb in env.sandboxes()} - before_ids
    assert not created, f"a refused setting still created guest(s) {created}"
    if var.kind not in ("key", "rootfs", "shape"):
        # nothing to ask the control plane about: refused before any request
        assert _v1_requests(env) == before, "a refused setting still sent requests"


@pytest.mark.parametrize("var", [pytest.param(v, id=v.name) for v in VARS])
@pytest.mark.parametrize("label", list(BLANK))
def test_blank_value_means_the_documented_default(var: Var, label: str, monkeypatch) -> None:
    environ = {var.name: BLANK[label]}
    if var.kind == "key":
        with pytest.raises(settings.SettingsError, match="No CreateOS API key"):
            settings.api_key(environ)
        return
    if var.kind == "url":
        assert settings.base_url(environ) == var.default
        return
    if var.name.startswith("CREATEOS_EXECUTOR_") or var.name in ("CREATEOS_SANDBOX_ROOTFS",):
        cfg = settings.executor_settings(environ)
        got = {
            "CREATEOS_EXECUTOR_ROOTFS": cfg.rootfs,
            "CREATEOS_SANDBOX_ROOTFS": cfg.rootfs,
            "CREATEOS_EXECUTOR_SHAPE": cfg.shape,
            "CREATEOS_EXECUTOR_TIMEOUT_SECONDS": cfg.timeout_seconds,
            "CREATEOS_EXECUTOR_EGRESS": cfg.egress,
            "CREATEOS_EXECUTOR_INSTALL_LFX": cfg.install_lfx,
            "CREATEOS_EXECUTOR_PIP": cfg.pip_extra,
            "CREATEOS_EXECUTOR_LFX_VERSION": cfg.lfx_version,
            "CREATEOS_EXECUTOR_ENV": cfg.env_allowlist,
            "CREATEOS_EXECUTOR_MAX_GUESTS": cfg.max_guests,
            "CREATEOS_EXECUTOR_MAX_WAIT_SECONDS": cfg.max_wait_seconds,
            "CREATEOS_EXECUTOR_REUSE": cfg.reuse,
            "CREATEOS_EXECUTOR_REUSE_IDLE_SECONDS": cfg.reuse_idle_seconds,
            "CREATEOS_EXECUTOR_REUSE_MAX_RUNS": cfg.reuse_max_runs,
        }[var.name]
        assert got == var.default
        if var.name != "CREATEOS_SANDBOX_ROOTFS":
            return
    if var.name == "CREATEOS_SANDBOX_CONTROL_TIMEOUT_SECONDS":
        assert settings.control_timeout(environ) == var.default
        return
    if var.name == "CREATEOS_SANDBOX_REUSE_IDLE_SECONDS":
        assert settings.reuse_idle_seconds(environ) == var.default
        return
    monkeypatch.setattr(settings, "_lfx_sandbox_settings", lambda: None)
    cfg_b = settings.backend_settings(environ)
    got_b = {
        "LANGFLOW_SANDBOX_TIMEOUT_SECONDS": cfg_b.timeout_seconds,
        "LANGFLOW_SANDBOX_MEMORY_MB": cfg_b.memory_mb,
        "LANGFLOW_SANDBOX_ALLOW_NETWORK": cfg_b.allow_network,
        "LANGFLOW_SANDBOX_ALLOWED_DOMAINS": cfg_b.allowed_domains,
        "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS": cfg_b.accept_egress_exceptions,
        "CREATEOS_SANDBOX_ROOTFS": cfg_b.rootfs,
        "CREATEOS_SANDBOX_SHAPE": cfg_b.shape,
        "CREATEOS_SANDBOX_MAX_OUTPUT_BYTES": cfg_b.max_output_bytes,
        "CREATEOS_SANDBOX_WARM_POOL": cfg_b.warm_pool,
        "CREATEOS_SANDBOX_MAX_GUESTS": cfg_b.max_guests,
        "CREATEOS_SANDBOX_MAX_WAIT_SECONDS": cfg_b.max_wait_seconds,
    }[var.name]
    assert got_b == var.default


@pytest.mark.parametrize("surface", ALL)
def test_every_setting_blank_still_runs(surface: str, env: Any, monkeypatch) -> None:
    """Blank is unset: with every variable the surface reads blank (but the key, the URL and
    the egress acknowledgement), the run works on the documented defaults."""
    keep = {
        "CREATEOS_SANDBOX_API_KEY",
        "CREATEOS_SANDBOX_BASE_URL",
        "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS",
    }
    for var in VARS:
        if surface in var.surfaces and var.name not in keep:
            monkeypatch.setenv(var.name, "   ")
    if surface == "executor":
        # blank CREATEOS_EXECUTOR_ROOTFS means devbox:1, a plain image without lfx, where the
        # executor refuses to run (tests/executor/test_runs.py): like a deployment, this run
        # names the lfx template and leaves every other executor setting blank
        for name, value in harness.TEMPLATE_ENV.items():
            monkeypatch.setenv(name, value)
    proxy = None
    if surface == "executor":  # one whole flow for two checks: it also goes through a path prefix
        proxy = PrefixProxy(env.port)
        monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", f"http://127.0.0.1:{proxy.port}/api")
    try:
        out = _run(surface)
        assert out.exc is None, out.exc
        assert "config-ok" in out.stdout
        if proxy is not None:
            assert any(b" /api/v1/" in line for line in proxy.seen), proxy.seen[:3]
    finally:
        if proxy is not None:
            harness.forget_endpoint(f"http://127.0.0.1:{proxy.port}/api")
            proxy.close()


# --- base URLs -----------------------------------------------------------------------------------


class PrefixProxy:
    """A loopback TCP relay that serves the control plane under /api: it removes the prefix
    from every request line it relays (bytes otherwise untouched, streaming included)."""

    def __init__(self, upstream_port: int, prefix: bytes = b"/api") -> None:
        self.upstream_port = upstream_port
        self.prefix = prefix
        self.seen: list[bytes] = []
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port = self._server.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _up(self, src: socket.socket, dst: socket.socket) -> None:
        needle = b" " + self.prefix + b"/"
        pending = b""
        with contextlib.suppress(OSError):
            while True:
                data = src.recv(65536)
                if not data:
                    break
                pending += data
                # hold back only a tail that could start a needle split across reads
                keep = next((n for n in range(len(needle) - 1, 0, -1) if pending.endswith(needle[:n])), 0)
                head, pending = (pending[:-keep], pending[-keep:]) if keep else (pending, b"")
                if needle in head:
                    self.seen.append(head.split(b"\r\n", 1)[0])
                dst.sendall(head.replace(needle, b" /"))
            dst.sendall(pending.replace(needle, b" /"))
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._stop = True
        self._server.close()


@pytest.mark.parametrize("surface", ["backend", "component"])  # executor: in the all-blank run
def test_base_url_with_a_path_prefix_works(surface: str, env: Any, monkeypatch) -> None:
    proxy = PrefixProxy(env.port)
    try:
        monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", f"http://127.0.0.1:{proxy.port}/api/")
        out = _run(surface)
        assert out.exc is None, out.exc
        assert "config-ok" in out.stdout
        assert any(b" /api/v1/" in line for line in proxy.seen), proxy.seen[:3]
    finally:
        harness.drain_backend_deletes()
        harness.forget_endpoint(f"http://127.0.0.1:{proxy.port}/api")
        proxy.close()


REFUSED_URLS = {
    "query": ("{url}/?token=1", "must not have a query string"),
    "fragment": ("{url}#frag", "must not have a query string or fragment"),
    "userinfo": ("http://admin:s3cr3t-pw@127.0.0.1:{port}", "must not contain credentials"),
    "plain-http-remote": ("http://example.com", "plain http to a non-loopback host"),
    "not-http": ("ftp://127.0.0.1:{port}", "must be an http(s) URL"),
    "bad-port": ("http://127.0.0.1:99999", "is not a valid URL"),
}


@pytest.mark.parametrize("surface", ALL)
@pytest.mark.parametrize("kind", list(REFUSED_URLS))
def test_hostile_base_url_is_refused_before_any_request(
    kind: str, surface: str, env: Any, monkeypatch
) -> None:
    template, fragment = REFUSED_URLS[kind]
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", template.format(url=env.url, port=env.port))
    before = _v1_requests(env)
    out = _run(surface)
    assert type(out.exc) is SandboxUnavailableError, out.exc
    message = str(out.exc)
    assert "CREATEOS_SANDBOX_BASE_URL" in message and fragment in message, message
    assert "s3cr3t-pw" not in message  # userinfo is never echoed
    assert _v1_requests(env) == before


# A label over DNS's 63-octet limit: the resolver refuses it before any query leaves the
# machine (tests send nothing beyond loopback), the same "could not resolve host" a missing
# name gives.
UNRESOLVABLE = "x" * 64 + ".invalid"
# Far above any bound below: a run that waited for the control timeout cannot pass.
UNRESOLVABLE_CONTROL_TIMEOUT = 120


def _closed_loopback_port() -> int:
    """A loopback port nothing listens on (bound, then released): connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _resolver_seconds() -> float:
    """How long this machine's resolver takes to say the name does not exist."""
    started = time.monotonic()
    with contextlib.suppress(OSError):
        socket.getaddrinfo(UNRESOLVABLE.encode(), 443)  # bytes: no IDNA encoding step
    return time.monotonic() - started


@pytest.mark.parametrize("surface", ALL)
def test_unresolvable_host_fails_fast_and_names_the_setting(surface: str, env: Any, monkeypatch) -> None:
    """Fails on the resolver's answer: not after the control timeout, not after retries. The
    bound is relative to what was measured just before, in this process: the same surface
    failing on a refused loopback connection (it pays every first-use cost, e.g. importing lfx's
    settings service, which took 4-7 s of the first component run) plus the resolver's own
    answer for the name (measured before and after the run: the larger counts)."""
    monkeypatch.setenv("CREATEOS_SANDBOX_CONTROL_TIMEOUT_SECONDS", str(UNRESOLVABLE_CONTROL_TIMEOUT))
    refused_url = f"http://127.0.0.1:{_closed_loopback_port()}"
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", refused_url)
    try:
        baseline = _run(surface)
    finally:
        harness.forget_endpoint(refused_url)
    assert isinstance(baseline.exc, SandboxExecutionError), baseline.exc
    # a refused connection is the fastest failure there is: it waits for no deadline either
    assert baseline.elapsed < UNRESOLVABLE_CONTROL_TIMEOUT / 4, baseline.elapsed
    resolver = _resolver_seconds()
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", f"https://{UNRESOLVABLE}")
    try:
        out = _run(surface)
    finally:
        harness.forget_endpoint(f"https://{UNRESOLVABLE}")
    resolver = max(resolver, _resolver_seconds())  # the resolver's answer, before and after
    assert isinstance(out.exc, SandboxExecutionError), out.exc
    if surface == "backend":  # the preflight's documented "unreachable" refusal
        assert type(out.exc) is SandboxUnavailableError and "is unreachable" in str(out.exc)
    else:  # a transport failure, like any other
        assert type(out.exc) is SandboxExecutionError, out.exc
    assert "CREATEOS_SANDBOX_BASE_URL" in str(out.exc)
    bound = 3 * (baseline.elapsed + resolver) + 2.0
    assert out.elapsed < bound, (
        f"took {out.elapsed:.2f} s; a refused connection took {baseline.elapsed:.2f} s and the "
        f"resolver {resolver:.2f} s just before (bound {bound:.2f} s)"
    )


# --- keys that would inject headers ----------------------------------------------------------------

INJECTING_KEYS = {
    "newline": API_KEY[:20] + "\nX-Injected: 1",
    "crlf": API_KEY[:20] + "\r\nX-Injected: 1",
    "inner-space": API_KEY[:20] + " " + API_KEY[20:],
    "tab": API_KEY[:20] + "\t" + API_KEY[20:],
    "non-ascii": API_KEY[:20] + "é" + API_KEY[20:],
    "del": API_KEY[:20] + "\x7f",
    "nbsp": API_KEY[:20] + "\u00a0" + API_KEY[20:],
}


@pytest.mark.parametrize("surface", ALL)
@pytest.mark.parametrize("kind", list(INJECTING_KEYS))
@pytest.mark.parametrize("variable", ["CREATEOS_SANDBOX_API_KEY", "CREATEOS_API_KEY"])
def test_key_that_could_inject_headers_is_refused_before_any_request(
    variable: str, kind: str, surface: str, env: Any, monkeypatch
) -> None:
    monkeypatch.delenv("CREATEOS_SANDBOX_API_KEY")
    monkeypatch.setenv(variable, INJECTING_KEYS[kind])
    before = _v1_requests(env)
    out = _run(surface)
    assert type(out.exc) is SandboxUnavailableError, out.exc
    message = str(out.exc)
    assert variable in message and "cannot be sent in an HTTP header" in message, message
    assert not any(leaks_key(t) for t in out.exc_texts())
    assert _v1_requests(env) == before, "a key that could inject headers reached the control plane"


@pytest.mark.parametrize("kind", list(INJECTING_KEYS))
def test_native_client_refuses_the_same_keys(kind: str, env: Any) -> None:
    """The last line of defence, for callers that bypass settings.py."""
    native = load_native()
    before = _v1_requests(env)
    with pytest.raises(native.ConfigError) as refused:
        native.Client(env.url, INJECTING_KEYS[kind])
    assert not leaks_key(str(refused.value))
    assert _v1_requests(env) == before


def test_a_trailing_newline_is_stripped_not_sent(env: Any, monkeypatch) -> None:
    """Values are stripped (docs/backend.md): a key pasted with its newline still works."""
    monkeypatch.setenv("CREATEOS_SANDBOX_API_KEY", f"  {API_KEY}\n")
    out = _run("backend")
    assert out.exc is None and "config-ok" in out.stdout, out.exc
