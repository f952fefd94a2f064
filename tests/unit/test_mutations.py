"""The mutation table (tests/mutations/mutations.toml) still fits the code: every edit's anchor
occurs exactly once in its file, the edits of one mutation apply in turn, and every test file
named exists. A product change that moves an anchor fails here, in make test, rather than in
`make mutations` later."""

from __future__ import annotations

from types import ModuleType

import pytest


def test_every_mutation_applies_and_names_a_test_that_exists(
    mutations: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    table = mutations.load()
    assert mutations.check(table) == 0, capsys.readouterr().out
    assert {m.issue for m in table} >= {32, 43}
    # issue 43's eight breaks are all held, each with a test that must fail
    issue_43 = {
        "seccomp-io-uring",
        "stage-upload-on-loop",
        "frame-size-check-off",
        "bridge-request-cap-off",
        "bridge-in-flight-cap-off",
        "history-read-unpinned",
        "stored-without-owner",
        "doctor-wrong-range",
    }
    assert issue_43 <= {m.name for m in table}
    assert all(m.expect and m.test_args for m in table)


def test_the_ci_subset_waits_for_no_other_branch(mutations: ModuleType) -> None:
    assert [m.name for m in mutations.load() if m.ci and m.awaits] == []


def test_an_anchor_that_no_longer_occurs_is_reported(
    mutations: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    (m,) = [m for m in mutations.load() if m.name == "doctor-wrong-range"]
    moved = mutations.Edit(m.edits[0].path, m.edits[0].anchor.replace("169.254", "169.255"), "")
    broken = mutations.Mutation(**{**m.__dict__, "edits": (moved,)})
    assert mutations.check([broken]) == 1
    assert "the anchor occurs 0 times, not once" in capsys.readouterr().out
