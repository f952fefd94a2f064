"""`createos-langflow reap` against guests of every prefix and state on the local control plane."""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from langflow_sandbox_createos import cli
from langflow_sandbox_createos._createos import Client


@pytest.fixture
def guests(createos_env, cp, control_plane):
    client = Client(control_plane.url, control_plane.api_key)
    made = {}
    for name in ("lf-reap-run", "lf-c-reap-paused", "lf-x-reap-run", "user-own-guest"):
        made[name] = client.create({"shape": "s-1vcpu-256mb", "name": name})["id"]
    client.pause(made["lf-c-reap-paused"])
    deadline = time.monotonic() + 10
    while client.get(made["lf-c-reap-paused"])["status"] != "paused":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield client, made
    for sandbox_id in made.values():
        with contextlib.suppress(Exception):
            client.delete(sandbox_id)
    control_plane.wait_until_no_live(timeout=5.0)


def listed(capsys, *argv: str) -> tuple[int, list[dict]]:
    code = cli.main(["reap", "--json", *argv])
    data = json.loads(capsys.readouterr().out)
    return code, data["guests"]


def test_dry_run_lists_only_plugin_guests(guests, capsys):
    client, made = guests
    code, rows = listed(capsys)
    assert code == 0
    names = {r["name"] for r in rows}
    assert names == {"lf-reap-run", "lf-c-reap-paused", "lf-x-reap-run"}
    assert all(r["age_seconds"] is not None for r in rows)
    assert all(client.get(i)["status"] in ("running", "paused") for i in made.values())


def test_filters(guests, capsys):
    _, rows = listed(capsys, "--prefix", "lf-c-")
    assert [r["name"] for r in rows] == ["lf-c-reap-paused"]
    _, rows = listed(capsys, "--state", "paused")
    assert [r["name"] for r in rows] == ["lf-c-reap-paused"]
    _, rows = listed(capsys, "--prefix", "lf-x-", "--state", "running")
    assert [r["name"] for r in rows] == ["lf-x-reap-run"]
    _, rows = listed(capsys, "--older-than", "1h")
    assert rows == []


def test_yes_deletes_with_progress_and_summary(guests, capsys, control_plane):
    code = cli.main(["reap", "--yes"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "Deleted 3 of 3 guest(s)." in out
    assert "3/3" in err
    control_plane.wait_until_no_live(timeout=5.0, ignore_prefix="user-")
    live = {sb["name"] for sb in control_plane.live_sandboxes()}
    assert live == {"user-own-guest"}


def test_human_dry_run_output(guests, capsys):
    code = cli.main(["reap"])
    out = capsys.readouterr().out
    assert code == 0
    assert "3 guest(s) left behind by the plugin." in out
    assert "Dry run: nothing deleted" in out
    assert "user-own-guest" not in out


def test_parse_duration():
    assert cli.parse_duration("90s") == 90
    assert cli.parse_duration("30m") == 1800
    assert cli.parse_duration("2h") == 7200
    assert cli.parse_duration("1d") == 86400
    with pytest.raises(Exception, match="not a duration"):
        cli.parse_duration("soon")


def test_unreachable_control_plane_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("CREATEOS_SANDBOX_API_KEY", "k")
    monkeypatch.setenv("CREATEOS_SANDBOX_BASE_URL", "http://127.0.0.1:9")
    assert cli.main(["reap"]) == 2
    assert "could not be reached" in capsys.readouterr().err


def test_idle_picks_reused_guests_paused_past_the_lifetime(guests, capsys, control_plane):
    client, made = guests
    paused = made["lf-c-reap-paused"]
    while cli.clock.paused_seconds(client.get(paused), time.time()) <= 1.0:
        time.sleep(0.2)
    _, rows = listed(capsys, "--idle", "1h")
    assert rows == []  # paused, but not for an hour
    _, rows = listed(capsys, "--idle", "1s")
    assert [r["name"] for r in rows] == ["lf-c-reap-paused"]
    assert rows[0]["idle_seconds"] > 1.0
    assert cli.main(["reap", "--idle", "1s", "--yes"]) == 0
    assert "Deleted 1 of 1 guest(s)." in capsys.readouterr().out
    assert client.get(paused)["status"] in ("destroying", "destroyed")
    for name in ("lf-reap-run", "lf-x-reap-run", "user-own-guest"):
        assert client.get(made[name])["status"] == "running"
