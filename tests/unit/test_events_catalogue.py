"""docs/events.md stays true to the code: every event kind the code emits has its section
(`### `kind``), and the page catalogues nothing that is not emitted.

The kinds are read off the sources: the string literals that `.emit(...)` is called with (a
service's EventPublisher, the GC's emit), the metadata outbox's kinds (the SQL statements, the
in-memory store's records, the change events built in its core), and the few kinds chosen at
run time (the auditor's EVENT_KINDS, the journal's disk-state kinds, events.dropped). An emit
whose kind is not a literal must be one of those known cases, so that a new one cannot slip
past unread."""

from __future__ import annotations

import re

from services.auditor.service import EVENT_KINDS
from services.metadata import core as metadata_core
from shared.events import DROPPED_KIND
from tests.support.layout import ROOT

KIND = r"[a-z_]+\.[a-z_]+"
# `.emit(` whose first argument is not a literal: each reviewed, its kinds collected below.
NON_LITERAL_EMITS = {
    "services/auditor/service.py": "EVENT_KINDS[change.after]",
    "services/journal/service.py": "kind",
}


def sources(*folders: str) -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text()
        for folder in folders
        for path in sorted((ROOT / folder).rglob("*.py"))
    }


def emitted_kinds() -> set[str]:
    kinds: set[str] = set()
    for path, code in sources("services", "shared").items():
        for argument in re.findall(r"\.emit\(\s*([^,)\s]+)", code):
            literal = re.fullmatch(rf'"({KIND})"', argument)
            if literal:
                kinds.add(literal.group(1))
            elif path.endswith("bench.py") and argument.startswith("asyncio.run"):
                continue  # bench_report.emit: a benchmark's report, not an event
            else:
                assert NON_LITERAL_EMITS.get(path) == argument, (
                    f"{path} emits an event kind the catalogue test cannot read: {argument}"
                )
    kinds.update(EVENT_KINDS.values())
    journal = (ROOT / "services/journal/service.py").read_text()
    [disk_kinds] = re.findall(rf'kind = "({KIND})" if \w+ else "({KIND})"', journal)
    kinds.update(disk_kinds)
    kinds.add(DROPPED_KIND)
    return kinds


def outbox_kinds() -> set[str]:
    metadata = ROOT / "services" / "metadata"
    sql = (metadata / "sql.py").read_text()
    kinds = set(re.findall(rf'_outbox_insert(?:_bookie)?\(\s*"({KIND})"', sql))
    kinds.update(re.findall(rf"INSERT INTO outbox [^;]*?(?:VALUES \(|SELECT )'({KIND})'", sql))
    memory = (metadata / "memory.py").read_text()
    kinds.update(re.findall(rf'_record\(\s*"({KIND})"', memory))
    core = (metadata / "core.py").read_text()
    kinds.update(re.findall(rf'EventSpec\(\s*"({KIND})"', core))
    # Rows whose events the core builds: ledger.changed becomes ledger.updated or .closed.
    kinds.update({metadata_core.LEDGER_CREATED, metadata_core.LEDGER_DELETED})
    return kinds


def catalogued() -> set[str]:
    text = (ROOT / "docs" / "events.md").read_text()
    kinds: set[str] = set()
    for heading in re.findall(r"^### (.+)$", text, flags=re.MULTILINE):
        kinds.update(re.findall(rf"`({KIND})`", heading))
    return kinds


def test_the_sources_are_read() -> None:
    """The patterns find what they should: a few kinds of each origin."""
    emitted, outbox = emitted_kinds(), outbox_kinds()
    assert {"entries.acknowledged", "gc.compacted", "ledger.fenced", "bookie.lost"} <= emitted
    assert {"bookie.writable", "events.dropped", "autorecovery.fragment_replicated"} <= emitted
    assert {"ledger.created", "ledger.closed", "ledger.updated", "auditor.elected"} <= outbox
    assert {"bookie.registered", "cluster.settings_changed", "ledger.replicated"} <= outbox
    assert "ledger.changed" not in outbox  # an outbox row kind, never published


def test_every_emitted_kind_is_catalogued_and_only_those() -> None:
    code = emitted_kinds() | outbox_kinds()
    documented = catalogued()
    assert not code - documented, f"docs/events.md lacks {sorted(code - documented)}"
    assert not documented - code, f"docs/events.md lists unknown {sorted(documented - code)}"
