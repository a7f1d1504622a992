"""Where things live: the cache, an experiment's folders, and the names of the outputs.

Everything that names a file of an experiment folder (docs/raw-data.md) reads it
from here; the Snakemake rules import the output names too, so each name is written once.

    <results_dir>/<experiment>/
      model/ runtime/                    the pinned model and server runtime
      server/<sc>/launch.json ...        one folder per server configuration
      raw/<sc>/run.json                  the sweep of one server configuration
      raw/<sc>/rep01/c0008/point.json    one measured point
      raw/<sc>/warmup/point.json         its warm-up
      profile/<sc>/                      the profiling pass
      analysis/ bundle/ reproduction/    derived outputs
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

# analysis/: the tables and verdicts, and the figures (each under one name, .svg)
ANALYSIS_TABLES = (
    "points.csv",
    "summary.csv",
    "paired.csv",
    "dominance.csv",
    "knee.json",
    "diagnoses.json",
    "claims.json",
)
SLO_TABLE = "slo.json"
# a sequential sweep's looks, round by round (analysis/rounds.py)
ROUNDS_TABLE = "rounds.json"
VALIDITY_TABLE = "validity.json"
ANALYSIS_REPORT = "report.md"
FIGURES = (
    "throughput_vs_concurrency",
    "latency_throughput",
    "ttft_distribution",
    "paired_differences",
    "configs_side_by_side",
)
TELEMETRY_FIGURE = "utilization_vs_throughput"
POINT_FILE = "point.json"
RUN_FILE = "run.json"


def figure_names(telemetry: bool) -> list[str]:
    """The analysis figures of an experiment, without suffix."""
    return [*FIGURES, TELEMETRY_FIGURE] if telemetry else list(FIGURES)


def default_cache_dir() -> Path:
    """$SERVELAB_CACHE, else $XDG_CACHE_HOME/servelab, else ~/.cache/servelab."""
    env = os.environ.get("SERVELAB_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "servelab"


MEASURING_LOCK = "measuring-server.lock"


def measuring_lock_path() -> Path:
    """The host's measuring-server lock (servelab.session.MeasuringLock):
    $SERVELAB_LOCK_DIR/measuring-server.lock, else <cache>/locks/<host>/measuring-server.lock
    in default_cache_dir(), whatever an experiment's runtime.cache_dir says. The host's name is
    in the path because a cache may be shared by the nodes of a cluster (docs/cluster.md), and
    one node's measurement does not disturb another's."""
    env = os.environ.get("SERVELAB_LOCK_DIR")
    if env:
        return Path(env) / MEASURING_LOCK
    return default_cache_dir() / "locks" / (platform.node() or "localhost") / MEASURING_LOCK


@dataclass(frozen=True)
class ExperimentPaths:
    """The folders of one experiment, e.g. ExperimentPaths(Path("results/quickstart-cpu"))."""

    root: Path

    @property
    def raw(self) -> Path:
        return self.root / "raw"

    def raw_config(self, sc: str) -> Path:
        return self.raw / sc

    def point(self, sc: str, repeat: int, concurrency: int) -> Path:
        """The folder of one point (its point.json and requests)."""
        return self.raw / sc / f"rep{repeat:02d}" / f"c{concurrency:04d}"

    def warmup(self, sc: str) -> Path:
        return self.raw / sc / "warmup"

    def run(self, sc: str) -> Path:
        return self.raw / sc / RUN_FILE

    def server(self, sc: str) -> Path:
        return self.root / "server" / sc

    def profile(self, sc: str) -> Path:
        return self.root / "profile" / sc

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def runtime(self) -> Path:
        return self.root / "runtime"

    @property
    def analysis(self) -> Path:
        return self.root / "analysis"

    @property
    def bundle(self) -> Path:
        return self.root / "bundle"

    @property
    def reproduction(self) -> Path:
        return self.root / "reproduction"
