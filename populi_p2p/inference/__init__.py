"""Inference on the mesh: signed peer calls, engines, routing, the relay, API keys.

An OpenAI-compatible API on every node (`InferenceService`), routed by a pure function
of the mesh view (`choose_route`), relayed to the chosen node's engine through signed
node-to-node calls (`PeerApi`, `PeerClient`), failing over before and during a stream
(`Relay`). See docs/inference.md.
"""

from .engine_url import check_engine_url as check_engine_url
from .engines import EngineService as EngineService
from .keys import ApiKey as ApiKey
from .keys import ApiKeyChecker as ApiKeyChecker
from .keys import issue_api_key as issue_api_key
from .peer_api import PeerApi as PeerApi
from .peer_api import PeerRequest as PeerRequest
from .peer_api import PeerResponse as PeerResponse
from .peer_api import PeerRoutes as PeerRoutes
from .peer_auth import PeerAuthError as PeerAuthError
from .peer_auth import PeerCallSigner as PeerCallSigner
from .peer_auth import PeerCallVerifier as PeerCallVerifier
from .peer_client import PeerClient as PeerClient
from .peer_client import peer_base_url as peer_base_url
from .relay import Relay as Relay
from .route import Candidate as Candidate
from .route import RouteDecision as RouteDecision
from .route import choose_route as choose_route
from .service import InferenceService as InferenceService

__all__ = [
    "ApiKey",
    "ApiKeyChecker",
    "Candidate",
    "EngineService",
    "InferenceService",
    "PeerApi",
    "PeerAuthError",
    "PeerCallSigner",
    "PeerCallVerifier",
    "PeerClient",
    "PeerRequest",
    "PeerResponse",
    "PeerRoutes",
    "Relay",
    "RouteDecision",
    "check_engine_url",
    "choose_route",
    "issue_api_key",
    "peer_base_url",
]
