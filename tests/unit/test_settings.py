"""settings.py: every variable's parsing, defaults and error messages."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from langflow_sandbox_createos.core import settings
from langflow_sandbox_createos.core.settings import SettingsError


def test_defaults():
    s = settings.backend_settings({})
    assert (s.timeout_seconds, s.memory_mb, s.allow_network, s.allowed_domains) == (30, 192, False, ())
    assert s.rootfs == "devbox:1" and s.shape is None and not s.accept_egress_exceptions
    assert s.max_output_bytes == 16 * 1024 * 1024 and s.warm_pool == 0
    e = settings.executor_settings({})
    assert (e.shape, e.timeout_seconds, e.egress, e.install_lfx, e.pip_extra) == (
        "s-4vcpu-8gb",
        600,
        ("*",),
        False,
        (),
    )
    assert e.rootfs == "devbox:1"
    assert settings.base_url({}) == "https://api.sb.createos.sh"


@pytest.mark.parametrize("value", ["", "   ", "\t"])
def test_blank_is_unset(value):
    env = {"LANGFLOW_SANDBOX_TIMEOUT_SECONDS": value, "CREATEOS_SANDBOX_SHAPE": value}
    s = settings.backend_settings(env)
    assert s.timeout_seconds == 30 and s.shape is None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "abc", "is not a whole number"),
        ("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "0", "below the minimum of 1"),
        ("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "-5", "below the minimum of 1"),
        ("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "99999", "above the maximum"),
        ("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "1.5", "is not a whole number"),
        ("LANGFLOW_SANDBOX_MEMORY_MB", "-1", "below the minimum"),
        ("LANGFLOW_SANDBOX_ALLOW_NETWORK", "maybe", "is not a boolean"),
        ("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", "sure", "is not a boolean"),
        ("CREATEOS_SANDBOX_MAX_OUTPUT_BYTES", "12", "below the minimum"),
        ("CREATEOS_SANDBOX_WARM_POOL", "-1", "below the minimum"),
        ("CREATEOS_SANDBOX_WARM_POOL", "many", "is not a whole number"),
    ],
)
def test_backend_bad_values_name_the_variable(name, value, message):
    with pytest.raises(SettingsError, match=message) as info:
        settings.backend_settings({name: value})
    assert name in str(info.value)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"CREATEOS_EXECUTOR_TIMEOUT_SECONDS": "x"},
            "CREATEOS_EXECUTOR_TIMEOUT_SECONDS='x' is not a whole number",
        ),
        ({"CREATEOS_EXECUTOR_EGRESS": ","}, "lists no rules"),
        ({"CREATEOS_EXECUTOR_EGRESS": "pypi.org"}, "not an IPv4 address or CIDR"),
        ({"CREATEOS_EXECUTOR_EGRESS": "10.0.0.1:99999"}, "invalid port"),
        ({"CREATEOS_EXECUTOR_EGRESS": "*,10.0.0.0/8"}, "mixes \\*"),
        ({"CREATEOS_EXECUTOR_INSTALL_LFX": "perhaps"}, "is not a boolean"),
        ({"CREATEOS_EXECUTOR_ENV": "1BAD"}, "not an environment variable name"),
        ({"CREATEOS_EXECUTOR_ENV": "OPENAI_API_KEY,CREATEOS_SANDBOX_API_KEY"}, "never enters a guest"),
        # issue 27: createos-local's own key, exported with the same value by the docs
        ({"CREATEOS_EXECUTOR_ENV": "CREATEOS_LOCAL_API_KEY"}, "must not forward CREATEOS_LOCAL_API_KEY"),
        # any variable whose value is (or holds) the API key, whatever its name
        (
            {
                "CREATEOS_SANDBOX_API_KEY": "sk-live-123456789",
                "MY_COPY": "Bearer sk-live-123456789",
                "CREATEOS_EXECUTOR_ENV": "OPENAI_API_KEY,MY_COPY",
            },
            "must not forward MY_COPY: its value is the CreateOS API key",
        ),
        (
            {
                "CREATEOS_API_KEY": "fallback-key-000",
                "LEAK": "fallback-key-000",
                "CREATEOS_EXECUTOR_ENV": "LEAK",
            },
            "must not forward LEAK",
        ),
    ],
)
def test_executor_bad_values(env, message):
    with pytest.raises(SettingsError, match=message):
        settings.executor_settings(env)


def test_executor_values():
    e = settings.executor_settings(
        {
            "CREATEOS_EXECUTOR_EGRESS": " 203.0.113.7:443 , 198.51.100.0/24 ",
            "CREATEOS_EXECUTOR_PIP": "numpy  pandas",
            "CREATEOS_EXECUTOR_ENV": "OPENAI_API_KEY, MY_TOKEN",
            "CREATEOS_SANDBOX_ROOTFS": "tpl-a",
        }
    )
    assert e.egress == ("203.0.113.7:443", "198.51.100.0/24")
    assert e.pip_extra == ("numpy", "pandas")
    assert e.env_allowlist == ("OPENAI_API_KEY", "MY_TOKEN")
    assert e.rootfs == "tpl-a"  # falls back to the sandbox rootfs
    assert settings.executor_settings({"CREATEOS_EXECUTOR_ROOTFS": "tpl-x"}).rootfs == "tpl-x"


def test_truthy_spellings():
    for value in ("1", "true", "YES", "On", "y", "t"):
        assert settings.parse_bool("X", False, {"X": value}) is True
    for value in ("0", "false", "NO", "off", "n", "f"):
        assert settings.parse_bool("X", True, {"X": value}) is False


def test_api_key_sources_and_repr():
    key = settings.api_key({"CREATEOS_API_KEY": "fallback-key"})
    assert key.source == "CREATEOS_API_KEY"
    key = settings.api_key({"CREATEOS_SANDBOX_API_KEY": "main-key", "CREATEOS_API_KEY": "other"})
    assert key.source == "CREATEOS_SANDBOX_API_KEY" and key.value == "main-key"
    assert "main-key" not in repr(key) and "main-key" not in str(key)
    with pytest.raises(SettingsError, match="CREATEOS_SANDBOX_API_KEY"):
        settings.api_key({})


def test_the_missing_key_advice_reads_the_url_from_the_mapping_it_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """api_key(environ) chose its advice from os.environ's base URL, whatever `environ` said
    (issue 44): a mapping that names a createos-local gets that advice, one that names CreateOS
    the account's, whatever this process's environment holds."""
    monkeypatch.delenv("CREATEOS_SANDBOX_BASE_URL", raising=False)
    with pytest.raises(SettingsError, match=r"key of the createos-local at http://127\.0\.0\.1:9"):
        settings.api_key({"CREATEOS_SANDBOX_BASE_URL": "http://127.0.0.1:9"})
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", "http://127.0.0.1:9")
    with pytest.raises(SettingsError, match="Create a key at"):
        settings.api_key({"CREATEOS_SANDBOX_BASE_URL": "https://api.createos.example"})


@pytest.mark.parametrize("bad", ["abc\ndef", "abc def", "clé", "abc\r\nX-Evil: 1", "a\x00b"])
def test_api_key_header_injection_refused(bad):
    with pytest.raises(SettingsError, match="cannot be sent in an HTTP header") as info:
        settings.api_key({"CREATEOS_SANDBOX_API_KEY": "x" + bad})
    assert bad not in str(info.value)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://api.example.com", "must be an http"),
        ("https://", "must be an http"),
        ("https://user:pw@api.example.com", "must not contain credentials"),
        ("https://api.example.com/?a=1", "query string"),
        ("https://api.example.com/#x", "query string or fragment"),
        ("http://api.example.com", "plain http to a non-loopback host"),
        ("http://10.0.0.1:8787", "plain http to a non-loopback host"),
        ("https://api.example.com:99999", "not a valid URL"),
        ("not a url", "must be an http"),
    ],
)
def test_base_url_refusals(url, message):
    with pytest.raises(SettingsError, match=message) as info:
        settings.base_url({"CREATEOS_SANDBOX_BASE_URL": url})
    assert "CREATEOS_SANDBOX_BASE_URL" in str(info.value)


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8787", "http://localhost:1", "http://[::1]:8787", "https://api.example.com/prefix/"],
)
def test_base_url_accepted(url):
    assert settings.base_url({"CREATEOS_SANDBOX_BASE_URL": url}) == url.rstrip("/")


def test_lfx_settings_service_is_the_authority_when_it_exists():
    """Inside Langflow the settings service exists: values set there (not in env) apply.
    Outside, the settings stack is not built just to read five values."""
    script = textwrap.dedent(
        """
        import sys
        from langflow_sandbox_createos.core import settings
        assert settings.backend_settings().timeout_seconds == 30
        from lfx.services.deps import get_settings_service
        service = get_settings_service()
        service.settings.sandbox_timeout_seconds = 77
        service.settings.sandbox_memory_mb = 9000
        s = settings.backend_settings()
        assert (s.timeout_seconds, s.memory_mb) == (77, 9000), s
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


# --- parsed once per change of the environment (EnvMemo) -------------------------------------


class _Recording(dict):
    """An environment that notes every variable read from it."""

    def __init__(self) -> None:
        super().__init__()
        self.read: set[str] = set()

    def get(self, name, default=None):  # type: ignore[override]
        self.read.add(name)
        return super().get(name, default)


def test_backend_variables_are_every_variable_the_backend_reads():
    env = _Recording()
    settings.backend_settings(env)
    assert env.read, "backend_settings no longer reads through `environ`: this test sees nothing"
    assert env.read <= set(settings.BACKEND_VARIABLES), env.read - set(settings.BACKEND_VARIABLES)
    assert "CREATEOS_SANDBOX_MAX_WAIT_SECONDS" in settings.BACKEND_VARIABLES


def test_endpoint_variables_are_every_variable_the_endpoint_reads():
    from langflow_sandbox_createos.core import connection

    env = _Recording()
    env.update(CREATEOS_SANDBOX_API_KEY="k" * 16)
    settings.api_key(env)
    settings.base_url(env)
    settings.control_timeout(env)
    assert env.read <= set(connection.ENDPOINT_VARIABLES), env.read - set(connection.ENDPOINT_VARIABLES)


# (variable, a valid non-default value, the field it sets)
CHANGES = [
    ("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "77", "timeout_seconds", 77),
    ("LANGFLOW_SANDBOX_MEMORY_MB", "9000", "memory_mb", 9000),
    ("LANGFLOW_SANDBOX_ALLOW_NETWORK", "true", "allow_network", True),
    ("LANGFLOW_SANDBOX_ALLOWED_DOMAINS", "a.example", "allowed_domains", ("a.example",)),
    ("LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS", "true", "accept_egress_exceptions", True),
    ("CREATEOS_SANDBOX_ROOTFS", "other:2", "rootfs", "other:2"),
    ("CREATEOS_SANDBOX_SHAPE", "s-8vcpu-16gb", "shape", "s-8vcpu-16gb"),
    ("CREATEOS_SANDBOX_MAX_OUTPUT_BYTES", "4096", "max_output_bytes", 4096),
    ("CREATEOS_SANDBOX_WARM_POOL", "3", "warm_pool", 3),
    ("CREATEOS_SANDBOX_MAX_GUESTS", "5", "max_guests", 5),
    ("CREATEOS_SANDBOX_MAX_WAIT_SECONDS", "7", "max_wait_seconds", 7),
]


def test_every_backend_variable_has_a_change_below():
    assert {name for name, *_ in CHANGES} == set(settings.BACKEND_VARIABLES)


@pytest.fixture
def bare_backend_env(monkeypatch):
    monkeypatch.setattr(settings, "_lfx_sandbox_settings", lambda: None)
    for name in settings.BACKEND_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    settings._backend_memo.clear()
    yield monkeypatch
    settings._backend_memo.clear()


@pytest.mark.parametrize(("name", "value", "field", "expected"), CHANGES)
def test_a_changed_variable_takes_effect_on_the_next_call(bare_backend_env, name, value, field, expected):
    before = settings.current_backend_settings()
    assert settings.current_backend_settings() is before  # unchanged: the same parse
    bare_backend_env.setenv(name, value)
    after = settings.current_backend_settings()
    assert getattr(after, field) == expected != getattr(before, field)
    bare_backend_env.delenv(name)
    assert settings.current_backend_settings() == before


def test_the_environment_is_parsed_once_per_change(bare_backend_env):
    calls = []
    memo = settings.EnvMemo(("LANGFLOW_SANDBOX_TIMEOUT_SECONDS",), lambda: calls.append(1) or len(calls))
    assert [memo.get() for _ in range(5)] == [1] * 5
    bare_backend_env.setenv("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "5")
    assert [memo.get() for _ in range(3)] == [2] * 3
    bare_backend_env.setenv("LANGFLOW_SANDBOX_TIMEOUT_SECONDS", "5")  # the same value: no parse
    assert memo.get() == 2 and len(calls) == 2


def test_a_bad_value_is_not_remembered(bare_backend_env):
    bare_backend_env.setenv("CREATEOS_SANDBOX_MAX_WAIT_SECONDS", "soon")
    for _ in range(2):
        with pytest.raises(SettingsError, match="CREATEOS_SANDBOX_MAX_WAIT_SECONDS"):
            settings.current_backend_settings()
    bare_backend_env.setenv("CREATEOS_SANDBOX_MAX_WAIT_SECONDS", "9")
    assert settings.current_backend_settings().max_wait_seconds == 9


def test_lfx_settings_take_part_in_the_memo(bare_backend_env):
    class Lfx:
        timeout_seconds, memory_mb, allow_network, allowed_domains = 30, 192, False, ()

    lfx = Lfx()
    bare_backend_env.setattr(settings, "_lfx_sandbox_settings", lambda: lfx)
    assert settings.current_backend_settings().timeout_seconds == 30
    lfx.timeout_seconds = 55  # set in Langflow's settings, not in the environment
    assert settings.current_backend_settings().timeout_seconds == 55


def test_the_memo_reads_the_mapping_the_parse_reads(bare_backend_env):
    """The memo is keyed on what ``settings._env`` returns, not on os.environ: a caller that
    points the seam at its own mapping (tests/reliability's per-thread lanes) gets that
    mapping's settings, and the next read of os.environ gets os.environ's again."""
    lane: dict[str, str] = {"LANGFLOW_SANDBOX_TIMEOUT_SECONDS": "41"}
    real_env = settings._env
    use_lane = False
    bare_backend_env.setattr(
        settings, "_env", lambda environ=None: lane if use_lane and environ is None else real_env(environ)
    )
    default = settings.current_backend_settings()
    use_lane = True
    assert settings.current_backend_settings().timeout_seconds == 41 != default.timeout_seconds
    lane["LANGFLOW_SANDBOX_TIMEOUT_SECONDS"] = "42"
    assert settings.current_backend_settings().timeout_seconds == 42
    use_lane = False
    assert settings.current_backend_settings() == default
