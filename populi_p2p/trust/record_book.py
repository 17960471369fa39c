"""The book of verified NodeRecords: the only way a record gets into a node's view.

The daemon hands every member-metadata blob the swim core delivers to `accept`. A
record gets in only if it is signed by the key its node id names, carries a certificate
from this cluster's authority for that key (in the required scope, unexpired, not
revoked), and has a higher sequence than any record already seen for that node. Anything
else is dropped and counted by reason, never raised: a relay or an attacker can replay
or garble records, but only the owner can change its own.

Why a member is *unverified* is kept too (`refusal`): the reason its latest record was
refused, or that its record was dropped by a revocation or expiry. The daemon shows such
members as `unverified`, whatever their membership state, and ignores what their
refused record claims.

Re-delivery of the exact record already held (gossip repeats itself) is recognised by
its bytes and costs no signature check; a node's newer record that carries the same
certificate costs one (the record's), not two.
"""

from __future__ import annotations

from typing import Final

from overlay.admission import DropCounters

from .certificate import (
    DEFAULT_CLOCK_SKEW,
    DEFAULT_SCOPE,
    CertificateError,
    EnrollmentCertificate,
)
from .record import DEFAULT_MAX_RECORD_BYTES, NodeRecord, RecordError, SignedNodeRecord
from .revocation import RevocationList

__all__ = ["RECORD_DROP_REASONS", "RecordBook"]

#: Every reason `RecordBook.accept` drops a record for.
RECORD_DROP_REASONS: Final = (
    "malformed",
    "too_large",
    "bad_signature",
    "key_mismatch",
    "bad_certificate",
    "revoked",
    "stale_sequence",
    "full",
)


class RecordBook:
    """Verified records by node id, with drop counters.

    Args:
        authority_public_key: the cluster authority every certificate must come from.
        revocations: revocations heard so far (replace with `update_revocations`).
        required_scope: the certificate scope a member needs (None: any scope).
        max_records: nodes remembered; a record for a new node beyond this is `full`.
        max_record_bytes: the largest signed record accepted (`too_large` beyond).
        clock_skew: seconds a certificate's issue time may be ahead of our clock.
    """

    def __init__(
        self,
        authority_public_key: bytes,
        *,
        revocations: RevocationList | None = None,
        required_scope: str | None = DEFAULT_SCOPE,
        max_records: int = 4096,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        clock_skew: float = DEFAULT_CLOCK_SKEW,
    ) -> None:
        self._authority = authority_public_key
        self._revocations = revocations if revocations is not None else RevocationList()
        self._scope = required_scope
        self._max_records = max_records
        self._max_bytes = max_record_bytes
        self._skew = clock_skew
        self._signed: dict[str, SignedNodeRecord] = {}
        #: The verified certificate of each record held: a node's next record usually
        #: carries the same bytes, which then cost no second signature check.
        self._certs: dict[str, EnrollmentCertificate] = {}
        #: Drops by reason (see `RECORD_DROP_REASONS`).
        self.drops = DropCounters(RECORD_DROP_REASONS)
        #: Records accepted as new (a repeat of the current record is not counted).
        self.accepted = 0
        #: Why the latest record carried for a node id was refused (see `refusal`),
        #: at most `max_records` entries, oldest forgotten first.
        self._refused: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._signed)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._signed

    def get(self, node_id: str) -> NodeRecord | None:
        """The current record of `node_id`, if any."""
        signed = self._signed.get(node_id)
        return None if signed is None else signed.record

    def signed(self, node_id: str) -> bytes | None:
        """The exact signed bytes of `node_id`'s current record (to relay it unchanged)."""
        signed = self._signed.get(node_id)
        return None if signed is None else signed.raw

    def records(self) -> list[NodeRecord]:
        """All current records, sorted by node id."""
        return [self._signed[node_id].record for node_id in sorted(self._signed)]

    def accept(self, signed: bytes, now: float, *, node_id: str | None = None) -> NodeRecord | None:
        """Verify a signed record and keep it if it is new; drop and count it otherwise.

        Args:
            signed: the record bytes as received (swim member metadata).
            now: realtime, Unix seconds (for certificate validity).
            node_id: the node id the carrier claims (the swim member name); a record for
                another node is a `key_mismatch`.

        Returns:
            The node's current record: the new one, or the one already held when
            `signed` is a repeat of it. None when the record was dropped.
        """
        try:
            record = self._accept(signed, now, node_id)
        except RecordError as exc:
            self.drops.add(exc.reason)
            if node_id is not None and exc.reason != "stale_sequence":
                # An older record of the node's own, replayed: the newer one we hold
                # still stands. Anything else means the node's current record is bad.
                specific = exc.certificate_reason
                if specific in (None, "malformed", "bad_signature"):
                    specific = exc.reason  # the certificate as such: `bad_certificate`
                self._refuse(node_id, specific)
            return None
        if node_id is not None:
            self._refused.pop(node_id, None)
        return record

    def refusal(self, node_id: str) -> str | None:
        """Why `node_id` has no trustworthy record now, or None if its record verified.

        The reason the latest record carried for it was refused (`bad_signature`,
        `key_mismatch`, `revoked`, `malformed`, ..., or for its certificate
        `wrong_authority`, `expired`, `scope_mismatch`, ..., `bad_certificate`; an
        older record replayed over a newer one is not counted), or `revoked` /
        `expired` when `revalidate` dropped its record. Cleared when a record for it is
        accepted (or its current one arrives again), and by `forget`.
        """
        return self._refused.get(node_id)

    def _refuse(self, node_id: str, reason: str) -> None:
        refused = self._refused
        refused.pop(node_id, None)
        refused[node_id] = reason
        while len(refused) > self._max_records:
            refused.pop(next(iter(refused)))

    def _accept(self, signed: bytes, now: float, claimed: str | None) -> NodeRecord:
        if claimed is not None:
            held = self._signed.get(claimed)
            if held is not None and held.raw == signed:
                return held.record
        new = SignedNodeRecord.from_bytes(signed, max_bytes=self._max_bytes)
        record = new.record
        if claimed is not None and record.node_id != claimed:
            raise RecordError("key_mismatch", f"record of {record.node_id} carried as {claimed}")
        held = self._signed.get(record.node_id)
        if held is not None:
            if held.raw == signed:
                return held.record
            if record.sequence <= held.record.sequence:
                raise RecordError(
                    "stale_sequence",
                    f"sequence {record.sequence}, already have {held.record.sequence}",
                )
        elif len(self._signed) >= self._max_records:
            raise RecordError("full", f"already {self._max_records} records")
        cert = self._certs.get(record.node_id)
        try:
            if cert is None or cert.raw != record.certificate:
                cert = EnrollmentCertificate.from_bytes(record.certificate, self._authority)
            self._check(cert, record.public_key, now)
        except CertificateError as exc:
            if exc.reason == "revoked":
                raise RecordError("revoked", str(exc)) from None
            raise RecordError("bad_certificate", str(exc), certificate_reason=exc.reason) from None
        self._signed[record.node_id] = new
        self._certs[record.node_id] = cert
        self.accepted += 1
        return record

    def _check(self, cert: EnrollmentCertificate, public_key: bytes, now: float) -> None:
        cert.check(public_key, now, self._scope, self._revocations, clock_skew=self._skew)

    def forget(self, node_id: str) -> None:
        """Remove `node_id`'s record (the member is gone for good)."""
        self._signed.pop(node_id, None)
        self._certs.pop(node_id, None)
        self._refused.pop(node_id, None)

    @property
    def revocations(self) -> RevocationList:
        return self._revocations

    def update_revocations(self, revocations: RevocationList, now: float) -> list[str]:
        """Adopt a (merged) revocation list and drop records it revokes.

        Returns:
            The node ids whose records were removed, sorted.
        """
        self._revocations = revocations
        return self.revalidate(now)

    def revalidate(self, now: float) -> list[str]:
        """Drop records whose certificates have expired or been revoked since accepted.

        Call it after new revocations and now and then (certificates expire).

        Returns:
            The node ids whose records were removed, sorted.
        """
        removed: dict[str, str] = {}
        for node_id in sorted(self._signed):
            try:
                self._check(self._certs[node_id], self._signed[node_id].record.public_key, now)
            except CertificateError as exc:
                removed[node_id] = exc.reason
        for node_id, reason in removed.items():
            self.forget(node_id)
            self._refuse(node_id, reason)
        return list(removed)
