"""`createos-langflow`: the operator CLI.

  doctor   check the configuration of every surface and say how to fix what is wrong
  reap     list (and with --yes delete) guests left behind by the plugin

Both use the native client and the same settings module as the surfaces.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict

from langflow_sandbox_createos.cli import doctor, reap
from langflow_sandbox_createos.core.settings import SettingsError


def read_env_file(path: str) -> dict[str, str]:
    """``NAME=value`` lines (``export`` and shell quoting allowed, ``#`` comments), as `make run`
    writes its environment to ``.run/createos.env``."""
    import shlex

    values: dict[str, str] = {}
    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            words = shlex.split(line, comments=True)
            if words and words[0] == "export":
                words = words[1:]
            if len(words) != 1 or "=" not in words[0]:
                raise SettingsError(f"{path}:{number}: expected NAME=value")
            name, _, value = words[0].partition("=")
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise SettingsError(f"{path}:{number}: {name!r} is not a variable name")
            values[name] = value
    return values


def _env_file_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--env-file",
        metavar="FILE",
        help="read the environment from FILE first (NAME=value lines), e.g. .run/createos.env, "
        "which `make run` writes: then this command sees what that Langflow sees",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="createos-langflow", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="check the configuration and explain each fix")
    doc.add_argument("--json", action="store_true", help="machine-readable output")
    _env_file_option(doc)
    rp = sub.add_parser(
        "reap", help="list or delete guests left behind (lf-, lf-c-, lf-x- names; --prefix for others)"
    )
    rp.add_argument(
        "--older-than", type=reap.parse_duration, default=None, help="only guests older than e.g. 2h"
    )
    rp.add_argument(
        "--prefix",
        action="append",
        help="any name with this prefix (repeatable); default: the names the plugin generates "
        "(lf-, lf-c-, lf-x- followed by hex; not the warm pools' lf-w- and lf-xw-)",
    )
    rp.add_argument(
        "--include-active",
        action="store_true",
        help="also creating/running guests younger than 2h (by default kept: a run may be in progress)",
    )
    rp.add_argument("--state", action="append", help="only guests in this state (repeatable)")
    rp.add_argument(
        "--idle",
        type=reap.parse_duration,
        default=None,
        help="only reused guests (lf-c-) paused for longer than e.g. 1h (CREATEOS_SANDBOX_REUSE_IDLE_SECONDS)",
    )
    rp.add_argument("--yes", action="store_true", help="really delete (default: dry run)")
    rp.add_argument("--json", action="store_true", help="machine-readable output")
    _env_file_option(rp)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.env_file:
        try:
            os.environ.update(read_env_file(args.env_file))
        except (OSError, SettingsError) as exc:
            print(f"createos-langflow: --env-file: {exc}", file=sys.stderr)
            return 2
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {"doctor": _doctor_cmd, "reap": reap.reap}
    return handlers[args.command](args)


def _doctor_cmd(args: argparse.Namespace) -> int:
    report = doctor.doctor()
    if args.json:
        print(
            json.dumps(
                {"ok": report.ok, "surfaces": report.surfaces, "checks": [asdict(c) for c in report.checks]},
                indent=2,
            )
        )
    else:
        doctor.print_report(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
