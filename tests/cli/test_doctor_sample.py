"""The sample `createos-langflow doctor` output in docs/operations.md is the real one.

The sample's own `$ export` lines are run against a createos-local (its URL and key stand in
for `http://127.0.0.1:8787` and `$CREATEOS_LOCAL_API_KEY`), then the real command; its output
must be the sample's, line for line, once what differs between machines is masked: the
versions of the five things doctor names with one, the install path, the control plane's URL
and user id, the guest counts. Everything else, addresses and ranges (169.254.0.0/16) among
it, is compared literally. README.md's quote of
the implementation line is checked against the same output. DOCS_DRIFT_ROOT points at another
tree's docs (tests/unit/docs_drift_at.sh).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from langflow_sandbox_createos.local.testing import LocalControlPlane

ROOT = Path(os.environ.get("DOCS_DRIFT_ROOT") or Path(__file__).resolve().parents[2])
SAMPLE_URL = "http://127.0.0.1:8787"
SAMPLE_KEY = "$CREATEOS_LOCAL_API_KEY"

MASKS = (
    (re.compile(r"\bhttps?://[^\s),]+"), "<url>"),
    (re.compile(r" at /\S+"), " at <path>"),
    (re.compile(r"\(user [^,]+,"), "(user <id>,"),
    (re.compile(r"\d+ running, \d+ paused"), "<n> running, <n> paused"),
    # a version only after the name it belongs to: a dotted number elsewhere is an address
    (
        re.compile(r"\b(langflow-sandbox-createos|native client|libcurl|jansson|lfx) \d+(?:\.\d+)+\b"),
        r"\1 <version>",
    ),
)


def mask(line: str) -> str:
    for pattern, stand_in in MASKS:
        line = pattern.sub(stand_in, line)
    return line.rstrip()


def sample() -> tuple[dict[str, str], list[str]]:
    """The exports and the output of the first doctor sample in docs/operations.md."""
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text[text.index("## `createos-langflow doctor`") :]
    for block in re.findall(r"^```text\n(.*?)^```", section, re.S | re.M):
        lines = block.splitlines()
        if any(line.startswith("$ createos-langflow doctor") for line in lines):
            break
    else:
        pytest.fail("docs/operations.md has no ```text block with `$ createos-langflow doctor`")
    exports: dict[str, str] = {}
    for index, line in enumerate(lines):
        if line.startswith("$ export "):
            for word in shlex.split(line[len("$ export ") :], posix=False):
                name, _, value = word.partition("=")
                exports[name] = value
        elif line.startswith("$ createos-langflow doctor"):
            return exports, lines[index + 1 :]
    raise AssertionError("unreachable")


def run_doctor(exports: dict[str, str], plane: LocalControlPlane) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LANGFLOW_", "CREATEOS_"))}
    for name, value in exports.items():
        env[name] = value.replace(SAMPLE_URL, plane.url).replace(SAMPLE_KEY, plane.api_key)
    proc = subprocess.run(
        [sys.executable, "-m", "langflow_sandbox_createos.cli", "doctor"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",  # never the checkout's own copy by accident: the installed one, as users run it
    )
    assert plane.api_key not in proc.stdout + proc.stderr
    return proc.stdout.splitlines()


def test_the_sample_is_what_doctor_prints(control_plane: LocalControlPlane, cp: LocalControlPlane) -> None:
    """Fails with doctor naming 127.0.0.0/16 instead of 169.254.0.0/16 (issue 43: on ac8509d that
    passed, every dotted number being masked as a version)."""
    exports, documented = sample()
    real = run_doctor(exports, control_plane)
    assert real[0].startswith("Surfaces switched on:"), real
    assert [mask(line) for line in documented] == [mask(line) for line in real], "\n".join(
        ["docs/operations.md's doctor sample differs from the real output:", *real]
    )


def test_readme_quotes_the_implementation_line(
    control_plane: LocalControlPlane, cp: LocalControlPlane
) -> None:
    exports, _ = sample()
    real = [mask(line) for line in run_doctor(exports, control_plane)]
    readme = re.sub(r"^```.*?^```", "", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S | re.M)
    readme = " ".join(readme.split())
    quotes = [m for m in re.finditer(r"`([^`]+)`", readme) if m.group(1).startswith("implementation:")]
    assert quotes, "README.md no longer quotes doctor's implementation line"
    for m in quotes:
        quote = mask(m.group(1)).rstrip(".")
        assert any(line.startswith("[ok  ] " + quote) for line in real), (quote, real)
        if "first line" in readme[max(0, m.start() - 200) : m.start()]:  # d5bde57 said so
            assert real[0].startswith(quote), (
                f"README.md calls {quote!r} doctor's first line: it is {real[0]!r}"
            )


def test_addresses_and_ranges_are_not_masked() -> None:
    """The sample's link-local range is compared as written: on ac8509d every dotted number was
    masked as a version, so doctor printing 127.0.0.0/16 instead of 169.254.0.0/16 passed."""
    _, documented = sample()
    line = next(line for line in documented if "169.254.0.0/16" in line)
    assert "169.254.0.0/16" in mask(line)
    assert mask(line) != mask(line.replace("169.254.0.0/16", "127.0.0.0/16"))
