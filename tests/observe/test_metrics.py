"""`MetricsService`: a per-node registry, its deferred collectors, and the scrape."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from populi_p2p.observe.metrics import MetricsService, content_type


class Answer:
    """A collector with one gauge, counting its scrapes."""

    def __init__(self, name: str, value: float) -> None:
        self.name, self.value, self.scrapes = name, value, 0

    def collect(self) -> Iterator[Metric]:
        self.scrapes += 1
        yield GaugeMetricFamily(self.name, "a test gauge", value=self.value)


def test_a_registered_collector_is_read_at_each_scrape() -> None:
    metrics = MetricsService()
    answer = Answer("populi_test_answer", 42)
    metrics.register(answer)
    assert b"populi_test_answer 42.0" in metrics.render()
    answer.value = 7
    assert b"populi_test_answer 7.0" in metrics.render()
    assert answer.scrapes == 2  # auto_describe is off: registering does not collect


def test_a_factory_is_built_only_when_the_registry_is_first_needed() -> None:
    metrics = MetricsService()
    built: list[Answer] = []

    def factory() -> Answer:
        built.append(Answer("populi_test_deferred", 1))
        return built[-1]

    metrics.register_factory(factory)
    assert built == []
    assert b"populi_test_deferred 1.0" in metrics.render()
    assert len(built) == 1
    metrics.render()
    assert len(built) == 1  # once, not per scrape
    metrics.register_factory(lambda: Answer("populi_test_late", 2))  # registry exists now
    assert b"populi_test_late 2.0" in metrics.render()


def test_each_node_has_its_own_registry_and_can_unregister() -> None:
    a, b = MetricsService(), MetricsService()
    answer = Answer("populi_test_own", 3)
    a.register(answer)
    assert b"populi_test_own" not in b.render()
    a.unregister(answer)
    assert b"populi_test_own" not in a.render()


def test_the_content_type_is_prometheus_text() -> None:
    assert content_type().startswith("text/plain; version=")
