"""csrc/fuzz/Makefile's merge: a corpus at MERGE_MAX_FILES files still takes what is new. Past
the cap it is remade (its named seeds, then the fewest inputs that reach everything the corpus
and the new inputs reach) instead of left as it was, which had envelope and exec_result stop
growing at 400 files. Runs the real Makefile on fuzz_json_quote (built with clang into a
directory of the test's own, about 10 s) over a corpus of the test's own."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FUZZ = ROOT / "csrc" / "fuzz"
HASH = re.compile(r"^[0-9a-f]{40}$")

pytestmark = [
    pytest.mark.skipif(shutil.which("clang") is None, reason="needs clang (make fuzz's compiler)"),
    pytest.mark.timeout(600),
]


def test_a_corpus_at_its_cap_still_takes_new_coverage(tmp_path: Path) -> None:
    """Fails on ac8509d: there a corpus at MERGE_MAX_FILES was not merged at all."""
    full = sorted((FUZZ / "corpus" / "json_quote").iterdir())
    named = [f for f in full if not HASH.match(f.name)]
    hashed = [f for f in full if HASH.match(f.name)]
    assert named and len(hashed) > 20
    corpus, work = tmp_path / "corpus" / "json_quote", tmp_path / "work" / "json_quote"
    corpus.mkdir(parents=True)
    work.mkdir(parents=True)
    for f in [*named, *hashed[:5]]:  # at the cap of 5 the test sets
        shutil.copy(f, corpus)
    for f in hashed[5:]:  # what a fuzzing run found: new coverage
        shutil.copy(f, work)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # make sanitize's runtimes
    done = subprocess.run(
        ["make", "-s", "-C", str(FUZZ), "run-json_quote", "FUZZ_SECONDS=1", "MERGE_MAX_FILES=5",
         f"CORPUS={tmp_path / 'corpus'}", f"WORK={tmp_path / 'work'}", f"BIN={os.path.relpath(tmp_path / 'bin', FUZZ)}"],
        capture_output=True, text=True, env=env, timeout=560,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    kept = {f.name for f in corpus.iterdir()}
    assert {f.name for f in named} <= kept, kept  # the hand-written seeds stay, by name
    found = {f.name for f in hashed[5:]}
    assert kept & found, done.stdout  # the new inputs' coverage came in
    assert "remade" in done.stdout, done.stdout
