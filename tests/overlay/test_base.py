"""Configs refuse bad values in one line, and addresses print as HOST:PORT."""

from __future__ import annotations

import pytest

from overlay.base import format_address
from overlay.tcp import TcpConfig
from overlay.transport import TransportConfig

################################################################################
# Configs and helpers
################################################################################


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: TcpConfig(max_frame_size=0), "max_frame_size"),
        (lambda: TcpConfig(pool_size=0), "pool_size"),
        (lambda: TcpConfig(connect_timeout=0), "connect_timeout"),
        (lambda: TransportConfig(max_datagram_size=70000), "max_datagram_size"),
        (lambda: TransportConfig(bulk_queue_items=0), "queue limits"),
        (
            lambda: TransportConfig(queue_bytes=1000, tcp=TcpConfig(max_frame_size=2000)),
            "at least one frame",
        ),
    ],
)
def test_configs_validate(make, message) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_format_address() -> None:
    assert format_address(("10.0.0.1", 7950)) == "10.0.0.1:7950"
    assert format_address(("fd77::1", 7950)) == "[fd77::1]:7950"
