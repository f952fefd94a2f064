"""The host's reading of the guest runner's output stream: lines sorted into authenticated
frames and plain output, each frame held to its type's byte limit and a decode-cost bound
before it is decoded (docs/executor.md, frame limits). Host only; the frame format itself is
`framing.py`. Imports nothing of lfx.
"""

from __future__ import annotations

import hmac
import json
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate, count
from typing import Any

from langflow_sandbox_createos.executor.framing import FRAME_LIMITS, MAC_HEX, MAGIC, frame_mac

MIB = 1024 * 1024
# The frame types and their byte limits are framing.FRAME_TYPES: an authentic frame of another
# type, or over its limit, fails the run (it is never kept).
MAX_FRAME_LINE = max(FRAME_LIMITS.values()) + 256  # the header before the JSON
# What decoding one frame may cost on top of its text: Python's objects for JSON made mostly
# of structure take ~30 times the text ("[{},{},...]": 16 MiB decoded to 354 MiB), so the
# cost is estimated from above first and a frame over the budget is refused undecoded.
DECODE_FACTOR = 8
DECODE_FLOOR = 2 * MIB
# The deepest nesting of arrays and objects a frame may hold. json.loads recurses once per
# level (a 10 kB "[[[...]]]" raised RecursionError out of `FrameReader.feed`), and so does host
# code that walks a decoded frame; what lfx sends (results, events, messages) nests a few
# levels deep.
MAX_FRAME_DEPTH = 128
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
# brackets as the bytes 2 (open) and 0 (close): the depth after k of them is their sum - k
_BRACKET_STEPS = bytes.maketrans(b"[]{}", b"\x02\x00\x02\x00")


def decode_cost(body: str) -> int:
    """An upper bound of the memory json.loads takes for `body` (its text included): a dict
    per brace, a list per bracket, an object per comma or colon (the counts include those in
    strings, which only raises the bound)."""
    return (
        len(body)
        + 232 * body.count("{")
        + 64 * body.count("[")
        + 72 * (body.count(",") + body.count(":") + 1)
    )


def decode_budget(body: str) -> int:
    return DECODE_FACTOR * len(body) + DECODE_FLOOR


def nesting_depth(body: str) -> int:
    """How deep the arrays and objects of the JSON text `body` nest, found without decoding it
    nor recursing, each pass in C: escaped backslashes and quotes are dropped, so every quote
    left opens or closes a string; the strings go (a bracket in one is text); the depth is the
    highest running count of the brackets left. Where `body` is JSON up to some point (all
    json.loads reads before it fails) the count is exact up to that point."""
    text = body.replace("\\\\", "").replace('\\"', "") if "\\" in body else body
    brackets = _NOT_BRACKET.sub("", "".join(text.split('"')[0::2])).encode("ascii")
    return max(map(operator.sub, accumulate(brackets.translate(_BRACKET_STEPS)), count(1)), default=0)


class FrameRefused(ValueError):
    """An authentic frame the host refuses to decode (unknown type, too large, too dense, too
    deep)."""


_JOIN_EVERY = 256


@dataclass
class FrameReader:
    """Splits one output stream into lines and sorts them into authenticated frames and
    plain output. Never raises on what the guest prints."""

    key: bytes
    on_frame: Callable[[dict[str, Any]], None]
    on_plain: Callable[[str], None]
    max_line: int = MAX_FRAME_LINE
    # an authentic frame refused undecoded (see FRAME_LIMITS): the run must fail
    on_refused: Callable[[FrameRefused], None] | None = None
    next_seq: int = 0
    rejected: int = 0
    # a line still waiting for its newline. A guest can send it in millions of tiny pieces,
    # and a str object costs ~50 bytes on top of its text: the newest pieces are joined
    # into one chunk every _JOIN_EVERY, so the memory is about the text itself
    _pieces: list[str] = field(default_factory=list)
    _chunks: list[str] = field(default_factory=list)
    _buffered: int = 0

    def feed(self, text: str) -> None:
        while text:
            newline = text.find("\n")
            if newline < 0:
                self._pieces.append(text)
                self._buffered += len(text)
                if len(self._pieces) >= _JOIN_EVERY:
                    self._chunks.append("".join(self._pieces))
                    self._pieces.clear()
                if self._buffered > self.max_line:  # not a frame we could accept anyway
                    self.rejected += 1
                    line = self._take()
                    if line.startswith(MAGIC + " ") and self.on_refused is not None:
                        # only flow code writes such a line on the frame channel
                        self.on_refused(FrameRefused(f"a frame line over the {self.max_line}-byte limit"))
                    else:
                        self.on_plain(line)
                return
            if self._buffered:
                self._pieces.append(text[:newline])
                line = self._take()
            else:
                line = text[:newline]
            text = text[newline + 1 :]
            self._line(line)

    def close(self) -> None:
        if self._buffered:
            self._line(self._take())

    def _take(self) -> str:
        line = "".join(self._chunks) + "".join(self._pieces)
        self._chunks.clear()
        self._pieces.clear()
        self._buffered = 0
        return line

    def _line(self, line: str) -> None:
        try:
            frame = self._authenticate(line.rstrip("\r"))
        except FrameRefused as refused:
            self.rejected += 1
            if self.on_refused is not None:
                self.on_refused(refused)
            return
        if frame is None:
            if line.strip():
                self.on_plain(line)
            return
        self.on_frame(frame)

    def _authenticate(self, line: str) -> dict[str, Any] | None:
        if not line.startswith(MAGIC + " "):
            return None
        parts = line.split(" ", 4)
        if len(parts) != 5:
            self.rejected += 1
            return None
        _, seq_text, mac, kind, body = parts
        if seq_text != str(self.next_seq) or len(mac) != MAC_HEX:
            self.rejected += 1
            return None
        if not hmac.compare_digest(mac, frame_mac(self.key, self.next_seq, kind, body)):
            self.rejected += 1
            return None
        self.next_seq += 1  # authentic: from here on, a bad frame fails the run
        shown = repr(kind[:40])
        limit = FRAME_LIMITS.get(kind)
        if limit is None:
            raise FrameRefused(f"a frame of unknown type {shown}")
        if len(body) > limit:
            raise FrameRefused(f"a {shown} frame of {len(body)} bytes, over its {limit}-byte limit")
        if decode_cost(body) > decode_budget(body):
            raise FrameRefused(
                f"a {shown} frame of {len(body)} bytes that would take more than "
                f"{decode_budget(body)} bytes to decode (mostly structure)"
            )
        # as many brackets as levels (strings' included) is the most it can nest: most frames
        # stop there, the rest are scanned (about 100 ms for 6 MiB of text, json.loads 60 ms)
        opens = body.count("[") + body.count("{")
        if opens > MAX_FRAME_DEPTH and nesting_depth(body) > MAX_FRAME_DEPTH:
            raise FrameRefused(f"a {shown} frame nested deeper than {MAX_FRAME_DEPTH} levels")
        try:
            frame = json.loads(body)
        except ValueError:
            raise FrameRefused(f"a {shown} frame that is not JSON") from None
        if not isinstance(frame, dict) or frame.get("t") != kind:
            raise FrameRefused(f"a {shown} frame whose body names another type")
        return frame
