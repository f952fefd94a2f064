"""Guest Reuse across processes: two processes (two Langflow workers, or two servers of one
account) running the same reused CreateOS Sandbox node at once both get its one guest, found by
name, and take turns in it: the lock is in the guest (the wrapper's `flock`), not in either
process, so neither run is inside the guest while the other is.

Observed in the guest itself: each run's program appends `enter`/`exit` lines to a log in the
guest's /tmp; the first run in stays until it has seen the second run arrive (its wrapper
waiting in `flock`, or its program running: in the guest's /proc, which every exec of the
guest shares), and the second records whether the first was still inside when it entered. Fails
when the lock is off (`reuse-lock-off` in tests/mutations/mutations.toml): the second run enters
while the first waits for it."""

from __future__ import annotations

import json

from langflow_sandbox_createos.local.testing import LocalControlPlane

from .conftest import USER_ID, tag

# The program of both runs; LOG is the guest file both append to.
PROBE = """\
import json, os, time
me = os.path.dirname(os.path.abspath(__file__))
log = LOG
with open(log, "a") as out:
    out.write(f"enter {me}\\n")
with open(log) as lines:
    seen = lines.read().splitlines()
first = seen[0] == f"enter {me}"
inside = [line.split()[1] for line in seen if line.startswith("enter ") and line != f"enter {me}"]
inside = [run for run in inside if f"exit {run}" not in seen]
saw = "nothing"
deadline = time.monotonic() + 120
while first and saw == "nothing" and time.monotonic() < deadline:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = [w.decode(errors="replace") for w in f.read().split(b"\\0") if w]
        except OSError:
            continue
        if words and os.path.basename(words[0]) == "flock":
            saw = "the other run waiting for the lock"
        elif words and os.path.basename(words[0]).startswith("python") and any(
            w.endswith("/main.py") and os.path.dirname(w) != me for w in words
        ):  # the program itself, not the other run's wrapper (`sh -c WRAPPER ... main.py`)
            saw = "the other run's program running"
    time.sleep(0.01)
with open(log, "a") as out:
    out.write(f"exit {me}\\n")
print(json.dumps({"first": first, "inside_at_entry": inside, "saw": saw}))
"""


def test_two_processes_take_turns_in_one_reused_guest(plane: LocalControlPlane, start_driver) -> None:
    t = tag()
    code = PROBE.replace("LOG", repr(f"/tmp/turns-{t}.log"))
    node = {
        "flow_id": f"turns-{t}",
        "component_id": "CreateOSSandbox-xp001",
        "user_id": USER_ID,
        "mode": "flow",
    }
    workers = [start_driver("worker-a"), start_driver("worker-b")]
    for worker in workers:
        worker.ask("ready")  # both have lfx and the node loaded: the runs start together
    for worker in workers:
        worker.send(op="component", tag=t, code=code, **node)
    for worker in workers:
        worker.answer()
    outcomes = [worker.result(t) for worker in workers]
    guests = {o["sandbox_id"] for o in outcomes}
    try:
        assert all(o["exit_code"] == 0 and not o["error"] for o in outcomes), outcomes
        # both runs got the node's one reused guest (whichever process created it)
        assert len(guests) == 1, outcomes
        assert any(o["reused_guest"] for o in outcomes), outcomes
        seen = [json.loads(o["result"]) for o in outcomes]
        [first] = [s for s in seen if s["first"]]
        [second] = [s for s in seen if not s["first"]]
        # the first run in saw the second arrive and wait for the lock, not run beside it...
        assert first["saw"] == "the other run waiting for the lock", seen
        # ...and the second entered only after the first had left
        assert second["inside_at_entry"] == [], f"both runs were inside the guest at once: {seen}"
    finally:
        for guest in guests:
            plane.delete_sandbox(guest)
