"""Every message the docs quote verbatim is one the code can produce.

What counts as a quoted message is the rule in docs/index.md ("Quoted messages"): bold code
spans, code spans in a table column headed Message / Message starts with / Message says /
Symptom, code spans that start with one of the plugin's message prefixes, and block quotes.
`...`, `…`, `<…>`, `[...]`, `(...)`, `'...'` and a lone `N` stand for text the code fills in.
Each literal part must be text the code holds (the package, createos-local, csrc/, the
scripts, or lfx's dispatcher and policies, which answer before the plugin does), joined only
where the code fills something in (docs_drift.Corpus.covers).
"""

from __future__ import annotations

import docs_drift as docs
import pytest

QUOTES = [quote for path in docs.doc_files() for quote in docs.quoted_messages(path)]


@pytest.mark.parametrize("quote", QUOTES, ids=lambda q: f"{docs.rel(q.path)}:{q.line}")
def test_quoted_message_is_one_the_code_can_produce(quote: docs.Quote) -> None:
    corpus = docs.all_corpus()
    missing = [part for part in docs.fragments(quote.text) if not corpus.covers(part)]
    assert not missing, (
        f"{quote.where()} quotes {quote.text!r}, but no code says {missing}: fix the quote (or the "
        "code), or mark what the code fills in with ... (docs/index.md, Quoted messages)"
    )


def test_the_rule_finds_the_quotes_of_every_kind() -> None:
    kinds = {quote.how.split(" ")[0] for quote in QUOTES}
    assert kinds == {"bold", "message", "table", "block"}, kinds
    assert len(QUOTES) >= 60  # backend.md's troubleshooting list alone has 30


def test_the_matcher_tells_real_messages_from_made_up_ones() -> None:
    corpus = docs.our_corpus()
    real = [
        # an f-string whose action and hint are filled in from constants
        "CreateOS: could not verify the API key (GET /v1/whoami):",
        # the C core: printf conversions are holes, the number fills one
        "exec failed: HTTP 200: the stream ended without an exit_code frame",
        # a !r value the code holds
        "the reused guest <id> is in state 'error' and cannot run code.",
        "No CreateOS shape has at least 8192 MiB (max(LANGFLOW_SANDBOX_MEMORY_MB=..., 4096)); the largest is",
    ]
    for text in real:
        assert all(corpus.covers(part) for part in docs.fragments(text)), text
    made_up = [
        # docs/backend.md at d5bde57: no code ever said this
        "CreateOS: the exec stream of guest",
        "ended without an exit status; the control plane or the network dropped it.",
        # one word changed in a real message
        "CreateOS: could not verify the API key (GET /v1/whoami) now",
        "the control plane is rate limiting this user; retry later",
        "No CreateOS shape has at most",
    ]
    for text in made_up:
        assert not corpus.covers(text), text


def test_placeholders_split_a_quote() -> None:
    assert docs.fragments("CREATEOS_SANDBOX_SHAPE='...' has ... MiB, below X=.... Pin it") == [
        "CREATEOS_SANDBOX_SHAPE=",
        "has",
        "MiB, below X=",
        ". Pin it",
    ]
    assert docs.fragments("SandboxUnavailableError: Refusing to reuse guest …") == ["Refusing to reuse guest"]
    assert docs.fragments("flow <id> ran in N s") == ["flow", "ran in"]  # "s" alone checks nothing
