"""`createos-langflow reap` against guests of every prefix and state on the local control plane."""

from __future__ import annotations

import contextlib
import json
import time

import pytest
from waiting import wait_status

from langflow_sandbox_createos import cli
from langflow_sandbox_createos._createos import Client
from langflow_sandbox_createos.core import clock, guest_spec

BACKEND = guest_spec.random_name("lf-")
REUSED = guest_spec.random_name("lf-c-")
EXECUTOR = guest_spec.random_name("lf-x-")
POOL = guest_spec.random_name("lf-w-")
NOT_OURS = ("lf-mine", "user-own-guest")


@pytest.fixture
def guests(createos_env, cp, control_plane):
    client = Client(control_plane.url, control_plane.api_key)
    made = {}
    for name in (BACKEND, REUSED, EXECUTOR, POOL, *NOT_OURS):
        made[name] = client.create({"shape": "s-1vcpu-256mb", "name": name})["id"]
    client.pause(made[REUSED])
    wait_status(client, made[REUSED], "paused")
    yield client, made
    for sandbox_id in made.values():
        with contextlib.suppress(Exception):
            client.delete(sandbox_id)
    control_plane.wait_until_no_live(timeout=5.0)


def listed(capsys, *argv: str) -> tuple[int, list[dict], int]:
    code = cli.main(["reap", "--json", *argv])
    data = json.loads(capsys.readouterr().out)
    return code, data["guests"], data["kept_active"]


def test_dry_run_lists_only_plugin_guests_that_are_not_in_use(guests, capsys):
    client, made = guests
    # e8f911e: the default prefix lf- also matched the pool's lf-w- guest, lf-mine, and the
    # running guests (which may be running a program right now)
    code, rows, active = listed(capsys)
    assert code == 0
    assert [r["name"] for r in rows] == [REUSED] and active == 2
    code, rows, active = listed(capsys, "--include-active")
    assert {r["name"] for r in rows} == {BACKEND, REUSED, EXECUTOR} and active == 0
    assert all(r["age_seconds"] is not None for r in rows)
    assert all(client.get(i)["status"] in ("running", "paused") for i in made.values())


def test_filters(guests, capsys):
    _, rows, _ = listed(capsys, "--prefix", "lf-c-")
    assert [r["name"] for r in rows] == [REUSED]
    _, rows, _ = listed(capsys, "--state", "paused")
    assert [r["name"] for r in rows] == [REUSED]
    _, rows, _ = listed(capsys, "--prefix", "lf-x-", "--state", "running", "--include-active")
    assert [r["name"] for r in rows] == [EXECUTOR]
    _, rows, _ = listed(capsys, "--prefix", "lf-w-", "--include-active")  # the pool only when asked
    assert [r["name"] for r in rows] == [POOL]
    _, rows, _ = listed(capsys, "--prefix", "lf-", "--include-active")  # an explicit prefix is a prefix
    assert {r["name"] for r in rows} == {BACKEND, REUSED, EXECUTOR, POOL, "lf-mine"}
    _, rows, _ = listed(capsys, "--older-than", "1h")
    assert rows == []


def test_yes_deletes_with_progress_and_summary(guests, capsys, control_plane):
    code = cli.main(["reap", "--yes", "--include-active"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "Deleted 3 of 3 guest(s)." in out
    # and says what is left of them, so nobody has to check by hand (make run prints it at exit)
    assert "Left now: 0 guest(s) matching" in out and "nothing is left." in out, out
    assert "3/3" in err
    control_plane.wait_until_no_live(timeout=5.0, ignore_prefix="lf-")
    live = {sb["name"] for sb in control_plane.live_sandboxes()}
    assert live == {POOL, *NOT_OURS}


def test_human_dry_run_output(guests, capsys):
    code = cli.main(["reap"])
    out = capsys.readouterr().out
    assert code == 0
    assert "1 guest(s) left behind by the plugin." in out
    assert "Kept 2 creating or running guest(s) younger than 2h" in out
    assert "Dry run: nothing deleted" in out
    assert "user-own-guest" not in out and POOL not in out


def test_parse_duration():
    assert cli.reap.parse_duration("90s") == 90
    assert cli.reap.parse_duration("30m") == 1800
    assert cli.reap.parse_duration("2h") == 7200
    assert cli.reap.parse_duration("1d") == 86400
    with pytest.raises(Exception, match="not a duration"):
        cli.reap.parse_duration("soon")


def test_unreachable_control_plane_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("CREATEOS_SANDBOX_API_KEY", "k")
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", "http://127.0.0.1:9")
    assert cli.main(["reap"]) == 2
    assert "could not be reached" in capsys.readouterr().err


def test_idle_picks_reused_guests_paused_past_the_lifetime(guests, capsys, control_plane):
    client, made = guests
    paused = made[REUSED]
    while clock.paused_seconds(client.get(paused), time.time()) <= 1.0:
        time.sleep(0.2)
    _, rows, _ = listed(capsys, "--idle", "1h")
    assert rows == []  # paused, but not for an hour
    _, rows, _ = listed(capsys, "--idle", "1s")
    assert [r["name"] for r in rows] == [REUSED]
    assert rows[0]["idle_seconds"] > 1.0
    assert cli.main(["reap", "--idle", "1s", "--yes"]) == 0
    assert "Deleted 1 of 1 guest(s)." in capsys.readouterr().out
    assert client.get(paused)["status"] in ("destroying", "destroyed")
    for name in (BACKEND, EXECUTOR, POOL, *NOT_OURS):
        assert client.get(made[name])["status"] == "running"
