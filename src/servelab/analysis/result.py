"""One analysis of a run, typed: every table and verdict `analyze` computes, by name
(`Analysis`), and the files they are written to (`Analysis.tables`, `Analysis.only_where`).

The report (servelab.analysis.markdown.render_report), `servelab analyze` and the workflow's
analysis script read its fields; nothing reads it by key. A field that applies only to some
runs (a sequential sweep's looks, a rerun's same-host comparison, a confirmation, the SLO
capacity, the searches, the chat turns, ...) is None where it does not apply, and its file is
then not written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

from servelab.analysis.clients import ClientsRun
from servelab.analysis.groups import PairedRow
from servelab.analysis.knee import DominanceRow
from servelab.analysis.outputs import ComparedOutputs
from servelab.analysis.turns import TurnRow
from servelab.documents.declared import (
    ClaimVerdict,
    ConfirmationRecord,
    CpuFacts,
    Diagnosis,
    IsaRecord,
    Knee,
    RoundsRecord,
    RuntimesJson,
    SameHostJson,
    SearchJson,
    SloJson,
    StartRecord,
    ValidityJson,
)
from servelab.store.paths import (
    CONFIRMATION_TABLE,
    ROUNDS_TABLE,
    SAME_HOST_TABLE,
    SLO_TABLE,
    TURNS_TABLE,
    VALIDITY_TABLE,
)
from servelab.telemetry.columns import Cell


class HostPart(TypedDict, total=False):
    """The report's Host section: the measuring hosts (`hosts`), the runtime's CPU
    instruction set (`runtime_isa`), and what a server servelab did not launch said of itself
    (`endpoints`, servelab.env.endpoint.report_facts)."""

    hosts: dict[str, CpuFacts]
    runtime_isa: IsaRecord | None
    endpoints: dict[str, dict[str, object]]


@dataclass(frozen=True)
class Analysis:
    """Every table and verdict of one run's analysis.

    Always: the points, their summary, the paired comparisons, the knees, the dominated
    operating points, validity.json, the host, the diagnoses and the claims' verdicts. Where
    they apply (else None): the SLO capacity (`slo`), a sequential sweep's looks (`rounds`),
    the configurations on their own runtimes compared (`runtimes`), the pairs compared on this
    host (`same_host`), a confirmation's verdicts (`confirmation`), the damaged data skipped
    (`skipped`), the hosts of configurations measured on several nodes (`hosts_differ`), the
    SLO capacity searches (`search`), the sweeps' server starts (`starts`), the chat points'
    turns (`turns`) and the compared configurations' completions (`same_outputs`, where a point
    recorded its outputs' token ids; the report's "Same outputs", in no file of its own)."""

    points: list[dict[str, Cell]]
    summary: list[dict[str, Cell]]
    paired: list[PairedRow]
    knee: list[Knee]
    dominance: list[DominanceRow]
    validity: ValidityJson
    host: HostPart
    diagnoses: list[Diagnosis]
    claims: list[ClaimVerdict]
    slo: SloJson | None = None
    rounds: RoundsRecord | None = None
    runtimes: RuntimesJson | None = None
    same_host: SameHostJson | None = None
    confirmation: ConfirmationRecord | None = None
    skipped: list[dict[str, str]] | None = None
    hosts_differ: dict[str, str] | None = None
    search: dict[str, SearchJson] | None = None
    starts: dict[str, StartRecord] | None = None
    turns: dict[str, list[TurnRow]] | None = None
    same_outputs: list[ComparedOutputs] | None = None
    # other tools' runs of the same points (client.cross_check; the report's "Clients compared")
    clients: list[ClientsRun] | None = None

    def csv_tables(self) -> dict[str, Sequence[Mapping[str, object]]]:
        """The CSV tables, by file name (store.paths.ANALYSIS_TABLES' .csv ones)."""
        return {
            "points.csv": self.points,
            "summary.csv": self.summary,
            "paired.csv": list(self.paired),
            "dominance.csv": self.dominance,
        }

    def json_tables(self) -> dict[str, object]:
        """The JSON verdicts written for every run, by file name (ANALYSIS_TABLES' .json ones,
        and validity.json)."""
        return {
            "knee.json": self.knee,
            "diagnoses.json": self.diagnoses,
            "claims.json": self.claims,
            VALIDITY_TABLE: self.validity,
        }

    def only_where(self) -> dict[str, object]:
        """The JSON files written only where they apply, by file name (None: not written, and
        an earlier one removed)."""
        return {
            SLO_TABLE: self.slo,
            ROUNDS_TABLE: self.rounds,
            TURNS_TABLE: self.turns,
            CONFIRMATION_TABLE: self.confirmation,
            SAME_HOST_TABLE: self.same_host,
        }
