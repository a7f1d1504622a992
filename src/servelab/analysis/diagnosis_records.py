"""diagnoses.json's records, typed: a diagnosis (`Diagnosis`) with its evidence by kind and its
proposal (`Proposal`, or `NoRemedy`: why there is none). Written by servelab.analysis.diagnoses
and servelab.analysis.proposals; read by the claims, the report, the confirmation and a
reproduction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from servelab.documents.declared import Diagnosis

# a change of a server configuration: vLLM argument (without --) -> value
Change = dict[str, str | float | bool]


@dataclass(frozen=True)
class NoRemedy:
    """Why a diagnosis has no proposal (its `no_remedy`)."""

    why: str


class FlatSpan(TypedDict):
    """serialized: the levels over which throughput is flat and wall time linear."""

    throughput_spread_pct: float
    concurrency_span: list[int]
    seconds_per_request: dict[int, float]


class SerializedEvidence(FlatSpan):
    max_num_seqs: int | None


class KvEvidence(TypedDict):
    """kv_headroom_unused: --max-num-seqs against what the startup log says the KV cache fits."""

    max_num_seqs: int
    max_concurrency: int | float
    tokens_per_request: int | None
    kv_cache_tokens: int | None


class Dip(TypedDict):
    """non_monotonic: the level whose throughput dips, and the lower level it is below."""

    concurrency: int
    throughput: float
    lower_concurrency: int
    lower_throughput: float
    drop_pct: float
    recovers_at: int
    passes_lower_at: int | None
    agree: str
    p_value: float | None


class UtilizationHit(TypedDict):
    """utilization_misleading: a level that reads fully busy at under half the best throughput."""

    concurrency: int
    utilization_pct: float
    output_throughput: float
    best_throughput: float


class PastKneeEvidence(TypedDict):
    """past_knee: the knee (a level) and why it is there."""

    knee: int | float
    reason: str


class CaptureFit(TypedDict):
    """non_monotonic: whether the dip's batch is outside the CUDA graphs the server captured."""

    capture_sizes: list[int] | None
    capture_sizes_source: str | None
    cudagraph_mode: str | None
    batch_size: int
    batch_size_source: str
    outside_capture_sizes: bool | None
    capture_explanation: str


# a diagnosis's evidence, by kind: serialized, kv_headroom_unused, non_monotonic,
# utilization_misleading, past_knee, and dominated (the dominance row, knee.dominance)
Evidence = (
    SerializedEvidence | KvEvidence | Dip | list[UtilizationHit] | PastKneeEvidence | dict[str, Any]
)


def level_of(d: Diagnosis, axis: str) -> int | float | list[int] | list[float] | None:
    """The level (or levels) a diagnosis names on `axis` ("concurrency" or "rate"), None
    where it names none."""
    return d.get("rate") if axis == "rate" else d.get("concurrency")
