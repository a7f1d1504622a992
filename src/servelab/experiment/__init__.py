"""The typed experiment: the validated config as a frozen dataclass tree.

`config.validate()` fills the schema's defaults, checks the result and returns an
`Experiment` built from it. The schema (src/servelab/schemas/config.schema.yaml) stays the
only place a default is written: these classes declare fields without defaults, and
`Experiment.from_dict` refuses a dict that lacks one (it takes validated dicts only). `to_dict()`
gives back the resolved dict it was built from, for Snakemake params and the resolved config in
provenance.

Sections mirror the schema's top-level keys; a field's name is its key. Free-form maps (vLLM
arguments, environment variables) are read-only mappings; lists are tuples.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

from servelab.design.level import CONCURRENCY, RATE, LevelValue
from servelab.documents import JsonObject, JsonValue
from servelab.documents.declared import NotTriedJson
from servelab.errors import ServelabError
from servelab.experiment.build import _build, section_from_dict as section_from_dict
from servelab.experiment.workload import (  # re-exported: servelab.experiment names them all
    ChatSection as ChatSection,
    DatasetFilter as DatasetFilter,
    DatasetSection as DatasetSection,
    HubDataset as HubDataset,
    LengthRangeJson as LengthRangeJson,
    Lengths as Lengths,
    LengthValuesJson as LengthValuesJson,
    SharedPrefixSection as SharedPrefixSection,
    TraceSection as TraceSection,
    WarmupSection as WarmupSection,
    WorkloadSection as WorkloadSection,
)

# a vLLM argument's value (server.args, a configuration's args, a proposal's change): true
# gives --flag, false --no-flag, any other value --flag VALUE (config.args_to_cli)
ArgValue: TypeAlias = str | int | float | bool


@dataclass(frozen=True)
class TinySpec:
    """model.tiny: the shape of the locally built model."""

    seed: int
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int


@dataclass(frozen=True)
class ModelSection:
    source: str
    served_name: str
    repo: str | None
    revision: str | None
    local_dir: str | None
    allow_patterns: tuple[str, ...] | None
    tiny: TinySpec


@dataclass(frozen=True)
class RuntimeSection:
    # a running server's (kind endpoint; servelab.env.endpoint): absent for every other kind
    ABSENT_AS_NONE: typing.ClassVar[tuple[str, ...]] = ("url", "served_model")

    kind: str
    lock: str
    cache_dir: str | None
    device: str
    gpus: int
    image: str | None
    image_sha256: str | None
    gpu_devices: tuple[str | int, ...] | None
    mounts: tuple[str, ...]
    network: str
    shm_size: str | None
    extra_args: tuple[str, ...]
    env: Mapping[str, str]
    compile_cache: bool
    url: str | None  # kind endpoint: the server's base URL
    served_model: str | None  # kind endpoint: the model it serves

    @property
    def endpoint(self) -> bool:
        """A server servelab does not launch (kind endpoint)."""
        return self.kind == "endpoint"


@dataclass(frozen=True)
class ConfigRuntime:
    """A server configuration's own runtime (server.configs[].runtime): another lock (runtime.kind
    venv) or another image (docker, podman, apptainer) than runtime's, every other runtime
    setting shared. Two vLLM versions are then two configurations of one experiment."""

    ABSENT_AS_NONE: typing.ClassVar[tuple[str, ...]] = ("lock", "image", "image_sha256")

    lock: str | None
    image: str | None
    image_sha256: str | None


@dataclass(frozen=True)
class ServerConfig:
    """One entry of server.configs: a name, the vLLM arguments it adds and, where it has one,
    its own runtime (None: runtime's)."""

    ABSENT_AS_NONE: typing.ClassVar[tuple[str, ...]] = ("runtime",)

    name: str
    args: Mapping[str, ArgValue]
    runtime: ConfigRuntime | None


@dataclass(frozen=True)
class ServerSection:
    host: str
    port: int
    startup_timeout_s: float
    shutdown_timeout_s: float
    lock_timeout_s: float
    engine_nice: int
    args: Mapping[str, ArgValue]
    configs: tuple[ServerConfig, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.configs]

    def args_of(self, name: str) -> dict[str, ArgValue]:
        """Resolved vLLM arguments of one server configuration (shared args, then its own)."""
        for c in self.configs:
            if c.name == name:
                return {**self.args, **c.args}
        raise ServelabError(f"server config {name!r} is not in server.configs")

    def config(self, name: str) -> ServerConfig:
        for c in self.configs:
            if c.name == name:
                return c
        raise ServelabError(f"server config {name!r} is not in server.configs")

    @property
    def own_runtime(self) -> list[str]:
        """The configurations with a runtime of their own (server.configs[].runtime)."""
        return [c.name for c in self.configs if c.runtime is not None]


@dataclass(frozen=True)
class RoundsSection:
    """A sequential plan (`sweep.repeats: {min, max, budget_s}`): rounds until every claim is
    decided (servelab.design.stopping)."""

    ABSENT_AS_NONE: typing.ClassVar[tuple[str, ...]] = ("interleave", "side_by_side", "slices")

    min: int
    max: int
    budget_s: float | None
    # every round on a fresh launch per configuration, in turn (absent: None, as false)
    interleave: bool | None = None
    # with interleave: every configuration's server of a round up at once, their points
    # alternating level by level (absent: None, as false; servelab.measure.sequential)
    side_by_side: bool | None = None
    # side by side: each point sent in this many slices that alternate between the servers
    # (A B, B A, ...; absent: None, as 1, whole points; servelab.measure.alternate)
    slices: int | None = None


@dataclass(frozen=True)
class ArrivalSection:
    """sweep.arrival: how an open-loop point's requests arrive (servelab.design.arrivals)."""

    process: str  # poisson | gamma | constant
    burstiness: float
    max_in_flight: int | None
    duration_s: float

    def requests(self, rate: float) -> int:
        """Requests a point at `rate` sends: ceil(rate x duration_s), at least 1."""
        return max(1, math.ceil(round(rate * self.duration_s, 9)))


@dataclass(frozen=True)
class SweepSection:
    """The points measured: concurrency levels (closed loop) or request rates (open loop,
    with `arrival`); the key of the other axis is absent from the config and None here."""

    ABSENT_AS_NONE: typing.ClassVar[tuple[str, ...]] = ("concurrency", "rate", "arrival")

    concurrency: tuple[int, ...] | None
    rate: tuple[float, ...] | None
    arrival: ArrivalSection | None
    repeats: int | RoundsSection
    order: str
    order_seed: int

    @property
    def axis(self) -> str:
        """What the sweep varies: "concurrency" or "rate" (servelab.design.level)."""
        return RATE if self.rate is not None else CONCURRENCY

    @property
    def levels(self) -> tuple[LevelValue, ...]:
        """The swept values, as given: concurrency levels or request rates."""
        values = self.rate if self.axis == RATE else self.concurrency
        assert values is not None  # config.validate requires one of the two
        return values

    @property
    def rounds(self) -> RoundsSection | None:
        """The sequential plan; None for a fixed number of repeats."""
        return self.repeats if isinstance(self.repeats, RoundsSection) else None

    @property
    def most_repeats(self) -> int:
        """The fixed number of repeats, or a sequential plan's maximum."""
        return self.repeats.max if isinstance(self.repeats, RoundsSection) else self.repeats


@dataclass(frozen=True)
class ClientSection:
    """client: other benchmark clients measuring the same points (servelab.measure.crosscheck)."""

    cross_check: tuple[str, ...]
    timeout_s: float
    # at a rate: each tool draws its own arrivals (own), or is handed servelab's schedule
    schedule: str = "own"


@dataclass(frozen=True)
class TelemetrySection:
    enabled: bool
    gpu_hz: float
    cpu_hz: float
    metrics_hz: float
    metrics_timeout_s: float


@dataclass(frozen=True)
class SloSection:
    p99_ttft_ms: float | None
    p99_tpot_ms: float | None
    p99_e2el_ms: float | None

    @property
    def any(self) -> bool:
        return any(v is not None for v in dataclasses.astuple(self))


@dataclass(frozen=True)
class PairSpec:
    a: int
    b: int
    server_config: str | None


@dataclass(frozen=True)
class ComparePair:
    """analysis.compare[]: two server configurations answered SAME, DIFFERENT or UNKNOWN."""

    a: str
    b: str
    metrics: tuple[str, ...]


@dataclass(frozen=True)
class BisectVersion:
    """bisect.versions[]: one setup of the ordered list, its runtime and arguments."""

    name: str
    lock: str | None
    image: str | None
    image_sha256: str | None
    args: Mapping[str, ArgValue]


@dataclass(frozen=True)
class BisectSection:
    """bisect: the ordered setups, the known good and bad ends, and the question."""

    versions: tuple[BisectVersion, ...]
    good: str
    bad: str
    metric: str
    level: float | None
    check_bad: bool

    def index(self, name: str) -> int:
        return [v.name for v in self.versions].index(name)


@dataclass(frozen=True)
class ValiditySection:
    """analysis.validity: the thresholds of the per-point validity checks (those of a trace
    replay absent unless given: None, the check's own default)."""

    ABSENT_AS_NONE: typing.ClassVar[tuple[str, ...]] = ("min_trace_reuse", "max_trace_missing_pct")

    max_burst_share: float
    max_other_cpu_cores: float
    max_failed_requests: int
    min_point_duration_s: float
    max_merged_chunk_share: float
    max_prefix_cache_hit_rate: float
    max_prompt_drift_pct: float
    max_output_drift_pct: float
    min_achieved_concurrency: float
    max_client_cpu_cores: float
    max_client_wait_pct: float
    max_count_mismatch_pct: float
    max_arrival_rate_error_pct: float
    max_send_slip_ms: float
    # steady_state: a latency trend fails when its Mann-Kendall p is below latency_trend_alpha
    # and its fitted change across the point exceeds max_latency_trend of its median
    latency_trend_alpha: float
    max_latency_trend: float
    # not a threshold: how many times the sweep measures a point again that failed a host
    # check (servelab.measure.remeasure); 0 never
    remeasure: int
    min_trace_reuse: float | None = None
    max_trace_missing_pct: float | None = None


@dataclass(frozen=True)
class ConfirmsProposal:
    """One proposal a confirmation experiment measures (analysis.confirms.proposals)."""

    id: str
    diagnoses: tuple[str, ...]
    server_config: str  # the diagnosed configuration
    config: str  # the proposed one: the diagnosed one with `change`
    change: Mapping[str, int | str]  # as the proposal gives it (diagnosis_records.Change)
    concurrency: tuple[int, ...]
    claims: tuple[str, ...]
    expected: str
    why: str


@dataclass(frozen=True)
class ConfirmsNotTried:
    """A proposal of the diagnosing experiment that was not measured, and why."""

    diagnoses: tuple[str, ...]
    server_config: str
    proposal: str
    reason: str

    def to_json(self) -> NotTriedJson:
        """As confirmation.json and provenance.json's `confirms` list it."""
        return {
            "diagnoses": list(self.diagnoses),
            "server_config": self.server_config,
            "proposal": self.proposal,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class ConfirmsSection:
    """analysis.confirms: what a confirmation experiment confirms (written by the confirm
    rule, servelab.confirm): the diagnosing experiment, its bundle and the proposals."""

    experiment: str
    bundle: str
    manifest_sha256: str
    proposals: tuple[ConfirmsProposal, ...]
    not_tried: tuple[ConfirmsNotTried, ...]


@dataclass(frozen=True)
class AnalysisSection:
    threshold_pct: float
    alpha: float
    plateau_pct: float
    flat_pct: float
    slo: SloSection
    pairs: tuple[PairSpec, ...]
    claims: tuple[str, ...]
    figures: bool
    validity: ValiditySection
    # same-host comparisons in three words (servelab.analysis.samehost)
    margin_pct: float
    compare: tuple[ComparePair, ...]
    # the share of completions (%) the two sides of a comparison may answer differently before
    # its verdict says so (servelab.analysis.outputs)
    max_differing_outputs_pct: float
    # a confirmation experiment's only (servelab.confirm); absent everywhere else
    confirms: ConfirmsSection | None = None

    ABSENT_AS_NONE: typing.ClassVar[tuple[str, ...]] = ("confirms",)


@dataclass(frozen=True)
class ConfirmSection:
    """confirm: how `snakemake confirm` confirms this experiment's proposals."""

    max_proposals: int


@dataclass(frozen=True)
class ReproductionSection:
    metrics: tuple[str, ...]
    min_effect_pct: float
    require_significance: bool
    tolerance_pct: float | None
    tolerance_metrics: tuple[str, ...]
    claims: tuple[str, ...]


@dataclass(frozen=True)
class SearchSection:
    """search: SLO capacity by search (servelab.measure.slo_search)."""

    enabled: bool
    server_configs: tuple[str, ...] | None
    start_rate: float
    growth: float
    target: float
    tolerance: float
    max_measurements: int
    # rounds of the repeats a rate may take while the early-stop decision is undecided
    max_rounds: int
    min_rate: float | None
    max_rate: float | None
    arrival: ArrivalSection


@dataclass(frozen=True)
class ProfileSection:
    enabled: bool
    server_configs: tuple[str, ...] | None
    concurrency: tuple[int, ...]
    launch: str  # auto | own | sweep: which server launch the diagnostic points run on
    waves: int
    warmup_requests: int
    tool: str
    required: bool
    nsys: str
    report_timeout_s: float
    max_iterations: int
    vllm_interface: str
    families: tuple[Mapping[str, str], ...] | None  # each {name, regex}
    attention_kernel: str | None
    band: float
    path_dims: tuple[str, ...] | None  # x, y, z; None: found from the forwards


@dataclass(frozen=True)
class Experiment:
    """One experiment, as validated: every section typed, every default filled."""

    experiment: str
    results_dir: str
    model: ModelSection
    runtime: RuntimeSection
    server: ServerSection
    workload: WorkloadSection
    sweep: SweepSection
    telemetry: TelemetrySection
    analysis: AnalysisSection
    reference: str | None
    reproduction: ReproductionSection
    profile: ProfileSection
    # absent from a config resolved before the search existed: read as not enabled
    search: SearchSection | None
    # absent unless given (servelab.confirm reads its defaults then)
    confirm: ConfirmSection | None = None
    # a bisection's (servelab bisect): absent or null everywhere else
    bisect: BisectSection | None = None
    # other tools measuring the same points (absent or null: none)
    client: ClientSection | None = None
    _source: Mapping[str, JsonValue] = field(default_factory=dict, repr=False, compare=False)

    ABSENT_AS_NONE: typing.ClassVar[tuple[str, ...]] = ("search", "confirm", "bisect", "client")

    @property
    def cross_check(self) -> tuple[str, ...]:
        """The tools that measure every point again beside servelab's client (none: ())."""
        return () if self.client is None else self.client.cross_check

    @property
    def name(self) -> str:
        return self.experiment

    @property
    def searched(self) -> list[str]:
        """The server configurations the SLO capacity search measures (none when it is off)."""
        s = self.search
        if s is None or not s.enabled:
            return []
        names = self.server.names
        return [n for n in names if s.server_configs is None or n in s.server_configs]

    def runtime_of(self, sc: str) -> RuntimeSection:
        """The runtime server configuration `sc` runs in: runtime, with the configuration's own
        lock or image where it has one."""
        own = self.server.config(sc).runtime
        if own is None:
            return self.runtime
        if own.lock is not None:
            return dataclasses.replace(self.runtime, lock=own.lock)
        return dataclasses.replace(self.runtime, image=own.image, image_sha256=own.image_sha256)

    @classmethod
    def from_dict(cls, data: Mapping[str, JsonValue]) -> Experiment:
        """The typed view of a validated config dict (`config.validate` makes one)."""
        exp = _build(cls, data, "")
        object.__setattr__(exp, "_source", copy.deepcopy(dict(data)))
        return exp

    def to_dict(self) -> JsonObject:
        """The resolved config as a plain dict (a copy), key order as validated."""
        return copy.deepcopy(dict(self._source))
