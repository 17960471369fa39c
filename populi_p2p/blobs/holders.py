"""Who holds which blob: the ``blobs`` section of the signed NodeRecord.

Each node advertises up to `MAX_ADVERTISED` of its complete *model* blobs (the most
recently used first) in its record, so the mesh learns who holds a model the way it
learns everything else about a node: signed by the node, gossiped, bounded. Other
blobs (a task's inputs and outputs) are not advertised; whoever names them also names
their holders.

Section ``blobs``::

    {"m": [[digest (32 bytes), size, name], ...],    complete blobs
     "p": [[digest (32 bytes), size, name], ...]}    blobs being fetched here, whose
                                                      verified chunks are served
                                                      (at most MAX_ADVERTISED in all)

A section is a member's claim, and anything received is hostile: `parse_advert` takes
at most `MAX_ADVERTISED` well-formed entries and ignores the rest, so one member makes
us hold at most that many rows; a claim is only ever a hint of whom to ask (a holder
that lies is skipped by the fetch and counted).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from .manifest import DIGEST_BYTES, MAX_BLOB_BYTES
from .store import MAX_NAME, BlobEntry

__all__ = [
    "MAX_ADVERTISED",
    "SECTION",
    "Advert",
    "advert_section",
    "mesh_catalogue",
    "parse_advert",
]

#: The record section's name.
SECTION: Final = "blobs"
#: Most blobs one node advertises (the record must fit a packet: about 80 bytes each).
MAX_ADVERTISED: Final = 8
#: Only blobs of this kind are advertised.
MODEL_KIND: Final = "model"


@attrs.frozen
class Advert:
    """One blob a node says it holds (`partial`: it is fetching it, and serves the
    chunks it has verified)."""

    digest: bytes
    size: int
    name: str
    partial: bool = False


def advert_section(
    entries: Iterable[BlobEntry], fetching: Collection[bytes] = ()
) -> dict[str, Any] | None:
    """The section for our complete model blobs, then those being fetched here (None:
    nothing to advertise)."""
    models = [e for e in entries if e.kind == MODEL_KIND]
    models.sort(key=lambda e: (-e.used, e.hex))
    complete = [e for e in models if e.complete][:MAX_ADVERTISED]
    partial = [e for e in models if not e.complete and e.digest in fetching]
    partial = partial[: MAX_ADVERTISED - len(complete)]
    section = {
        key: [[e.digest, e.size, e.name] for e in rows]
        for key, rows in (("m", complete), ("p", partial))
        if rows
    }
    return section or None


def parse_advert(section: Any) -> list[Advert]:
    """The well-formed entries of a member's section (hostile input: never raises)."""
    if not isinstance(section, dict):
        return []
    out = _parse_rows(section.get("m"), partial=False)
    return out + _parse_rows(section.get("p"), partial=True)[: MAX_ADVERTISED - len(out)]


def _parse_rows(rows: Any, *, partial: bool) -> list[Advert]:
    out: list[Advert] = []
    for row in rows[:MAX_ADVERTISED] if isinstance(rows, list) else []:
        if not (isinstance(row, list) and len(row) == 3):
            continue
        digest, size, name = row
        if not (isinstance(digest, bytes) and len(digest) == DIGEST_BYTES):
            continue
        if not (type(size) is int and 0 <= size <= MAX_BLOB_BYTES):
            continue
        if not (isinstance(name, str) and 0 < len(name) <= MAX_NAME and name.isprintable()):
            continue
        out.append(Advert(digest, size, name, partial))
    return out


@attrs.define
class MeshBlob:
    """A blob some members advertise: its size and names as claimed, and who holds it
    whole (`holders`) or is fetching it (`partial`)."""

    digest: bytes
    sizes: set[int] = attrs.field(factory=set)
    names: set[str] = attrs.field(factory=set)
    holders: list[str] = attrs.field(factory=list)
    partial: list[str] = attrs.field(factory=list)

    def sources(self) -> list[str]:
        """Whom a fetch asks, in order: the complete holders first."""
        return self.holders + [n for n in self.partial if n not in self.holders]


def mesh_catalogue(sections: Mapping[str, Any]) -> dict[bytes, MeshBlob]:
    """Every advertised blob from {node id: its ``blobs`` section}."""
    out: dict[bytes, MeshBlob] = {}
    for node in sorted(sections):
        for advert in parse_advert(sections[node]):
            blob = out.setdefault(advert.digest, MeshBlob(advert.digest))
            blob.sizes.add(advert.size)
            blob.names.add(advert.name)
            listed = blob.partial if advert.partial else blob.holders
            if node not in listed:
                listed.append(node)
    return out


def resolve(name_or_hash: str, catalogue: Mapping[bytes, MeshBlob]) -> bytes:
    """The digest a name or hash (or unique 8+ character prefix) stands for in the mesh.

    Raises:
        LookupError: no member advertises it, or it is ambiguous (one line).
    """
    text = name_or_hash.lower()
    hits: Sequence[bytes] = sorted(d for d, b in catalogue.items() if name_or_hash in b.names)
    if not hits and len(text) >= 8:
        hits = sorted(d for d in catalogue if d.hex().startswith(text))
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise LookupError(
            f"no member advertises a model {name_or_hash!r} (populi-node model ls shows the"
            " mesh's; a full 64-character hash is fetched from holders named explicitly)"
        )
    raise LookupError(f"{name_or_hash!r} names {len(hits)} different blobs: give the hash")
