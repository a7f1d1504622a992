"""A campaign: several experiments run by one `snakemake` invocation (docs/cluster.md).

A campaign file names experiment files:

    name: cpu-pair
    experiments:
      - config/experiments/a.yaml
      - config/experiments/b.yaml

Each experiment keeps its own results folder, raw data, analysis and bundle, exactly as when it
runs alone; under a cluster profile each one's measuring jobs are one job on a node of its own.
The campaign adds one table over all of them (`campaign_rows`, written by `write_campaign`):
experiment x server configuration x concurrency, with the host each configuration was measured
on, in `<results_dir>/campaigns/<name>/`.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from servelab.config import load_yaml, read_file, validate
from servelab.documents import JsonObject
from servelab.errors import ServelabError
from servelab.render import md_table, write_csv
from servelab.store.paths import ExperimentPaths
from servelab.store.records import LaunchRecord

__all__ = [
    "CAMPAIGN_COLUMNS",
    "CAMPAIGN_METRICS",
    "Campaign",
    "CampaignExperiment",
    "campaign_rows",
    "load_campaign",
    "write_campaign",
]

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
KEYS = ("name", "experiments", "results_dir")
# the metrics of the campaign table, from each experiment's analysis/summary.csv
CAMPAIGN_METRICS = ("output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms")
CAMPAIGN_COLUMNS = (
    "experiment",
    "server_config",
    "concurrency",
    "metric",
    "n",
    "mean",
    "cv_pct",
    "ci95_low",
    "ci95_high",
    "host",
)


@dataclass(frozen=True)
class CampaignExperiment:
    source: Path  # the experiment file
    config: JsonObject  # as written (the workflow validates it again, as for one experiment)
    experiment: str
    exp_dir: Path  # <results_dir>/<experiment>

    def targets(self) -> list[str]:
        """What a run of this experiment alone ends with: its bundle and summary, and its
        reproduction where it names a reference."""
        out = [f"{self.exp_dir}/bundle/manifest.json", f"{self.exp_dir}/summary.txt"]
        if self.config.get("reference"):
            out.append(f"{self.exp_dir}/reproduction/reproduction.json")
        return out


@dataclass(frozen=True)
class Campaign:
    name: str
    source: Path
    results_dir: Path  # where the campaign table goes: <results_dir>/campaigns/<name>/
    experiments: list[CampaignExperiment]

    @property
    def out_dir(self) -> Path:
        return self.results_dir / "campaigns" / self.name

    def describe(self) -> str:
        names = ", ".join(e.experiment for e in self.experiments)
        return f"campaign {self.name}: {len(self.experiments)} experiment(s): {names}"


def load_campaign(path: Path, base: Path | None = None) -> Campaign:
    """Read and check a campaign file: every experiment file exists and validates, and no two
    experiments share a results folder. Relative experiment paths are relative to `base` (the
    working directory of the workflow; the current directory when None)."""
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ServelabError(f"{path}: a campaign file is a mapping with keys {', '.join(KEYS)}")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ServelabError(
            f"{path}: unknown key {unknown[0]!r}; a campaign has {', '.join(KEYS)} "
            "(docs/cluster.md)"
        )
    name = data.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ServelabError(
            f"{path}: name: {name!r} is not a name; use letters, digits, '.', '_' and '-'"
        )
    files = data.get("experiments")
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise ServelabError(f"{path}: experiments: list the experiment files, one or more")
    entries = [str(f) for f in files]  # each a string (checked above)
    root = base or Path.cwd()
    experiments: list[CampaignExperiment] = []
    seen: dict[Path, Path] = {}
    for i, entry in enumerate(entries):
        source = Path(entry)
        full = source if source.is_absolute() else root / source
        if not full.is_file():
            raise ServelabError(f"{path}: experiments[{i}]: {entry}: file not found")
        raw = read_file(full)
        exp = validate(raw, source=str(source))
        if not isinstance(raw, dict):  # validate() refuses any other experiment file
            raise ServelabError(f"{source}: not a mapping of config keys")
        exp_dir = Path(exp.results_dir) / exp.experiment
        if exp_dir in seen:
            raise ServelabError(
                f"{path}: experiments[{i}]: {entry} writes to {exp_dir}, as {seen[exp_dir]} does; "
                "give one of them another `experiment:` name"
            )
        seen[exp_dir] = source
        experiments.append(CampaignExperiment(source, raw, exp.experiment, exp_dir))
    results_dir = data.get("results_dir", "results")
    if not isinstance(results_dir, str) or not results_dir:
        raise ServelabError(f"{path}: results_dir: {results_dir!r} is not a folder name")
    return Campaign(name, path, Path(results_dir), experiments)


def _hosts(exp_dir: Path) -> dict[str, str]:
    """server config -> the hostname its launch record names ('' where none is recorded)."""
    out = {}
    for lj in ExperimentPaths(exp_dir).launch_files():
        node = LaunchRecord.read(lj).node
        hostname = node.get("hostname") if node is not None else None
        if isinstance(hostname, str):
            out[lj.parent.name] = hostname
    return out


class CampaignRow(TypedDict):
    """One row of campaign.csv (`campaign_rows`; CAMPAIGN_COLUMNS)."""

    experiment: str
    server_config: str
    concurrency: int
    metric: str
    n: int
    mean: float | None
    cv_pct: float | None
    ci95_low: float | None
    ci95_high: float | None
    host: str


def _float_or_none(text: str) -> float | None:
    """A summary.csv cell: a number, or None when empty."""
    return float(text) if text else None


def campaign_rows(experiments: list[tuple[str, Path]]) -> list[CampaignRow]:
    """The campaign table: for each (experiment name, experiment folder), the rows of its
    analysis/summary.csv for CAMPAIGN_METRICS, with the experiment and the measuring host."""
    rows: list[CampaignRow] = []
    for name, exp_dir in experiments:
        table = exp_dir / "analysis" / "summary.csv"
        try:
            with table.open(encoding="utf-8", newline="") as fh:
                summary = list(csv.DictReader(fh))
        except FileNotFoundError:
            raise ServelabError(f"{table}: not found; run the experiment {name} first") from None
        hosts = _hosts(exp_dir)
        for r in summary:
            if r.get("metric") not in CAMPAIGN_METRICS:
                continue
            rows.append(
                {
                    "experiment": name,
                    "server_config": r["server_config"],
                    "concurrency": int(r["concurrency"]),
                    "metric": r["metric"],
                    "n": int(r["n"]),
                    "mean": _float_or_none(r["mean"]),
                    "cv_pct": _float_or_none(r["cv_pct"]),
                    "ci95_low": _float_or_none(r["ci95_low"]),
                    "ci95_high": _float_or_none(r["ci95_high"]),
                    "host": hosts.get(r["server_config"], ""),
                }
            )
    rows.sort(
        key=lambda r: (
            r["experiment"],
            r["server_config"],
            r["concurrency"],
            CAMPAIGN_METRICS.index(r["metric"]),
        )
    )
    return rows


def _cell(v: float | str | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def campaign_markdown(name: str, rows: list[CampaignRow]) -> str:
    """One line per experiment x config x concurrency: the metric means, and the host."""
    wide: dict[tuple[str, str, int], dict[str, float | str | None]] = {}
    for r in rows:
        line = wide.setdefault(
            (r["experiment"], r["server_config"], r["concurrency"]), {"host": r["host"]}
        )
        line[r["metric"]] = r["mean"]
    header = ["experiment", "server config", "c", *CAMPAIGN_METRICS, "host"]
    body = [
        [e, sc, c, *(_cell(v.get(m)) for m in CAMPAIGN_METRICS), v["host"] or "not recorded"]
        for (e, sc, c), v in wide.items()
    ]
    experiments = sorted({r["experiment"] for r in rows})
    hosts = sorted({r["host"] for r in rows if r["host"]})
    lines = [
        f"# Campaign {name}",
        "",
        f"{len(experiments)} experiment(s): {', '.join(experiments)}; measured on "
        + (", ".join(hosts) if hosts else "hosts not recorded")
        + ". Means over the repeats (-: no valid repeat); each experiment's own analysis "
        "(<experiment>/analysis/report.md) has the tests, verdicts and validity checks behind "
        "them.",
        "",
        *md_table(header, body, "llrrrrrl"),
        "",
    ]
    return "\n".join(lines)


def write_campaign(name: str, experiments: list[tuple[str, Path]], out_dir: Path) -> Path:
    """campaign.csv and summary.md in `out_dir`; returns summary.md's path."""
    rows = campaign_rows(experiments)
    write_csv(out_dir / "campaign.csv", CAMPAIGN_COLUMNS, rows)
    md = out_dir / "summary.md"
    md.write_text(campaign_markdown(name, rows), encoding="utf-8")
    return md
