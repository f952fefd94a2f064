"""The program's own run time, measured by the guest shell around it and sent back as the last
line of stderr (the streaming exec protocol carries no ``exec_ms``). Used by the backend's
guest script and the component's guest wrapper; ``split_trailer`` takes the line off again.

The shell reads ``/proc/uptime`` (centiseconds) with its ``read`` builtin, so no process
starts for it. Without a readable ``/proc/uptime`` it sends no trailer. The same clock tells a
program killed at its deadline from one killed otherwise (``sh_timeout_status``).
"""

from __future__ import annotations

import re

# An ASCII unit separator, a tag, the milliseconds.
TRAILER_PREFIX = "\x1fcreateos:program_ms="
TRAILER_PREFIX_SH = "\\037createos:program_ms="  # the same, as printf writes it
_TRAILER_RE = re.compile(re.escape(TRAILER_PREFIX) + r"(\d{1,15})\n")
_TRAILER_PARTIAL_RE = re.compile(
    "|".join(re.escape(TRAILER_PREFIX[:i]) for i in range(1, len(TRAILER_PREFIX) + 1)) + r"(?:\d*\n?)?"
)
_VALID = "*[!0-9.]*|*.*.*) ;; [0-9]*.[0-9][0-9])"  # "<digits>.<two digits>" and nothing else

# Shell: the clock before the program (u0; s0 in whole seconds when /proc/uptime is missing).
SH_START = "u0=; s0=; read u0 _ </proc/uptime || s0=$(date +%s)\n"


def sh_stop(fd: int) -> str:
    """Shell: the clock after the program; `c` = centiseconds it ran (empty when unknown),
    and the trailer written to descriptor `fd`."""
    return (
        "u1=; s1=; read u1 _ </proc/uptime || s1=$(date +%s)\n"
        "c=\n"
        # Centiseconds between the two readings; "1${frac}" keeps "08" from being octal.
        f'case "$u0" in {_VALID} case "$u1" in {_VALID} '
        "c=$(( (${u1%.*} - ${u0%.*}) * 100 + 1${u1#*.} - 1${u0#*.} )) ;; esac ;; esac\n"
        f"if [ -n \"$c\" ]; then printf '{TRAILER_PREFIX_SH}%s\\n' $((c * 10)) >&{fd}; fi\n"
    )


# The status a program killed at its deadline inside the guest ends with: GNU `timeout` exits
# 137, not 124, when the signal it sent was KILL (it reports the forced kill on purpose), which
# would read as an out-of-memory kill, so the guest shell reports 124 itself (sh_timeout_status).
GUEST_TIMEOUT_STATUS = 124
KILLED_STATUS = 137


def sh_timeout_status(status: str, limit: str) -> str:
    """Shell, after :func:`sh_stop`: the shell variable ``status`` (a program's exit status)
    becomes 124 when the program died of SIGKILL at or past ``limit`` seconds (a number, or a
    shell expansion of one), read from the centiseconds `c` it ran (``c >= 100 limit - 1``:
    truncation to centiseconds keeps that whenever it ran ``limit`` s), else from `date`'s whole
    seconds. The one place a KILL past the deadline is told from any other KILL."""
    return (
        f'if [ "${status}" -eq {KILLED_STATUS} ]; then\n'
        f'  if [ -n "$c" ]; then [ "$c" -ge $(({limit} * 100 - 1)) ] && {status}={GUEST_TIMEOUT_STATUS}\n'
        f'  elif [ -n "$s0" ] && [ -n "$s1" ] && [ $((s1 - s0)) -ge {limit} ]; then {status}={GUEST_TIMEOUT_STATUS}; fi\n'
        "fi\n"
    )


def split_trailer(stderr: str) -> tuple[str, int | None]:
    """Strip the timing trailer the guest shell appended; return (stderr, program ms).

    The trailer is written after the program has exited, so it is the last thing on stderr;
    a program printing the same text earlier cannot take its place.
    """
    at = stderr.rfind(TRAILER_PREFIX)
    if at < 0 or len(stderr) - at > len(TRAILER_PREFIX) + 24:
        return stderr, None
    match = _TRAILER_RE.fullmatch(stderr, at)
    if match:
        return stderr[:at], int(match.group(1))
    return stderr, None


def strip_cut_trailer(stderr: str) -> str:
    """After a truncation by the output cap, drop any prefix of the trailer left at the very
    end, so no fragment of it reaches the user."""
    at = stderr.rfind("\x1f")
    if at >= 0 and _TRAILER_PARTIAL_RE.fullmatch(stderr, at):
        return stderr[:at]
    return stderr
