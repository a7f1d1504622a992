"""Clients compared: the same server's points as servelab's client measured them and as other
benchmark tools did (their results read by servelab.analysis.peers), per tool, level and
metric: each side's mean over its repeats that count (a metric a validity check removed is
left out, as everywhere), and the tool's over servelab's as a ratio of geometric means with
its 95% Welch interval on the logs (servelab.analysis.stats.ratio_ci: the runs are not paired
repeat by repeat). Beside the numbers, the known causes of a disagreement that the data shows: a
tool's streams that arrived in one read (its TTFT is then the whole response: its client or
the host was starved), requests a tool failed that the server answered, and output tokens a
tool counted by re-tokenizing the text instead of the server's count."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from servelab.analysis.dataset import Dataset, load_dataset
from servelab.analysis.groups import Groups
from servelab.analysis.peers import point_file, read_point
from servelab.analysis.schedules import Handed, handed, rate_causes
from servelab.analysis.stats import Ratio, ratio_ci
from servelab.analysis.validity import FAILED
from servelab.analysis.validity.facts import BenchJson
from servelab.config import default_section
from servelab.design.level import Level, LevelValue
from servelab.documents.declared import ClientRunJson
from servelab.env.client_tools import TOOLS
from servelab.experiment import ValiditySection
from servelab.render import md_table
from servelab.store.paths import CLIENT_FILE, CLIENTS_DIR, ExperimentPaths
from servelab.store.records import ArrivalsRecord, ClientRunRecord

METRICS = ("output_throughput", "mean_ttft_ms", "mean_itl_ms")
# validity checks whose failure on a tool's point names a known cause, and the cause in words
CAUSES = {
    "streaming": "streams that arrived in one read: the TTFT it reports is the whole response "
    "(its client, or the host, fell behind the stream)",
    "failed_requests": "requests it failed that the server answered",
    "output_length": "output lengths other than asked",
    "arrival_rate": "sends at a rate further from the one asked than the arrival_rate bound",
    "send_slip": "sends later after falling due, by its own record, than the send_slip bound",
    "chunk_tokens": "fewer stream chunks than the server's tokens, by its own record (its ITL "
    "is then per chunk, not per token)",
}


@dataclass(frozen=True)
class ClientRow:
    """One tool's value of one metric at one level beside servelab's (`ours`)."""

    tool: str
    level: LevelValue
    metric: str
    ours: float | None
    theirs: float | None
    ratio: Ratio | None
    n_ours: int
    n_theirs: int


@dataclass(frozen=True)
class Tool:
    """A tool's results: its name (and version), and its points (one server configuration);
    `runs`: the tool's client.json of each point where servelab ran it (client.cross_check),
    by level: its client CPU and the load window."""

    name: str
    data: Dataset
    runs: Mapping[LevelValue, Sequence[ClientRunJson]] = field(default_factory=dict)
    failed: int = 0  # runs that failed (kept as <point>.failed/, never read as data)
    # its runs handed servelab's own schedule (client.schedule servelab)
    handed: Sequence[Handed] = ()
    # which tool (aiperf, guidellm, vllm, inference-perf: how it times what), where known
    key: str | None = None


@dataclass(frozen=True)
class ClientsRun:
    """A configuration's points as client.cross_check's tools measured them (raw/<sc>/clients/)."""

    config: str
    tools: list[Tool]
    # analysis.validity: the bounds servelab holds its own client to (client CPU, client wait)
    validity: ValiditySection | None = None


def run_clients(root: Path, validity: ValiditySection | None) -> list[ClientsRun]:
    """The tools' runs a servelab run holds, per configuration (none without client.cross_check):
    raw/<sc>/clients/<tool>/, each a vllm-bench tree read by servelab.analysis.peers."""
    out: list[ClientsRun] = []
    for clients in sorted((root / "raw").glob(f"*/{CLIENTS_DIR}")):
        tools: list[Tool] = []
        paths, sc = ExperimentPaths(root), clients.parent.name
        for tree in sorted(d for d in clients.iterdir() if d.is_dir()):
            runs: dict[LevelValue, list[ClientRunJson]] = {}
            on_ours: list[Handed] = []
            for f in sorted(tree.glob(f"rep_*/*/{CLIENT_FILE}")):  # concurrency_* or rate_*
                doc: ClientRunJson = ClientRunRecord.read(f).doc  # type: ignore[assignment]
                level = Level.from_record(doc).value
                runs.setdefault(level, []).append(doc)
                rate = doc.get("rate")
                if rate and doc.get("schedule_sha256"):
                    on_ours.append(_handed(doc, f.parent, paths.arrivals(sc, rate)))
            failed = len(list(tree.glob("rep_*/*.failed*")))
            if not runs:
                continue
            first = next(iter(runs.values()))[0]
            spec = TOOLS.get(first["tool"])
            title = spec.title if spec is not None else first["tool"]
            data = load_dataset(tree, first["tool"], validity)
            name = f"{title} {first['version']}"
            tools.append(Tool(name, data, runs, failed, on_ours, key=first["tool"]))
        if tools:
            out.append(ClientsRun(clients.parent.name, tools, validity))
    return out


def _handed(run: ClientRunJson, folder: Path, arrivals: Path) -> Handed:
    """A tool's run handed servelab's schedule: its results in `folder` read again for their
    send times, against servelab's arrivals record of the rate."""
    record = ArrivalsRecord.read(arrivals) if arrivals.is_file() else None
    found = point_file(folder)
    bench: BenchJson = read_point(*found) if found is not None else {}
    return handed(run, bench, record, arrivals.name)


def compare_clients(ours: Groups, config: str, tools: Sequence[Tool]) -> list[ClientRow]:
    """Every level both servelab's `config` and a tool measured, per metric of METRICS."""
    rows: list[ClientRow] = []
    for tool in tools:
        theirs = Groups(tool.data)
        (name,) = theirs.configs or ("",)
        for level in theirs.levels(name):
            if level not in ours.levels(config):
                continue
            for metric in METRICS:
                a = list(theirs.values(name, level, metric).values())
                b = list(ours.values(config, level, metric).values())
                rows.append(
                    ClientRow(
                        tool.name,
                        level,
                        metric,
                        _mean(b),
                        _mean(a),
                        ratio_ci(a, b),
                        len(b),
                        len(a),
                    )
                )
    return rows


def causes(tool: Tool) -> list[str]:
    """The known causes of a disagreement the tool's points show, one line each."""
    out: list[str] = []
    for check, said in CAUSES.items():
        hit = [
            p for p in tool.data.points for f in p.checks if f.check == check and f.status == FAILED
        ]
        if hit:
            out.append(f"{tool.name}: {said} ({len(hit)} of {len(tool.data.points)} points)")
    counted = [
        (own, int(server) if isinstance(server, int | float) else 0)
        for p in tool.data.points
        if (own := p.extra.get("client_output_tokens")) is not None
        for server in [p.metrics.get("total_output_tokens")]
    ]
    if counted and any(c != s for c, s in counted):
        mine = sum(c for c, _ in counted)
        server = sum(s for _, s in counted)
        out.append(
            f"{tool.name}: counts output tokens by re-tokenizing the text: {mine} against the "
            f"server's {server} over its points (its own tokens/s and per-token latencies use "
            "its count; the table uses the server's)"
        )
    return out


# a tool's duration this much past its requests' span is named as a cause
SPAN_EXCESS = 0.05
# the server's own mean ITL this much above servelab's while a tool measured: named as a cause
SERVER_SLOWER = 0.10


# the tools that time TTFT at the first streamed chunk with text: where they do, and what they
# make of a request with no text at all; servelab times it at the first chunk of output, text
# or not, as vllm bench serve at its first chunk
TTFT_AT_TEXT = {
    "aiperf": (
        "its content_responses[0], metrics/types/ttft_metric.py",
        "which it counts as failed",
    ),
    "guidellm": (
        "the first line its handler takes text from, backends/openai/http.py",
        "for which it records no first token (left out of its TTFT here)",
    ),
}


def text_lag_cause(ours: Groups, config: str, tool: Tool) -> list[str]:
    """A tool that times TTFT at the first chunk with text, beside servelab's requests at the
    levels it measured whose output began without text (the server streams a token whose text
    it holds back as a chunk without text): the tool times those that many chunks later, and
    those without text at all as TTFT_AT_TEXT says."""
    spec = TTFT_AT_TEXT.get(tool.key or "")
    if spec is None:
        return []
    where, untimed = spec
    levels = {p.level.value for p in tool.data.points}
    lags = [
        lag
        for level in sorted(levels)
        for p in ours.by.get((config, level), {}).values()
        if (lag := p.extra.get("text_lag")) is not None
    ]
    n, lagged = sum(x["requests"] for x in lags), sum(x["lagged"] for x in lags)
    no_text = sum(x["no_text"] for x in lags)
    if not lagged and not no_text:
        return []
    seen = []
    if lagged:
        most = max(x["most"] for x in lags)
        seen.append(
            f"{lagged} began with output streamed without text (up to {most} chunks before "
            "the first with text), whose TTFT it times that much later"
        )
    if no_text:
        seen.append(f"{no_text} carried no text at all, {untimed}")
    return [
        f"{tool.name}: times TTFT at the first chunk with text ({where}), servelab at the "
        f"first chunk of output, text or not: of servelab's {n} completed requests at the "
        f"levels it measured, {'; '.join(seen)}"
    ]


def duration_cause(tool: Tool) -> list[str]:
    """A tool whose points' durations run past its requests' span (first send to last end):
    its tokens/s, over its own duration, reads lower than over the span servelab times."""
    pairs = [
        (float(d), float(span))
        for p in tool.data.points
        if (span := p.extra.get("request_span_s"))
        and isinstance(d := p.metrics.get("duration"), int | float)
    ]
    if not pairs:
        return []
    excess = sum(d for d, _ in pairs) / sum(s for _, s in pairs) - 1.0
    if excess <= SPAN_EXCESS:
        return []
    extra_s = sum(d - s for d, s in pairs) / len(pairs)
    return [
        f"{tool.name}: its duration runs {100 * excess:.0f}% past its requests' span, first "
        f"send to last end ({extra_s:.2f} s a point on average): its throughput, over its own "
        "duration, reads that much lower than over the span, which servelab's duration is"
    ]


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def wait_cause(tool: Tool, limit_pct: float) -> list[str]:
    """A tool whose requests waited in its client, between falling due and their send, longer
    on average than `limit_pct` of their mean latency (analysis.validity.max_client_wait_pct,
    servelab's own client_wait bound): its latencies, timed from the send, leave that out."""
    hot = []
    for p in tool.data.points:
        wait, e2el = p.extra.get("client_wait_ms"), p.metrics.get("mean_e2el_ms")
        if wait is not None and isinstance(e2el, int | float) and e2el > 0:
            if 100.0 * wait / e2el > limit_pct:
                hot.append((p, wait, 100.0 * wait / e2el))
    if not hot:
        return []
    worst = max(hot, key=lambda h: h[2])
    return [
        f"{tool.name}: its requests waited in its client, between falling due (a free slot, "
        f"or at a rate their scheduled time) and their send, longer than {limit_pct:g}% of "
        f"their mean latency in {len(hot)} of {len(tool.data.points)} points (at most "
        f"{worst[1]:.1f} ms, {worst[2]:.1f}%): its TTFT and E2EL, timed from the send, leave "
        "that wait out"
    ]


def own_client_cores(ours: Groups, config: str, level: LevelValue) -> float | None:
    """servelab's own client CPU at a level, in cores: the mean of its points' client_cpu
    check values (telemetry over each point)."""
    return _mean(
        [
            float(f.value)
            for p in ours.by.get((config, level), {}).values()
            for f in p.checks
            if f.check == "client_cpu" and f.value is not None
        ]
    )


def server_mean_ms(server: object, key: str) -> float | None:
    """The mean of the server's /metrics histogram `key` (ttft, itl), ms, in a telemetry
    summary's `server` block (None: not there)."""
    block = server.get(key) if isinstance(server, Mapping) else None
    mean = block.get("mean_ms") if isinstance(block, Mapping) else None
    return float(mean) if isinstance(mean, int | float) else None


def own_server_ms(ours: Groups, config: str, level: LevelValue, key: str) -> float | None:
    """The server's own mean TTFT or ITL (`key` ttft, itl; its /metrics histogram, ms) over
    servelab's points at a level: the telemetry summary's."""
    points = ours.by.get((config, level), {}).values()
    summaries = [(p.extra.get("telemetry") or {}).get("server") for p in points]
    return _mean([v for s in summaries if (v := server_mean_ms(s, key)) is not None])


@dataclass(frozen=True)
class LevelFacts:
    """One tool at one level beside servelab's client: client CPU (cores: servelab's, the
    tool's over its load window, the host's other busy cores meanwhile) and the server's own
    mean ITL and TTFT (ms, its /metrics) while each measured."""

    level: LevelValue
    own_cores: float | None
    tool_cores: float | None
    other_cores: float | None
    own_itl: float | None
    tool_itl: float | None
    own_ttft: float | None
    tool_ttft: float | None
    tool_wait: float | None = None  # its requests' mean wait in its client before the send, ms


def level_facts(ours: Groups, config: str, tool: Tool) -> list[LevelFacts]:
    """Per level the tool ran at (its client.json files), means over the repeats."""

    def mean_of(runs: Sequence[ClientRunJson], key: str) -> float | None:
        return _mean([float(v) for r in runs if isinstance(v := r.get(key), int | float)])

    return [
        LevelFacts(
            level,
            own_client_cores(ours, config, level),
            mean_of(runs, "client_cpu_cores"),
            mean_of(runs, "contention_cores"),
            own_server_ms(ours, config, level, "itl"),
            mean_of(runs, "server_itl_ms"),
            own_server_ms(ours, config, level, "ttft"),
            mean_of(runs, "server_ttft_ms"),
            _mean(
                [
                    w
                    for p in tool.data.points
                    if p.level.value == level and (w := p.extra.get("client_wait_ms")) is not None
                ]
            ),
        )
        for level, runs in sorted(tool.runs.items())
    ]


def cpu_causes(ours: Groups, tool: Tool, facts: Sequence[LevelFacts], limit: float) -> list[str]:
    """A tool's client CPU at or over the bound servelab holds its own client to
    (analysis.validity.max_client_cpu_cores), at the levels where it was; and a server that
    served the tool's requests slower than servelab's, by its own /metrics (`facts`: the
    tool's `level_facts`)."""
    out: list[str] = []
    hot = [
        f"{ours.level_name(f.level)}: {f.tool_cores:.2f} cores"
        + ("" if f.own_cores is None else f" (servelab's client {f.own_cores:.2f})")
        for f in facts
        if f.tool_cores is not None and f.tool_cores >= limit
    ]
    if hot:
        out.append(
            f"{tool.name}: its client processes used at least the {limit:g} of a core that "
            f"servelab allows its own client (max_client_cpu_cores) over the load: "
            f"{'; '.join(hot)}. A client that busy falls behind the stream, or takes CPU from "
            "a server on the same cores"
        )
    slower = [
        f"{ours.level_name(f.level)}: {f.tool_itl / f.own_itl:.2f}x"
        + ("" if f.tool_cores is None else f" (its client {f.tool_cores:.2f} cores)")
        for f in facts
        if f.tool_itl and f.own_itl and f.tool_itl / f.own_itl > 1.0 + SERVER_SLOWER
    ]
    if slower:
        out.append(
            f"{tool.name}: the server itself was slower while it measured, its own mean ITL "
            f"(/metrics) over that under servelab's client: {'; '.join(slower)}. That part of "
            "the difference is in what the server did, not in how the tool timed it; a client "
            "sharing the server's cores is one reason"
        )
    return out


def _ratio_text(r: Ratio | None) -> str:
    if r is None:
        return "-"
    if r.low is None or r.high is None:
        return f"{r.value:.3f} (one repeat)"
    return f"{r.value:.3f} [{r.low:.3f}, {r.high:.3f}]"


def _value(v: float | None, n: int) -> str:
    return "invalid" if v is None else f"{v:.4g} (n = {n})"


def clients_section(
    ours: Groups, config: str, tools: Sequence[Tool], validity: ValiditySection | None = None
) -> list[str]:
    """report's "Clients compared": the table, the tools' client CPU where servelab ran them,
    and the causes, as Markdown lines; `validity` (analysis.validity, the schema's defaults
    when None): the bounds servelab holds its own client to, which the causes apply."""
    limits = validity or default_section(ValiditySection, "analysis", "validity")
    off_pct = float(limits.max_arrival_rate_error_pct)
    rows = compare_clients(ours, config, tools)
    table = [
        [
            r.tool,
            ours.level_name(r.level),
            r.metric,
            _value(r.ours, r.n_ours),
            _value(r.theirs, r.n_theirs),
            _ratio_text(r.ratio),
        ]
        for r in rows
    ]
    facts = {tool.name: level_facts(ours, config, tool) for tool in tools}
    found = [
        line
        for tool in tools
        for line in [
            *causes(tool),
            *text_lag_cause(ours, config, tool),
            *duration_cause(tool),
            *rate_causes(ours, config, tool.name, tool.data.points, off_pct, tool.handed),
        ]
    ]
    cpu_limit = float(limits.max_client_cpu_cores)
    found += [
        line for tool in tools for line in cpu_causes(ours, tool, facts[tool.name], cpu_limit)
    ]
    found += [
        line for tool in tools for line in wait_cause(tool, float(limits.max_client_wait_pct))
    ]
    found += [
        f"{tool.name}: {tool.failed} of its runs failed (kept as <point>.failed/, not read)"
        for tool in tools
        if tool.failed
    ]
    return [
        "## Clients compared",
        "",
        f"The server configuration {config} as servelab's client measured it against other "
        "tools' runs of the same points: each side's mean over its repeats that count (a "
        "metric a validity check removed is left out: invalid), and the tool's value over "
        "servelab's, a ratio of geometric means with its 95% interval (Welch, on the logs; the "
        "runs are not paired).",
        "",
        *md_table(
            ["Tool", "Level", "Metric", "servelab", "Tool's", "Tool / servelab [95% CI]"],
            table,
            align="lllrrr",
        ),
        "",
        *_cpu_table(ours, tools, facts),
        "Known causes the data shows:" if found else "Known causes the data shows: none.",
        *(f"- {line}" for line in found),
        "",
    ]


def _cores_text(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _cpu_table(
    ours: Groups, tools: Sequence[Tool], facts: Mapping[str, Sequence[LevelFacts]]
) -> list[str]:
    """Each tool's client CPU and the server's own view beside servelab's, where servelab ran
    the tool (client.json): `facts`, each tool's `level_facts` by its name."""
    t = _cores_text

    def ms(a: float | None, b: float | None) -> str:
        return "-" if a is None or b is None else f"{a:.1f} / {b:.1f}"

    rows = [
        [
            tool.name,
            ours.level_name(f.level),
            t(f.own_cores),
            t(f.tool_cores),
            t(f.other_cores),
            ms(f.own_itl, f.tool_itl),
            ms(f.own_ttft, f.tool_ttft),
            "-" if f.tool_wait is None else f"{f.tool_wait:.1f}",
        ]
        for tool in tools
        for f in facts[tool.name]
    ]
    if not rows:
        return []
    return [
        "Client CPU, in cores: servelab's client over its points, each tool's processes over "
        "the load window (the span the server's /metrics showed requests running or waiting: "
        "start-up left out), and the host's busy cores outside the server, the tool and the "
        "samplers meanwhile. The server's own mean ITL and TTFT (its /metrics histograms, ms) "
        "under servelab's client / under the tool. The tool's requests' mean wait in its client "
        "between falling due and their send (ms; where its files record it). Means over the "
        "repeats.",
        "",
        *md_table(
            [
                "Tool",
                "Level",
                "servelab's client",
                "Tool's client",
                "Other busy cores",
                "Server ITL",
                "Server TTFT",
                "Tool's wait",
            ],
            rows,
            align="llrrrrrr",
        ),
        "",
    ]
