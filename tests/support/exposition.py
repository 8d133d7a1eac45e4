"""Reading Prometheus's text format in tests, with the client library's own parser."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Exposition:
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]

    @classmethod
    def parse(cls, text: str) -> Exposition:
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return cls(samples)

    def value(self, name: str, **labels: str) -> float:
        """A sample's value; 0 for a labelled series never recorded (Prometheus shows none until the first)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """The sum over every series of `name` whose labels include `labels`."""
        wanted = set(labels.items())
        return sum(value for (sample, series), value in self.samples.items() if sample == name and wanted <= series)

    def label_values(self, name: str, label: str) -> set[str]:
        return {dict(series)[label] for (sample, series) in self.samples if sample == name and label in dict(series)}
