"""The relay's hot path decodes nothing: `scan_batch` must agree with decoding every
event (`chunk_text`) on what a batch is, and `recover_text` must give back exactly the
text forwarded, whatever the text holds (quotes, backslashes, the word "content"),
however the bytes were cut."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from populi_p2p.inference.sse import (
    SseSplitter,
    chunk_text,
    recover_text,
    scan_batch,
    split_events,
)

TEXT = st.lists(
    st.sampled_from(["a", " ", '"', "\\", "\n", "é", "{", "}", ":", "content", '"text"']),
    max_size=8,
).map("".join)


@st.composite
def chunks(draw: st.DrawFn, chat: bool) -> dict[str, Any]:
    piece = draw(st.one_of(TEXT, st.none()))
    finish = draw(st.sampled_from([None, None, None, "stop", "length"]))
    if chat:
        delta: dict[str, Any] = {} if piece is None else {"content": piece}
        if draw(st.booleans()):
            delta["role"] = "assistant"
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": piece or "", "finish_reason": finish}
    return {"id": "x", "object": "chunk", "choices": [choice]}


def encode(chunk: dict[str, Any], compact: bool) -> bytes:
    text = json.dumps(chunk, separators=(",", ":") if compact else None, ensure_ascii=compact)
    return b"data: " + text.encode() + b"\n\n"


@given(st.booleans(), st.booleans(), st.data())
def test_scan_agrees_with_decoding(chat: bool, compact: bool, data: st.DataObject) -> None:
    batch = data.draw(st.lists(chunks(chat), min_size=1, max_size=6))
    whole = b"".join(encode(c, compact) for c in batch)
    decoded = [chunk_text(c, chat) for c in batch]
    scanned = scan_batch(whole, chat)
    if any(fin for _, fin in decoded):
        assert scanned is None  # a batch that may end the stream is always decoded
    else:
        assert scanned == sum(1 for piece, _ in decoded if piece)  # plain: the fast path


def test_scan_sends_done_errors_and_comments_to_decoding() -> None:
    plain = encode({"choices": [{"delta": {"content": "a"}, "finish_reason": None}]}, False)
    assert scan_batch(plain, True) == 1
    assert scan_batch(plain + b"data: [DONE]\n\n", True) is None
    assert scan_batch(plain + b'data: {"error": {"message": "x"}}\n\n', True) is None
    assert scan_batch(b": keep-alive\n\n" + plain, True) is None
    assert scan_batch(plain + b": keep-alive\n\n", True) is None
    assert scan_batch(plain + b"data: not json\n\n", True) is None
    assert scan_batch(plain + b"event: x\ndata: {}\n\n", True) is None
    assert scan_batch(plain + b"data: {}\n\n", True) == 1


@given(st.booleans(), st.data())
def test_recover_text_is_the_text_forwarded_however_cut(chat: bool, data: st.DataObject) -> None:
    batch = data.draw(st.lists(chunks(chat), max_size=8))
    stream = b"".join(encode(c, data.draw(st.booleans())) for c in batch)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=5)))
    splitter = SseSplitter()
    runs = [
        splitter.feed_whole(stream[a:b])
        for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)
    ]
    pieces = [p for p, _ in (chunk_text(c, chat) for c in batch) if p]
    assert recover_text(runs, chat) == ("".join(pieces), len(pieces))
    assert b"".join(runs) == stream  # every whole event, in order, nothing held back
    assert len(split_events(stream)) == len(batch)


def test_recover_text_refuses_what_is_not_json() -> None:
    assert recover_text([b"data: {not json}\n\n"], True) is None
