"""The guest runner: the program that runs one whole flow inside a CreateOS guest.

It is never imported in the guest: the host sends its text (`runner_source`) on the exec's
stdin with the run spec and a per-run secret, and `BOOTSTRAP` (``python3 -c ...``) compiles
it and calls its `main`.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

# The bootstrap reads one JSON document from stdin: {"runner": source, "token": hex, "spec": {...}}.
BOOTSTRAP = (
    "import json,sys;b=json.loads(sys.stdin.buffer.read());g={'__name__':'__createos_runner__'};"
    "exec(compile(b.pop('runner'),'createos-runner.py','exec'),g);g['main'](b)"
)


@lru_cache(maxsize=1)
def runner_source() -> str:
    return resources.files(__name__).joinpath("runner.py").read_text("utf-8")
