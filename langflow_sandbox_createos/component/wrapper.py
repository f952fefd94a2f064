"""The CreateOS Sandbox component's guest wrapper: the `/bin/sh` program one run is in the guest.

How one run goes in the guest (`GUEST_WRAPPER`): the wrapper takes the guest's artifacts lock
(reused guests only) and waits for an earlier run's archive to be fetched, creates the run's
own directory and only then writes the program into it (from stdin, or moves the staged
upload in and checks its sha256), empties `/workspace/artifacts` when files are to be
returned, runs the program under `timeout --signal=KILL N` from `/workspace`, then, outside
that timeout and under a budget of its own, archives `/workspace/artifacts` and moves the
archive out of the run directory into `/tmp/.createos-out/` before it exits (and so releases
the lock). The host downloads the archive with a byte cap and reads it with
`artifacts.extract` within its byte and time budgets (`engine.py`).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Literal, Protocol

from langflow_sandbox_createos.component import artifacts
from langflow_sandbox_createos.core import budget, guest_spec, program_clock

ARCHIVE_BUDGET_SECONDS = 30  # the archive step's own budget, outside the program's timeout
INLINE_COMMAND_MAX = 64 * 1024  # longer commands go up as a file (one argv string is capped)
RUN_DIR_PREFIX = "/tmp/createos-run-"
ARTIFACTS_DIR = "/workspace/artifacts"
LOCK_PATH = "/tmp/.createos-sandbox.lock"

PENDING_WAIT_SECONDS = 20  # a reused run waits this long for an earlier run's archive to be fetched
# Another run's wrapper around its waits, its program and its archive step (its shell, its run
# directory, its program's staging), counted in the time a run waits for its turn.
TURN_MARGIN_SECONDS = 15
ARCHIVE_DIR = "/tmp/.createos-out"  # finished archives wait here for their host, out of later runs' way

# $1 run dir (created by the wrapper, after the lock), $2 program timeout, $3 collect (1/0),
# $4 archive budget, $5 archive byte cap, $6 lock wait (0 = no lock), $7 pending-archive wait,
# $8 where the program file goes ("" = none: an inline command), $9 how it arrives: "stdin"
# (the exec's stdin) or the sha256 of "$1.upload" (uploaded before the exec); then argv.
GUEST_WRAPPER = (
    r"""
run=$1 limit=$2 collect=$3 budget=$4 cap=$5 lockwait=$6 pendwait=$7 src=$8 from=$9
shift 9
art=/workspace/artifacts outdir=/tmp/.createos-out
# Builtins where a process is not needed (each one started costs the run about a millisecond):
# whole seconds from /proc/uptime (monotonic), or from date(1) where it cannot be read
if read now _ 2>/dev/null </proc/uptime; then clock=uptime; else clock=date; fi
secs() {
  now=
  if [ "$clock" = uptime ] && read now _ 2>/dev/null </proc/uptime; then now=${now%.*}; fi
  case $now in ''|*[!0-9]*) now=$(date +%s) ;; esac
}
# whether $1 exists, a dangling link included
there() { [ -e "$1" ] || [ -L "$1" ]; }
# whether the directory $outdir holds anything
pending() {
  for f in "$outdir"/* "$outdir"/.[!.]* "$outdir"/..?*; do
    if there "$f"; then return 0; fi
  done
  return 1
}
[ -d /workspace ] || mkdir -p /workspace 2>/dev/null
cd /workspace 2>/dev/null || cd /
if [ "$lockwait" -gt 0 ] && command -v flock >/dev/null 2>&1; then
  secs; began=$now
  exec 9>>/tmp/.createos-sandbox.lock
  if ! flock -w "$lockwait" 9; then
    echo "CreateOS Sandbox: another run kept this reused guest busy for more than ${lockwait}s" >&2
    exit 125
  fi
  # an earlier run's archive waits for its host: this run's program starts once it is gone
  # (the lock wait and this wait share one budget, $lockwait)
  secs; left=$(( lockwait - (now - began) ))
  if [ "$left" -lt "$pendwait" ]; then pendwait=$left; fi
  n=0
  while pending && [ "$n" -lt $((pendwait * 10)) ]; do
    sleep 0.1 2>/dev/null || sleep 1
    n=$((n + 1))
  done
  if there "$outdir"; then rm -rf -- "$outdir"; fi
fi
if ! mkdir -m 700 -- "$run" 2>/dev/null; then
  echo "CreateOS Sandbox: could not create the run directory $run" >&2
  exit 125
fi
if [ "$from" = stdin ]; then
  cat > "$src" || exit 125
elif [ -n "$src" ]; then
  mv -f -- "$run.upload" "$src" 2>/dev/null
  sum=$(sha256sum < "$src" 2>/dev/null) || sum=
  if [ -L "$src" ] || [ ! -f "$src" ] || { [ "${sum%% *}" != "$from" ] && { [ -n "$sum" ] || [ "$lockwait" -gt 0 ]; }; }; then
    echo "CreateOS Sandbox: the uploaded program is missing or was changed before it ran" >&2
    rm -rf -- "$run"
    exit 125
  fi
fi
if [ "$collect" = 1 ] && there "$art"; then rm -rf -- "$art"; fi
[ -d "$art" ] || mkdir -p -- "$art" 2>/dev/null
secs; start=$now
"""
    + program_clock.SH_START
    + r"""
# timeout's own stderr is discarded (it can print "Killed"); the program gets the real one
( timeout --signal=KILL "$limit" /bin/sh -c 'exec "$@" 2>&3 3>&-' program "$@" </dev/null 9>&-
  exit $? ) 3>&2 2>/dev/null
rc=$?
"""
    + program_clock.sh_stop(2)
    + r"""
if [ "$rc" -eq 137 ]; then secs; if [ $((now - start)) -ge "$limit" ]; then rc=124; fi; fi
if [ "$collect" = 1 ]; then
  ( timeout --signal=KILL "$budget" /bin/sh -c \
      'tar -czf - -C "$1" . 2>/dev/null | head -c "$2" > "$3"' archive "$art" "$cap" "$run/files.tar.gz" \
      </dev/null 9>&-
    exit $? ) 2>/dev/null
  rm -rf -- "$art"
  mkdir -p -- "$art" 2>/dev/null
  # out of the run directory before the lock is released; the host fetches and removes it
  mkdir -p -- "$outdir" 2>/dev/null
  mv -f -- "$run/files.tar.gz" "$outdir/${run##*/}.tar.gz" 2>/dev/null
fi
rm -rf -- "$run"
exit "$rc"
"""
)

Mode = Literal["python", "command"]


class ProgramRequest(Protocol):
    """What the wrapper needs of a run (the engine's RunRequest)."""

    @property
    def program(self) -> str: ...
    @property
    def mode(self) -> Mode: ...
    @property
    def timeout(self) -> int: ...
    @property
    def collect(self) -> bool: ...


@dataclass(frozen=True)
class GuestProgram:
    run_dir: str
    argv: list[str]
    files: list[tuple[str, bytes]]  # uploaded before the exec
    stdin: str | None  # or sent as the exec's stdin, which the wrapper writes to a file
    exec_timeout: float

    @property
    def archive_path(self) -> str:
        """Where the wrapper leaves the archive for the host (outside the run directory)."""
        return f"{ARCHIVE_DIR}/{self.run_dir.rsplit('/', 1)[-1]}.tar.gz"


def lock_wait_seconds(timeout: int) -> int:
    """How long a run on a reused guest waits for its turn: one whole run of another (its own
    wait for the archive before it, its program, its archive step, the wrapper around them),
    then the wait for that run's archive to be fetched."""
    other = budget.component(timeout, lock_wait=PENDING_WAIT_SECONDS, archive=ARCHIVE_BUDGET_SECONDS)
    return int(other.guest_seconds) + TURN_MARGIN_SECONDS + PENDING_WAIT_SECONDS


def time_budget(timeout: int, *, lock: bool, collect: bool) -> budget.TimeBudget:
    """A run's time: its wait for its turn on a reused guest (``lock``), its program, the
    archive of its files (``collect``)."""
    return budget.component(
        timeout,
        lock_wait=lock_wait_seconds(timeout) if lock else 0,
        archive=ARCHIVE_BUDGET_SECONDS if collect else 0,
    )


def build_program(req: ProgramRequest, *, lock: bool) -> GuestProgram:
    """The exec argv (`/bin/sh -c GUEST_WRAPPER ...`) and the files to upload first."""
    run_dir = RUN_DIR_PREFIX + secrets.token_hex(8)
    files: list[tuple[str, bytes]] = []
    stdin: str | None = None
    source = ""
    try:
        data = req.program.encode("utf-8")
        json_safe = True
    except UnicodeEncodeError:
        # lone surrogates cannot travel in a JSON string: the bytes are uploaded, and the
        # guest reports the invalid source exactly as it would locally
        data = req.program.encode("utf-8", "surrogatepass")
        json_safe = False
    if req.mode == "python":
        source = f"{run_dir}/main.py"
        program = ["python3", "-u", source]
    elif len(data) > INLINE_COMMAND_MAX:
        source = f"{run_dir}/main.sh"
        program = ["/bin/sh", source]
    else:
        program = ["/bin/sh", "-c", req.program]
    arrives = ""
    if source:
        if json_safe and len(data) <= guest_spec.STDIN_PROGRAM_MAX_BYTES:
            stdin = req.program  # written to `source` by the wrapper: one round trip fewer
            arrives = "stdin"
        else:
            # staged next to the run directory, which only exists once the wrapper holds the
            # lock; the wrapper moves it in and checks it is still these bytes
            files.append((f"{run_dir}.upload", data))
            arrives = hashlib.sha256(data).hexdigest()
    lock_wait = lock_wait_seconds(req.timeout) if lock else 0
    pending_wait = PENDING_WAIT_SECONDS if lock else 0
    argv = [
        "-c",
        GUEST_WRAPPER,
        "createos-sandbox",
        run_dir,
        str(req.timeout),
        "1" if req.collect else "0",
        str(ARCHIVE_BUDGET_SECONDS),
        str(artifacts.MAX_ARCHIVE_BYTES),
        str(lock_wait),
        str(pending_wait),
        source,
        arrives,
        *program,
    ]
    exec_timeout = time_budget(req.timeout, lock=lock, collect=req.collect).exec_timeout()
    return GuestProgram(run_dir, argv, files, stdin, exec_timeout)
