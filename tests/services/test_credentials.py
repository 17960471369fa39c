"""`load_credentials`: our key, the authority key and our certificate, verified at
start-up, each refusal one line naming the file and the fix."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from populi_p2p.config import NodeConfig
from populi_p2p.services.credentials import load_credentials
from populi_p2p.services.errors import NodeStartError
from populi_p2p.trust._keyfiles import encode_public_key
from populi_p2p.trust.authority import (
    ClusterAuthority,
    write_authority_public_key,
    write_cluster_secret,
)
from populi_p2p.trust.certificate import write_certificate
from populi_p2p.trust.identity import NodeIdentity

AUTHORITY = ClusterAuthority.from_seed(b"A" * 32)
OTHER = ClusterAuthority.from_seed(b"Z" * 32)


def state_dir(tmp_path: Path, authority: ClusterAuthority = AUTHORITY) -> Path:
    """A state dir with a key, the authority's public key and a certificate by `authority`."""
    state = tmp_path / "state"
    identity = NodeIdentity.load_or_create(state)
    write_authority_public_key(state / "authority.pub", AUTHORITY.public_key)
    cert = authority.enroll(identity.public_key, now=time.time() - 60, serial=1)
    write_certificate(state / "node.cert", cert)
    return state


def config(state: Path, **flags: object) -> NodeConfig:
    return NodeConfig.load(None, {"state_dir": state, **flags})


def test_good_credentials_load_verified(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    creds = load_credentials(config(state))
    assert creds.identity.node_id == NodeIdentity.load_or_create(state).node_id
    assert creds.authority_key == AUTHORITY.public_key
    assert creds.decoded.node_public_key == creds.identity.public_key
    assert creds.cluster_secret is None
    assert len(creds.revocations) == 0


def test_a_cluster_secret_is_read_when_given(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    write_cluster_secret(tmp_path / "cluster.secret", b"s" * 32)
    creds = load_credentials(config(state, cluster_secret=tmp_path / "cluster.secret"))
    assert creds.cluster_secret == b"s" * 32


def test_no_authority_key_says_where_to_get_it(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    (state / "authority.pub").unlink()
    with pytest.raises(NodeStartError, match=r"no cluster authority key: .*--authority-pubkey"):
        load_credentials(config(state))


def test_no_certificate_gives_the_enroll_command(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    (state / "node.cert").unlink()
    public = encode_public_key(NodeIdentity.load_or_create(state).public_key)
    with pytest.raises(NodeStartError) as caught:
        load_credentials(config(state))
    assert f"populi-node cluster enroll {public}" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_certificate_from_another_authority_is_refused(tmp_path: Path) -> None:
    state = state_dir(tmp_path, authority=OTHER)
    with pytest.raises(NodeStartError, match=r"certificate .*node.cert refused \("):
        load_credentials(config(state))


def test_a_bad_cluster_secret_is_refused(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    (tmp_path / "cluster.secret").write_text("not hex\n")
    (tmp_path / "cluster.secret").chmod(0o600)
    with pytest.raises(NodeStartError, match=r"cluster secret refused: .*--cluster-secret"):
        load_credentials(config(state, cluster_secret=tmp_path / "cluster.secret"))
