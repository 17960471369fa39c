"""The inference clients' TLS context: httpx's verification, its CAs read at the first
TLS connection (a node that makes none does not hold them: idle RSS, issue 23)."""

from __future__ import annotations

import ssl

import httpx
import pytest

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


def _settings(context: ssl.SSLContext) -> tuple[object, ...]:
    return (
        context.protocol, context.verify_mode, context.check_hostname, context.options,
        context.verify_flags, context.minimum_version, context.maximum_version,
        context.cert_store_stats(),
    )  # fmt: skip


@pytest.mark.parametrize("env", ["certifi", "SSL_CERT_FILE"])
def test_the_context_verifies_as_httpx_does_from_its_first_connection(
    env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import certifi

    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    if env == "SSL_CERT_FILE":
        monkeypatch.setenv("SSL_CERT_FILE", certifi.where())
    context = tls_context.__wrapped__()  # a fresh one (tls_context() is per process)
    assert context.cert_store_stats()["x509_ca"] == 0  # built, nothing read yet
    context.wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO(), server_hostname="example.org")
    reference = httpx.create_ssl_context()
    assert context.cert_store_stats()["x509_ca"] > 100
    assert _settings(context) == _settings(reference)
