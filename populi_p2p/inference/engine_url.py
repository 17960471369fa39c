"""What an ``--engine`` URL may be: http on a loopback address, nothing else.

The engine is never exposed to the network: other members reach it only through this
node's authenticated peer API. A URL on any other host is refused with one line.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

__all__ = ["check_engine_url"]


def check_engine_url(url: str) -> str:
    """The URL's base (no trailing slash, no ``/v1``) if it is an http loopback URL.

    Raises:
        ValueError: one line saying what is wrong and what to give instead.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme != "http" or not parts.hostname or port is None:
        raise ValueError(
            f"{url!r} is not http://HOST:PORT (e.g. http://127.0.0.1:8080 for llama.cpp)"
        )
    host = parts.hostname
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(
            f"{url!r} is not on loopback: run the engine on 127.0.0.1 or ::1 (other members"
            " reach it through this node's authenticated peer API, never directly)"
        )
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"http://{netloc}{path}"
