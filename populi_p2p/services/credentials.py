"""Admission at start-up: our key, the authority key, our certificate, verified.

Synchronous and before any socket is opened: a node its peers would refuse refuses to
start, with one line saying why and what to do (`NodeStartError`).
"""

from __future__ import annotations

import time

import attrs

from ..config import NodeConfig
from ..trust._keyfiles import KeyFileError, encode_public_key, ensure_private_dir
from ..trust.authority import read_authority_public_key, read_cluster_secret
from ..trust.certificate import (
    CertificateError,
    EnrollmentCertificate,
    read_certificate,
    verify_certificate,
)
from ..trust.identity import NodeIdentity
from ..trust.revocation import RevocationList
from .errors import NodeStartError
from .revocations import RevocationFiles

__all__ = ["Credentials", "load_credentials"]


@attrs.frozen
class Credentials:
    """What admission needs, loaded and verified once."""

    identity: NodeIdentity
    authority_key: bytes
    certificate: bytes
    decoded: EnrollmentCertificate
    revocations: RevocationList
    files: RevocationFiles
    cluster_secret: bytes | None


def load_credentials(config: NodeConfig) -> Credentials:
    """Load and verify this node's credentials.

    Raises:
        NodeStartError: one line naming the bad file and the fix.
    """
    try:
        ensure_private_dir(config.state_dir)
        identity = NodeIdentity.load_or_create(config.state_dir)
    except KeyFileError as exc:
        raise NodeStartError(str(exc)) from None
    except PermissionError:
        raise NodeStartError(
            f"no permission to use state dir {config.state_dir} (check --state-dir)"
        ) from None
    public = encode_public_key(identity.public_key)
    try:
        authority_key = read_authority_public_key(config.authority_pubkey_path)
    except OSError as exc:
        raise NodeStartError(
            f"cannot read the cluster authority key {config.authority_pubkey_path}:"
            f" {exc.strerror or exc} (copy authority.pub from the authority machine again,"
            " or pass --authority-pubkey)"
        ) from None
    except KeyFileError as exc:
        raise NodeStartError(
            f"no cluster authority key: {exc} (copy authority.pub from the authority"
            " machine into the state dir, or pass --authority-pubkey)"
        ) from None
    try:
        certificate = read_certificate(config.cert_path)
    except OSError as exc:
        raise NodeStartError(
            f"cannot read the enrollment certificate {config.cert_path}: {exc.strerror or exc}"
            f" (make it a readable file, or enroll again on the authority machine:"
            f" populi-node cluster enroll {public}, and pass it with --cert)"
        ) from None
    except KeyFileError as exc:
        raise NodeStartError(
            f"no enrollment certificate: {exc} (on the authority machine run:"
            f" populi-node cluster enroll {public}, then pass the file with --cert)"
        ) from None
    files = RevocationFiles(config.state_dir / "revocations", authority_key)
    revocations = files.load()
    try:
        decoded = verify_certificate(
            certificate, authority_key, identity.public_key, time.time(), revocations=revocations
        )
    except CertificateError as exc:
        raise NodeStartError(
            f"certificate {config.cert_path} refused ({exc}); enroll this node again:"
            f" populi-node cluster enroll {public}"
        ) from None
    secret = None
    if config.cluster_secret is not None:
        try:
            secret = read_cluster_secret(config.cluster_secret)
        except KeyFileError as exc:
            raise NodeStartError(
                f"cluster secret refused: {exc} (check --cluster-secret)"
            ) from None
    return Credentials(identity, authority_key, certificate, decoded, revocations, files, secret)
