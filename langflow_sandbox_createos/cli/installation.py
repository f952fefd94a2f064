"""Which `langflow_sandbox_createos` a fresh Python (Langflow) would import, and what it is.

The pure-Python plugin 0.2.0 on PyPI uses the same distribution and import name. Two
copies can sit on one `sys.path` (a `pip install --user` copy, a `--target` directory on
`PYTHONPATH`, a `--system-site-packages` venv): the first one wins, and Langflow then runs
that copy. `createos-langflow` itself starts through the top-level `createos_langflow`
launcher, which loads this installation even when it is shadowed, so this module can say so.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

PACKAGE = "langflow_sandbox_createos"
DISTRIBUTION = "langflow-sandbox-createos"


@dataclass(frozen=True)
class Copy:
    """One copy of the package: its directory, the version of the dist-info beside it."""

    directory: Path
    version: str | None
    native: bool  # ships the `_createos` extension (0.2.0 is pure Python)

    def describe(self) -> str:
        version = f"{DISTRIBUTION} {self.version}" if self.version else "a copy without package metadata"
        kind = "native client" if self.native else "pure Python, no native client"
        return f"{version} ({kind}) at {self.directory}"


def this_copy() -> Copy:
    """The copy this process runs (the one `createos-langflow` loaded)."""
    import langflow_sandbox_createos

    return _describe(Path(langflow_sandbox_createos.__file__).resolve().parent)


def imported_copy() -> Copy | None:
    """The copy `import langflow_sandbox_createos` picks in a fresh interpreter with this
    `sys.path`: every meta-path finder in order, as the import system asks them (a regular
    package on `sys.path` comes before an editable install's finder)."""
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        found = find_spec(PACKAGE, None)
        if found is not None and found.origin:
            return _describe(Path(found.origin).resolve().parent)
    return None


def native_versions() -> str:
    """The extension's, libcurl's and jansson's versions; raises ImportError when it cannot load."""
    from langflow_sandbox_createos import _createos

    return f"native client {_createos.__version__}, libcurl {_createos.curl_version}, jansson {_createos.jansson_version}"


def _describe(directory: Path) -> Copy:
    native = any(directory.glob("_createos.*.so")) or any(directory.glob("_createos.*.pyd"))
    return Copy(directory, _version_beside(directory), native)


def _version_beside(directory: Path) -> str | None:
    """The version of the dist-info that owns `directory`: the one in the same parent
    directory, or an editable install's, whose direct_url.json names the source tree."""
    for dist in metadata.distributions():
        if (dist.metadata["Name"] or "").lower().replace("_", "-") != DISTRIBUTION:
            continue
        if _dist_location(dist) == str(directory.parent):
            return dist.version
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
        if direct.get("dir_info", {}).get("editable") and direct.get("url") == directory.parent.as_uri():
            return dist.version
    return None


def _dist_location(dist: metadata.Distribution) -> str:
    path = getattr(dist, "_path", None)
    return str(Path(path).resolve().parent) if path is not None else "?"
