"""The `blobs` record section: what a node advertises, and what a hostile section can
make us hold (at most `MAX_ADVERTISED` well-formed rows)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from populi_p2p.blobs.holders import (
    MAX_ADVERTISED,
    Advert,
    advert_section,
    mesh_catalogue,
    parse_advert,
    resolve,
)
from populi_p2p.blobs.store import BlobEntry


def entry(n: int, *, used: float = 0.0, kind: str = "model", complete: bool = True) -> BlobEntry:
    return BlobEntry(bytes([n]) * 32, 1000 + n, f"m{n}", kind, 0.0, used, complete)


def test_only_complete_models_are_advertised_most_recently_used_first() -> None:
    entries = [
        entry(1, used=5.0),
        entry(2, used=9.0),
        entry(3, used=7.0, complete=False),  # still fetching
        entry(4, used=8.0, kind="input"),  # a task's blob: its users name its holders
    ]
    assert advert_section(entries) == {
        "m": [[bytes([2]) * 32, 1002, "m2"], [bytes([1]) * 32, 1001, "m1"]]
    }
    assert advert_section([entry(4, kind="input")]) is None


def test_the_section_is_bounded() -> None:
    section = advert_section([entry(n, used=float(n)) for n in range(MAX_ADVERTISED + 5)])
    assert section is not None
    assert len(section["m"]) == MAX_ADVERTISED
    assert [row[2] for row in section["m"]][:2] == [
        f"m{MAX_ADVERTISED + 4}",
        f"m{MAX_ADVERTISED + 3}",
    ]


def test_a_section_round_trips() -> None:
    section = advert_section([entry(1), entry(2)])
    assert parse_advert(section) == [
        Advert(bytes([1]) * 32, 1001, "m1"),
        Advert(bytes([2]) * 32, 1002, "m2"),
    ]


@pytest.mark.parametrize(
    "row",
    [
        [b"\x01" * 31, 10, "short digest"],
        ["ab" * 32, 10, "digest as text"],
        [b"\x01" * 32, -1, "negative size"],
        [b"\x01" * 32, True, "a bool size"],
        [b"\x01" * 32, 10, ""],
        [b"\x01" * 32, 10, "new\nline"],
        [b"\x01" * 32, 10],
        "not a row",
    ],
)
def test_malformed_rows_are_skipped_and_the_rest_kept(row: object) -> None:
    good = [b"\x02" * 32, 5, "good"]
    assert parse_advert({"m": [row, good]}) == [Advert(b"\x02" * 32, 5, "good")]


def test_a_hostile_section_yields_at_most_the_bound() -> None:
    rows = [[bytes([n % 256]) * 32, n, f"b{n}"] for n in range(1000)]
    assert len(parse_advert({"m": rows})) == MAX_ADVERTISED


@given(
    st.recursive(
        st.none() | st.integers() | st.binary(max_size=40) | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=2), inner, max_size=3)
        ),
        max_leaves=20,
    )
)
def test_any_section_parses_without_raising(section: object) -> None:
    assert len(parse_advert(section)) <= MAX_ADVERTISED


def test_the_catalogue_lists_each_blob_with_its_holders_in_node_order() -> None:
    a, b = [bytes([1]) * 32, 10, "llama"], [bytes([2]) * 32, 20, "qwen"]
    catalogue = mesh_catalogue({"n2": {"m": [a]}, "n1": {"m": [a, b]}, "n3": None})
    assert set(catalogue) == {a[0], b[0]}
    assert catalogue[a[0]].holders == ["n1", "n2"]
    assert catalogue[a[0]].names == {"llama"} and catalogue[a[0]].sizes == {10}
    assert catalogue[b[0]].holders == ["n1"]


def test_resolve_by_name_hash_or_prefix_and_refuse_ambiguity() -> None:
    one, two = bytes([0xAB]) * 32, bytes([0xAB]) * 4 + bytes([0xCD]) * 28
    catalogue = mesh_catalogue(
        {"n1": {"m": [[one, 1, "llama"], [two, 2, "llama-too"]]}, "n2": {"m": [[two, 2, "llama"]]}}
    )
    assert resolve("llama-too", catalogue) == two
    assert resolve(one.hex(), catalogue) == one
    assert resolve(two.hex()[:10], catalogue) == two
    with pytest.raises(LookupError, match="names 2 different blobs"):
        resolve("llama", catalogue)  # two members call different blobs by the name
    with pytest.raises(LookupError, match="names 2 different blobs"):
        resolve("abababab", catalogue)
    with pytest.raises(LookupError, match="no member advertises a model 'mistral'"):
        resolve("mistral", catalogue)
    with pytest.raises(LookupError, match="no member advertises"):
        resolve("abab", catalogue)  # a prefix under 8 characters is no prefix
