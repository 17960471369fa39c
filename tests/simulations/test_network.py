"""The link model: latency bounds, loss, asymmetric loss, partitions, streams."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulations import Network, NetworkConfig, child_rng, child_seed


def network(n: int, config: NetworkConfig, seed: int = 1) -> Network:
    net = Network(config, random.Random(seed))
    for _ in range(n):
        net.add_node()
    return net


@settings(max_examples=40, deadline=None)
@given(
    latency_min=st.floats(0.0, 0.05),
    extra=st.floats(0.0, 0.05),
    spread=st.floats(0.0, 0.01),
    seed=st.integers(0, 2**32),
)
def test_latency_is_never_below_the_link_minimum(
    latency_min: float, extra: float, spread: float, seed: int
) -> None:
    config = NetworkConfig(
        latency_min=latency_min, latency_mean=latency_min + extra, latency_spread=spread
    )
    net = network(4, config, seed)
    for _ in range(50):
        (delay,) = net.route(0, 1)
        assert delay >= latency_min
        stream = net.stream_delay(2, 3)
        assert stream is not None and stream >= 3 * latency_min - 1e-12


def test_mean_latency_matches_the_config() -> None:
    net = network(2, NetworkConfig(latency_min=0.001, latency_mean=0.004))
    delays = [net.route(0, 1)[0] for _ in range(20000)]
    assert sum(delays) / len(delays) == pytest.approx(0.004, rel=0.05)
    assert min(delays) >= 0.001


def test_asymmetric_loss_only_hurts_one_direction() -> None:
    net = network(2, NetworkConfig())
    net.set_node_loss(0, ingress=0.5)
    into = sum(1 for _ in range(4000) if net.route(1, 0))
    out_of = sum(1 for _ in range(4000) if net.route(0, 1))
    assert into / 4000 == pytest.approx(0.5, abs=0.05)
    assert out_of == 4000
    net.heal_loss()
    assert all(net.route(1, 0) for _ in range(100))


def test_partition_blocks_datagrams_and_streams_until_healed() -> None:
    net = network(4, NetworkConfig())
    net.partition([[0, 1], [2, 3]])
    assert net.route(0, 2) == ()
    assert net.stream_delay(3, 1) is None
    assert net.route(0, 1) and net.route(2, 3)
    net.heal()
    assert net.route(0, 2)
    assert net.statistics().blocked == 1  # datagrams are counted; the stream failed


def test_nodes_added_after_a_partition_join_the_first_group() -> None:
    net = network(2, NetworkConfig())
    net.partition([[0], [1]])
    late = net.add_node()
    assert net.reachable(late, 0) and not net.reachable(late, 1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"loss": 1.0}, "loss must be in [0, 1)"),
        ({"duplicate": -0.1}, "duplicate must be in [0, 1)"),
        ({"latency_min": 0.01, "latency_mean": 0.001}, "latency_mean"),
        ({"connect_timeout": float("nan")}, "connect_timeout"),
    ],
)
def test_bad_network_config_is_one_clear_error(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)")):
        NetworkConfig(**fields)


def test_child_seeds_are_stable_and_independent() -> None:
    # Stable across processes (no PYTHONHASHSEED dependence): a fixed known value.
    assert child_seed(1, "network") == 6389033763369869916
    assert child_seed(1, "network") != child_seed(1, "faults")
    assert child_seed(1, "node", 3, 1) != child_seed(1, "node", 3, 2)
    assert child_rng(7, "x").random() == child_rng(7, "x").random()
    assert 0 <= child_seed(123, "a") < 2**64
