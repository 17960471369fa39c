"""populi node: identity, signed NodeRecords, GPU truth, state on disk, local API, CLI.

The public types of the node's pure parts are re-exported here: identity and cluster
admission (keys, certificates, revocations), signed NodeRecords and the book that
verifies them, the member store and the daemon's configuration. GPU truth has its own
package, `populi_p2p.gpu`. The daemon itself (`populi_p2p.node.Node`, `run_node`,
`NodeStartError`) and the local API client (`populi_p2p.api.ApiClient`) are imported
from their modules: they pull in Trio, hypercorn, httpx and the overlay, which would
make importing this package heavy. (`overlay/` imports nothing from here: the packet
envelope is handed populi's keys by `populi_p2p.trust.envelope_keys`.)
"""

from .config import ConfigError as ConfigError
from .config import NodeConfig as NodeConfig
from .store import KnownMember as KnownMember
from .store import MemberStore as MemberStore
from .store import StoreError as StoreError
from .trust.authority import ClusterAuthority as ClusterAuthority
from .trust.authority import cluster_fingerprint as cluster_fingerprint
from .trust.certificate import CertificateError as CertificateError
from .trust.certificate import EnrollmentCertificate as EnrollmentCertificate
from .trust.certificate import read_certificate as read_certificate
from .trust.certificate import verify_certificate as verify_certificate
from .trust.certificate import write_certificate as write_certificate
from .trust.identity import KeyFileError as KeyFileError
from .trust.identity import NodeIdentity as NodeIdentity
from .trust.identity import node_id_from_public_key as node_id_from_public_key
from .trust.record import Capabilities as Capabilities
from .trust.record import NodeRecord as NodeRecord
from .trust.record import NodeStatus as NodeStatus
from .trust.record import RecordError as RecordError
from .trust.record import SignedNodeRecord as SignedNodeRecord
from .trust.record_book import RecordBook as RecordBook
from .trust.revocation import Revocation as Revocation
from .trust.revocation import RevocationList as RevocationList

__all__ = [
    "Capabilities",
    "CertificateError",
    "ClusterAuthority",
    "ConfigError",
    "EnrollmentCertificate",
    "KeyFileError",
    "KnownMember",
    "MemberStore",
    "NodeConfig",
    "NodeIdentity",
    "NodeRecord",
    "NodeStatus",
    "RecordBook",
    "RecordError",
    "Revocation",
    "RevocationList",
    "SignedNodeRecord",
    "StoreError",
    "cluster_fingerprint",
    "node_id_from_public_key",
    "read_certificate",
    "verify_certificate",
    "write_certificate",
]
