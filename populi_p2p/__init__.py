"""populi node: identity, signed NodeRecords, GPU truth, state on disk, local API, CLI.

The public types of the node's pure parts are re-exported here: identity and cluster
admission (keys, certificates, revocations), signed NodeRecords and the book that
verifies them, the member store and the daemon's configuration. GPU truth has its own
package, `populi_p2p.gpu`. The daemon itself (`populi_p2p.node.Node`, `run_node`,
`NodeStartError`) and the local API client (`populi_p2p.api.ApiClient`) are imported
from their modules: they pull in Trio, hypercorn, httpx and the overlay, which would
make importing this package heavy. (`overlay/` imports nothing from here: the packet
envelope is handed populi's keys by `populi_p2p.envelope_keys`.)
"""

from .authority import ClusterAuthority as ClusterAuthority
from .authority import cluster_fingerprint as cluster_fingerprint
from .certificate import CertificateError as CertificateError
from .certificate import EnrollmentCertificate as EnrollmentCertificate
from .certificate import read_certificate as read_certificate
from .certificate import verify_certificate as verify_certificate
from .certificate import write_certificate as write_certificate
from .config import ConfigError as ConfigError
from .config import NodeConfig as NodeConfig
from .identity import KeyFileError as KeyFileError
from .identity import NodeIdentity as NodeIdentity
from .identity import node_id_from_public_key as node_id_from_public_key
from .record import Capabilities as Capabilities
from .record import NodeRecord as NodeRecord
from .record import NodeStatus as NodeStatus
from .record import RecordError as RecordError
from .record import SignedNodeRecord as SignedNodeRecord
from .record_book import RecordBook as RecordBook
from .revocation import Revocation as Revocation
from .revocation import RevocationList as RevocationList
from .store import KnownMember as KnownMember
from .store import MemberStore as MemberStore
from .store import StoreError as StoreError

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
