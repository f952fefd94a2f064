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
