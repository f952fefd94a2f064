"""A guest that puts a crafted archive where the host fetches it, run through the real
component against createos-local: the host reads it within the run's budget, reports it,
and deletes the guest."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from lfx.exceptions.component import ComponentBuildError

from langflow_sandbox_createos.local.testing import LocalControlPlane

from .conftest import FlowRun, StallWatch, all_ids, run_flow

# The program plants a fifo where the wrapper writes the archive and leaves a child behind.
# The child waits until the wrapper's archive step is blocked opening the fifo, renames a
# crafted 10**15-byte tar.gz over that name, then drains the real archive through a second
# link to the fifo: the wrapper moves the crafted file to where the host downloads from.
SWAPPER = r"""
import gzip, os, sys, tarfile, time
run = os.path.dirname(os.path.abspath(sys.argv[0]))
target = run + "/files.tar.gz"
header = tarfile.TarInfo(sys.argv[1] if len(sys.argv) > 1 else "./huge.bin")
header.size = 10**15
with open(run + "/crafted", "wb") as f:
    f.write(gzip.compress(header.tobuf(format=tarfile.GNU_FORMAT)))
os.mkfifo(target)
os.link(target, run + "/fifo")


def blocked_on_fifo():
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/wchan") as f:
                if f.read() in ("wait_for_partner", "fifo_open"):
                    return True
        except OSError:
            pass
    return False


if os.fork() == 0:
    os.setsid()
    for _ in range(3000):
        if blocked_on_fifo():
            break
        time.sleep(0.01)
    os.replace(run + "/crafted", target)
    with open(run + "/fifo", "rb") as f:
        while f.read(65536):
            pass
    os._exit(0)
print("planted", os.path.getsize(run + "/crafted"))
"""


# The same swap, with CVE-2024-6232's archive: a pax header of 150,000 digits, 248 bytes of
# gzip, which tarfile's pax parser (CPython < 3.11.10 / 3.12.6) takes ~65 s for, holding the GIL.
PAX_SWAPPER = SWAPPER.replace(
    """header = tarfile.TarInfo(sys.argv[1] if len(sys.argv) > 1 else "./huge.bin")
header.size = 10**15
with open(run + "/crafted", "wb") as f:
    f.write(gzip.compress(header.tobuf(format=tarfile.GNU_FORMAT)))""",
    """header = tarfile.TarInfo("././@PaxHeader")
header.type = tarfile.XHDTYPE
header.size = 150000
with open(run + "/crafted", "wb") as f:
    f.write(gzip.compress(header.tobuf(format=tarfile.USTAR_FORMAT) + b"1" * 150000 + bytes(1424)))""",
)


def _run_in_thread(fn: Any, seconds: float) -> FlowRun:
    box: list[Any] = []
    worker = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert box, f"the component was still running after {seconds:g} s"
    return box[0]


def test_crafted_archive_returns_promptly_with_a_note_and_no_guest(
    component_cls: type, env: LocalControlPlane
) -> None:
    before = all_ids(env)
    # e8f911e spun at 100 % CPU for ever here (about 10**11 empty reads) and never deleted
    # the guest; the run's own budget is the timeout plus the 30 s archive step
    run = _run_in_thread(
        lambda: run_flow(component_cls, python_code=SWAPPER, collect_artifacts=True, timeout_seconds=30), 180
    )
    assert run.results["exit_code"] == 0, run.results
    assert run.results["result"].startswith("planted ")
    assert int(run.results["result"].split()[1]) < 200  # the whole crafted archive
    assert run.results["artifacts_truncated"] is True
    assert "declares an entry of 1000000000000000 bytes" in run.results["artifacts_message"]
    assert run.results["artifact_count"] == 0 and len(run.files) == 0
    [sandbox_id] = all_ids(env) - before
    assert run.results["sandbox_id"] == sandbox_id
    assert env.wait_until_no_live(timeout=10.0) == []


def test_a_quadratic_pax_archive_never_stalls_the_host(component_cls: type, env: LocalControlPlane) -> None:
    """Issue 27: the 248-byte archive froze every thread of the Langflow process for 64.7 s."""
    assert PAX_SWAPPER != SWAPPER
    with StallWatch() as watch:
        run = _run_in_thread(
            lambda: run_flow(
                component_cls, python_code=PAX_SWAPPER, collect_artifacts=True, timeout_seconds=30
            ),
            180,
        )
    assert run.results["exit_code"] == 0, run.results
    assert int(run.results["result"].split()[1]) < 300  # the whole crafted archive
    assert watch.longest < 1.0, watch.longest
    assert (
        "extended tar header (pax record or GNU long name) of 150000 bytes"
        in run.results["artifacts_message"]
    )
    assert run.results["artifact_count"] == 0
    assert env.wait_until_no_live(timeout=10.0) == []


def test_archive_step_killed_at_its_budget_leaves_no_killed_line(
    component_cls: type, env: LocalControlPlane, monkeypatch: Any
) -> None:
    from langflow_sandbox_createos.component import wrapper

    monkeypatch.setattr(wrapper, "ARCHIVE_BUDGET_SECONDS", 1)
    # a sparse 64 GiB file: tar reads and compresses zeros far longer than the 1 s budget
    run = run_flow(
        component_cls,
        command="truncate -s 64G /workspace/artifacts/zeros && echo program-stderr >&2",
        collect_artifacts=True,
    )
    assert run.results["exit_code"] == 0, run.results
    # e8f911e: the wrapper's shell reported the killed archive step, so stderr ended "Killed"
    assert run.results["stderr"] == "program-stderr"
    assert run.results["artifacts_truncated"] is True
    assert env.wait_until_no_live(timeout=10.0) == []


def test_unsafe_file_names_serialise_through_the_files_output(
    component_cls: type, env: LocalControlPlane
) -> None:
    import orjson
    from lfx.serialization.serialization import serialize

    run = run_flow(
        component_cls,
        command=(
            "cd /workspace/artifacts && printf 1 > \"$(printf 'caf\\351.txt')\" && "
            "printf 2 > \"$(printf 'esc\\033[31m')\" && printf 3 > \"$(printf 'rlo\\342\\200\\256txt.exe')\" && "
            "printf 4 > plain.txt"
        ),
        collect_artifacts=True,
    )
    assert run.results["exit_code"] == 0, run.results
    rows = sorted(serialize(run.files), key=lambda r: r["path"])
    assert [(r["path"], r["path_escaped"], r["text"]) for r in rows] == [
        ("caf\\xe9.txt", True, "1"),
        ("esc\\x1b[31m", True, "2"),
        ("plain.txt", False, "4"),
        ("rlo\\u202etxt.exe", True, "3"),
    ]
    assert "3 file names held bytes that are not UTF-8" in run.results["artifacts_message"]
    # e8f911e: the latin-1 name came back surrogate-escaped and neither of these serialised
    assert orjson.loads(orjson.dumps(rows)) == rows
    for data in run.files.to_data_list():
        assert orjson.loads(data.model_dump_json())["path"] in {r["path"] for r in rows}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"command": "echo a\x00b"}, "Command"),
        ({"python_code": "print(1)\x00print(2)\n"}, "Python Code"),
        # too long for stdin: it would have been uploaded, and kept the NUL
        ({"python_code": "x = 1\n" * (300 * 1024 // 6) + "print(1)\x00\n"}, "Python Code"),
    ],
)
def test_nul_in_the_program_is_refused_before_any_guest(
    component_cls: type, env: LocalControlPlane, params: dict[str, Any], field: str
) -> None:
    before = all_ids(env)
    # e8f911e: the command printed "a"; the short program exited 0; the long one failed
    with pytest.raises(ComponentBuildError) as info:
        run_flow(component_cls, **params)
    assert f"{field} contains a NUL character" in str(info.value)
    assert all_ids(env) == before
