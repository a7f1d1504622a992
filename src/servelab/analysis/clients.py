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

from collections.abc import Sequence
from dataclasses import dataclass

from servelab.analysis.dataset import Dataset
from servelab.analysis.groups import Groups
from servelab.analysis.stats import Ratio, ratio_ci
from servelab.analysis.validity import FAILED
from servelab.design.level import LevelValue
from servelab.render import md_table

METRICS = ("output_throughput", "mean_ttft_ms", "mean_itl_ms")
# validity checks whose failure on a tool's point names a known cause, and the cause in words
CAUSES = {
    "streaming": "streams that arrived in one read: the TTFT it reports is the whole response "
    "(its client, or the host, fell behind the stream)",
    "failed_requests": "requests it failed that the server answered",
    "output_length": "output lengths other than asked",
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
    """A tool's results: its name (and version), and its points (one server configuration)."""

    name: str
    data: Dataset


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
                        sum(b) / len(b) if b else None,
                        sum(a) / len(a) if a else None,
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


def _ratio_text(r: Ratio | None) -> str:
    if r is None:
        return "-"
    if r.low is None or r.high is None:
        return f"{r.value:.3f} (one repeat)"
    return f"{r.value:.3f} [{r.low:.3f}, {r.high:.3f}]"


def _value(v: float | None, n: int) -> str:
    return "invalid" if v is None else f"{v:.4g} (n = {n})"


def clients_section(ours: Groups, config: str, tools: Sequence[Tool]) -> list[str]:
    """report's "Clients compared": the table and the causes, as Markdown lines."""
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
    found = [line for tool in tools for line in causes(tool)]
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
        "Known causes the data shows:" if found else "Known causes the data shows: none.",
        *(f"- {line}" for line in found),
        "",
    ]
