"""Inference on the mesh: signed peer calls, engines, routing, the relay, API keys.

Only the peer-call layer is here so far: `PeerCallSigner`/`PeerCallVerifier` (the
request signature), `PeerApi` (the authenticated listener, with a route registry) and
`PeerClient` (httpx, signing every call). See docs/inference.md.
"""

from .engine_url import check_engine_url as check_engine_url
from .peer_api import PeerApi as PeerApi
from .peer_api import PeerRequest as PeerRequest
from .peer_api import PeerResponse as PeerResponse
from .peer_api import PeerRoutes as PeerRoutes
from .peer_auth import PeerAuthError as PeerAuthError
from .peer_auth import PeerCallSigner as PeerCallSigner
from .peer_auth import PeerCallVerifier as PeerCallVerifier
from .peer_client import PeerClient as PeerClient
from .peer_client import peer_base_url as peer_base_url

__all__ = [
    "PeerApi",
    "PeerAuthError",
    "PeerCallSigner",
    "PeerCallVerifier",
    "PeerClient",
    "PeerRequest",
    "PeerResponse",
    "PeerRoutes",
    "check_engine_url",
    "peer_base_url",
]
