"""A record's names and labels are validated when it is decoded (issue 18, row 5).

A member signs its own record, so a signature proves only who wrote a name, not that
the name is safe to print: control characters and newlines in it made `members` print
raw terminal escapes and a forged "ghost" row. Decoding now refuses any record whose
name, labels, address or version are not printable text within their length; the
record book drops it, counted as `malformed`, like any other bad record.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.trust._codec import pack_canonical
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.identity import NodeIdentity
from populi_p2p.trust.record import (
    MAX_LABEL_VALUE_LENGTH,
    MAX_NAME_LENGTH,
    RECORD_CONTEXT,
    Capabilities,
    NodeRecord,
    NodeStatus,
    RecordError,
    SignedNodeRecord,
)
from populi_p2p.trust.record_book import RecordBook

from .conftest import NOW

AUTHORITY = ClusterAuthority.from_seed(b"A" * 32)
NODE = NodeIdentity.from_seed(b"n" * 32)
CERT = AUTHORITY.enroll(NODE.public_key, now=NOW, expires_in=365 * 86400).raw

#: What a hostile member put in its name: a colour escape, a cursor move, a newline
#: that starts a forged row, C1 controls, and the Unicode tricks a terminal renders.
HOSTILE = [
    "\x1b[31mred\x1b[0m",
    "box\x1b[2J",
    "box\n  ghost     abcdef  10.0.0.9:7946  alive",
    "box\r",
    "tab\there",
    "del\x7f",
    "c1-csi\x9b31m",
    "c1-nel\x85",
    "line\u2028sep",
    "para\u2029sep",
    "bidi\u202eevil",
    "isolate\u2066x\u2069",
    "zero\u200bwidth",
    "nbsp\u00a0name",
    "nul\x00",
]


def forged(name: str = "box", labels: dict[str, str] | None = None, **changes: Any) -> bytes:
    """A record signed by its own key, built without `NodeRecord`'s checks: what an
    insider's modified daemon can sign and gossip."""
    fields: dict[str, Any] = {
        "address": "10.0.0.5",
        "software_version": "0.1.0",
        "labels": {"rack": "b2"} if labels is None else labels,
    }
    fields.update(changes)
    body = pack_canonical(
        [
            1, NODE.node_id, NODE.public_key, name, fields["address"], 7946,
            fields["software_version"], 1, NOW, 1, 0, 4, 1 << 30, None, fields["labels"], CERT,
        ]
    )  # fmt: skip
    return body + NODE.sign(RECORD_CONTEXT, body)


def refused(raw: bytes) -> RecordError:
    with pytest.raises(RecordError) as info:
        SignedNodeRecord.from_bytes(raw)
    book = RecordBook(AUTHORITY.public_key)
    assert book.accept(raw, NOW) is None
    assert book.drops["malformed"] == 1 and book.drops.total == 1 and len(book) == 0
    return info.value


def test_the_forger_is_sound() -> None:
    """The same forger with a plain name gives a record every member accepts."""
    record = RecordBook(AUTHORITY.public_key).accept(forged("box"), NOW)
    assert record is not None and record.name == "box" and record.labels == {"rack": "b2"}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_name_is_refused_on_decode(name: str) -> None:
    error = refused(forged(name))
    assert error.reason == "malformed"
    assert "name must be printable text" in str(error)
    assert "U+" in str(error)


@pytest.mark.parametrize("where", ["key", "value"])
def test_a_hostile_label_is_refused_on_decode(where: str) -> None:
    labels = {"rack\x1b[8m": "b2"} if where == "key" else {"rack": "b2\nghost"}
    assert "label" in str(refused(forged(labels=labels)))


def test_hostile_address_and_version_are_refused_on_decode() -> None:
    refused(forged(address="10.0.0.5\x1b]0;pwned\x07"))
    refused(forged(software_version="0.1\r\n"))


def test_lengths_are_enforced_on_decode() -> None:
    refused(forged("x" * (MAX_NAME_LENGTH + 1)))
    refused(forged(labels={"k": "v" * (MAX_LABEL_VALUE_LENGTH + 1)}))
    assert RecordBook(AUTHORITY.public_key).accept(forged("x" * MAX_NAME_LENGTH), NOW)


def test_a_hostile_name_cannot_be_signed_either() -> None:
    """The same check holds when a record is built: one line naming the character."""
    with pytest.raises(ValueError, match=r"name must be printable text: U\+001B at 0"):
        NodeRecord(
            node_id=NODE.node_id, public_key=NODE.public_key, name="\x1b[31m",
            address="10.0.0.5", port=7946, software_version="0.1.0", protocol_version=1,
            started_at=NOW, sequence=1, status=NodeStatus.AVAILABLE,
            capabilities=Capabilities(cpu_cores=1, ram_bytes=1), certificate=CERT,
        )  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    st.text(max_size=MAX_NAME_LENGTH - 1),
    st.characters(codec="utf-8", categories=("Cc", "Cf", "Zl", "Zp")),
    st.integers(0, MAX_NAME_LENGTH),
)
def test_any_name_with_a_control_or_format_character_is_refused(
    text: str, bad: str, at: int
) -> None:
    name = text[:at] + bad + text[at:]
    assert refused(forged(name)).reason == "malformed"


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        st.characters(codec="utf-8", exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Z")),
        max_size=MAX_NAME_LENGTH,
    ),
    st.dictionaries(
        st.text(st.characters(codec="ascii", categories=("L", "N")), min_size=1, max_size=8),
        st.text(st.characters(codec="utf-8", categories=("L", "N", "P")), max_size=16),
        max_size=4,
    ),
)
def test_printable_names_and_labels_round_trip(name: str, labels: dict[str, str]) -> None:
    record = RecordBook(AUTHORITY.public_key).accept(forged(name, labels), NOW)
    assert record is not None and record.name == name and dict(record.labels) == labels
