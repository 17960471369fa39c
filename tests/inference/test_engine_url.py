"""`--engine` URLs: http on loopback only, normalised to a base without `/v1`."""

from __future__ import annotations

import pytest

from populi_p2p.inference.engine_url import check_engine_url


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080"),
        ("http://127.9.9.9:1/engine/v1", "http://127.9.9.9:1/engine"),
        ("http://localhost:11434", "http://localhost:11434"),
        ("http://[::1]:8000/v1", "http://[::1]:8000"),
    ],
)
def test_loopback_urls_give_their_base(url: str, base: str) -> None:
    assert check_engine_url(url) == base


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("https://127.0.0.1:8080", "is not http://HOST:PORT"),
        ("127.0.0.1:8080", "is not http://HOST:PORT"),
        ("http://127.0.0.1", "is not http://HOST:PORT"),  # no port
        ("http://127.0.0.1:99999", "is not http://HOST:PORT"),  # port out of range
        ("http://:8080", "is not http://HOST:PORT"),
        ("http://10.0.0.5:8080", "is not on loopback"),
        ("http://engine.example:8080", "is not on loopback"),
        ("http://[fd77::1]:8080", "is not on loopback"),
        ("http://0.0.0.0:8080", "is not on loopback"),
    ],
)
def test_anything_else_is_refused_in_one_line(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as caught:
        check_engine_url(url)
    assert "\n" not in str(caught.value)
