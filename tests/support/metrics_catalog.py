"""docs/metrics.md read as data, for the tests that hold the code to it (unit: every
service's builder; e2e: a live `quire up`)."""

from __future__ import annotations

from shared.metrics import Scrape
from tests.support.layout import ROOT


def catalog() -> dict[str, list[str]]:
    """Service -> every name its table lists (a sample name or, for a histogram or a
    summary, the family's), and the names the "Every process" section's table lists."""
    names: dict[str, list[str]] = {}
    every: list[str] = []
    section: list[str] | None = None
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        if line.startswith("## "):
            words = line.split()
            if line == "## Every process":
                section = every
            elif len(words) > 2 and words[2].startswith("(`service="):
                section = names.setdefault(words[1], [])
            else:
                section = None
        elif section is not None and line.startswith("| `"):
            section.append(line.split("`")[1])
    return {service: [*every, *listed] for service, listed in names.items()}


def exported(scrape: Scrape, name: str) -> bool:
    """A sample name, or a family's (a counter with no sample yet has only its family)."""
    return name in scrape or name in scrape.types or name.removesuffix("_total") in scrape.types


def missing_and_unlisted(scrape: Scrape, names: list[str]) -> tuple[list[str], list[str]]:
    """The catalog's names the scrape lacks, and the scrape's families the catalog lacks
    (prometheus_client's process and Python collectors and `_created` samples aside)."""
    missing = [n for n in names if not exported(scrape, n)]
    unlisted = [
        family
        for family in scrape.types
        if not family.startswith(("process_", "python_"))
        and not family.endswith("_created")
        and family not in names
        and f"{family}_total" not in names
    ]
    return missing, unlisted
