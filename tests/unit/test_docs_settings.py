"""The docs' settings tables and the code agree, both ways.

A settings table is one whose first column is headed Setting or Variable and that has a
Default column (backend.md, component.md, executor.md, native-client.md, operations.md).
Every variable such a table lists is read by the code (or by scripts/run-langflow.sh, for
`make run`'s own knobs) and its Default cell states what the code does when the variable is
unset; every variable the package or the C core reads is listed in one.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

import docs_drift as docs
import pytest

SCRIPT = docs.ROOT / "scripts" / "run-langflow.sh"


def code_defaults() -> dict[str, object]:
    """What each setting is when its variable is unset, asked of settings.py itself."""
    s = docs.load_settings_module()
    env: dict[str, str] = {}
    backend = s.backend_settings(env)
    executor = s.executor_settings(env)
    with pytest.raises(s.SettingsError):
        s.api_key(env)  # required: no default key
    readers: dict[str, Callable[[], object]] = {
        "LANGFLOW_SANDBOX_TIMEOUT_SECONDS": lambda: backend.timeout_seconds,
        "LANGFLOW_SANDBOX_MEMORY_MB": lambda: backend.memory_mb,
        "LANGFLOW_SANDBOX_ALLOW_NETWORK": lambda: backend.allow_network,
        "LANGFLOW_SANDBOX_ALLOWED_DOMAINS": lambda: backend.allowed_domains,
        "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS": lambda: backend.accept_egress_exceptions,
        "CREATEOS_SANDBOX_API_KEY": lambda: None,
        "CREATEOS_API_KEY": lambda: None,
        "CREATEOS_SANDBOX_BASE_URL": lambda: s.base_url(env),
        "CREATEOS_SANDBOX_ROOTFS": lambda: backend.rootfs,
        "CREATEOS_SANDBOX_SHAPE": lambda: backend.shape,
        "CREATEOS_SANDBOX_MAX_OUTPUT_BYTES": lambda: backend.max_output_bytes,
        "CREATEOS_SANDBOX_WARM_POOL": lambda: backend.warm_pool,
        "CREATEOS_SANDBOX_MAX_GUESTS": lambda: backend.max_guests,
        "CREATEOS_SANDBOX_MAX_WAIT_SECONDS": lambda: backend.max_wait_seconds,
        "CREATEOS_SANDBOX_CONTROL_TIMEOUT_SECONDS": lambda: s.control_timeout(env),
        "CREATEOS_SANDBOX_REUSE_IDLE_SECONDS": lambda: s.reuse_idle_seconds(env),
        "CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION": lambda: s.accept_local_isolation(env),
        "CREATEOS_EXECUTOR_ROOTFS": lambda: executor.rootfs,
        "CREATEOS_EXECUTOR_SHAPE": lambda: executor.shape,
        "CREATEOS_EXECUTOR_TIMEOUT_SECONDS": lambda: executor.timeout_seconds,
        "CREATEOS_EXECUTOR_EGRESS": lambda: executor.egress,
        "CREATEOS_EXECUTOR_INSTALL_LFX": lambda: executor.install_lfx,
        "CREATEOS_EXECUTOR_PIP": lambda: executor.pip_extra,
        "CREATEOS_EXECUTOR_LFX_VERSION": lambda: executor.lfx_version,
        "CREATEOS_EXECUTOR_ENV": lambda: executor.env_allowlist,
        "CREATEOS_EXECUTOR_WARM_POOL": lambda: executor.warm_pool,
        "CREATEOS_EXECUTOR_WARM_POOL_IDLE_SECONDS": lambda: executor.warm_pool_idle_seconds,
        "CREATEOS_EXECUTOR_REUSE": lambda: executor.reuse,
        "CREATEOS_EXECUTOR_REUSE_IDLE_SECONDS": lambda: executor.reuse_idle_seconds,
        "CREATEOS_EXECUTOR_REUSE_MAX_RUNS": lambda: executor.reuse_max_runs,
        "CREATEOS_EXECUTOR_MAX_GUESTS": lambda: executor.max_guests,
        "CREATEOS_EXECUTOR_MAX_WAIT_SECONDS": lambda: executor.max_wait_seconds,
    }
    defaults = {}
    for name, read in readers.items():
        try:
            defaults[name] = read()
        except AttributeError:  # an older settings.py (DOCS_DRIFT_ROOT) without this setting
            continue
    return defaults


DOCUMENTED = docs.documented_settings()
READ = docs.names_read_by_code()


def test_the_tables_are_found() -> None:
    files = {docs.rel(table.path) for table in docs.settings_tables()}
    assert {"docs/backend.md", "docs/executor.md", "docs/operations.md"} <= files, files
    assert len(DOCUMENTED) >= 25


def test_every_variable_the_code_reads_is_in_a_settings_table() -> None:
    documented = {d.name for d in DOCUMENTED}
    missing = {name: where for name, (where, _) in READ.items() if name not in documented}
    assert not missing, (
        f"read by the code but in no settings table (a table with a Default column): {missing}"
    )


def test_every_documented_variable_is_read() -> None:
    mentioned, _ = docs.script_defaults(SCRIPT)
    unread = [f"{d.name} ({d.where()})" for d in DOCUMENTED if d.name not in READ and d.name not in mentioned]
    assert not unread, f"documented in a settings table, but nothing reads it: {unread}"


def test_every_setting_of_the_settings_module_has_a_known_default() -> None:
    """A new setting in settings.py is a new row here (and in a docs table)."""
    defaults = code_defaults()
    s_path = docs.PACKAGE / "core" / "settings.py"
    in_settings = set(docs.names_read_by(s_path))
    assert in_settings <= set(defaults), f"add the default of {sorted(in_settings - set(defaults))} above"


@pytest.mark.parametrize("row", DOCUMENTED, ids=lambda d: f"{d.name}@{d.where()}")
def test_documented_default_is_the_code_default(row: docs.Documented) -> None:
    if not row.default.strip():  # "as for the other surfaces": stated in another table
        others = [d for d in DOCUMENTED if d.name == row.name and d.default.strip()]
        assert others, f"{row.where()}: {row.name} has no default anywhere"
        return
    defaults = code_defaults()
    mentioned, script = docs.script_defaults(SCRIPT)
    if row.name in defaults:
        value = defaults[row.name]
    elif row.name in READ:  # read in place: os.environ.get(NAME, ""), getenv(NAME)
        value = READ[row.name][1]
    elif row.name in script:
        value = script[row.name]
    else:
        assert row.name in mentioned, f"{row.where()}: {row.name} is not read by anything"
        return
    assert docs.default_matches(row.default, value), (
        f"{row.where()}: {row.name}'s documented default {row.default!r} is not the code's {value!r}"
    )


def test_default_cells_are_read_as_meant() -> None:
    assert docs.default_matches("`16777216` (16 MiB)", 16 * 1024 * 1024)
    assert docs.default_matches("16 MiB", 16 * 1024 * 1024)
    assert not docs.default_matches("`30`", 60)
    assert docs.default_matches("`false`", False) and not docs.default_matches("`false`", True)
    assert docs.default_matches("automatic", None)
    assert not docs.default_matches("`devbox:1`", None)
    assert docs.default_matches("`CREATEOS_SANDBOX_ROOTFS`, else `devbox:1`", "devbox:1")
    assert docs.default_matches("`*`", ("*",)) and docs.default_matches("empty", ())


# --- docs/reliability.md: which settings the configuration-abuse suite covers -----------------

ABUSE = docs.ROOT / "tests" / "reliability" / "test_config_abuse.py"


def _abuse_table() -> set[str]:
    tree = ast.parse(ABUSE.read_text(encoding="utf-8"))
    names = {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "Var"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    for node in ast.walk(tree):  # ALL_NAMES = (*(v.name for v in VARS), "CREATEOS_API_KEY")
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "ALL_NAMES" for t in node.targets):
            names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    return {name for name in names if isinstance(name, str) and docs.ENV_NAME.fullmatch(name)}


def test_reliability_md_names_the_settings_config_abuse_leaves_out() -> None:
    covered = _abuse_table()
    assert covered, f"no Var(...) rows found in {docs.rel(ABUSE)}"
    settings = set(docs.names_read_by(docs.PACKAGE / "core" / "settings.py"))
    text = docs.squash((docs.ROOT / "docs" / "reliability.md").read_text(encoding="utf-8"))
    section = text[text.index("## Configuration abuse") :]
    section = section[: section.index("## ", 3)]
    claimed = {span for span in docs.code_spans(section) if docs.ENV_NAME.fullmatch(span)}
    left_out = settings - covered
    assert covered <= settings, (
        f"config abuse tests variables settings.py does not read: {covered - settings}"
    )
    assert f"{len(covered)} of the {len(settings)} variables" in section, (
        f"docs/reliability.md should say the table covers {len(covered)} of the {len(settings)} variables"
    )
    assert left_out <= claimed, f"docs/reliability.md should name what config abuse leaves out: {left_out}"
