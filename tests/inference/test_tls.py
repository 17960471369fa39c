"""`inference._tls`: the TLS context and the URLs, built once, verifying as httpx does."""

from __future__ import annotations

import ssl

import httpx

from populi_p2p.inference._tls import tls_context, url


def test_one_verifying_context_per_process() -> None:
    context = tls_context()
    assert context is tls_context()
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname


def test_a_url_is_parsed_once_and_equals_httpx_parsing() -> None:
    parsed = url("http://10.0.0.7:7951", "/v1/chat/completions")
    assert parsed == httpx.URL("http://10.0.0.7:7951/v1/chat/completions")
    assert parsed.host == "10.0.0.7" and parsed.port == 7951
    assert url("http://10.0.0.7:7951", "/v1/chat/completions") is parsed
    assert url("http://10.0.0.7:7951", "/v1/models") != parsed
