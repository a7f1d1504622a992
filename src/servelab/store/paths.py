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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from servelab.design.level import Level

if TYPE_CHECKING:
    from servelab.design.schedule import Slot

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
# multi-turn chat points' TTFT by turn and conversations (analysis/turns.py)
TURNS_TABLE = "turns.json"
# a confirmation experiment's verdict per proposal (analysis/confirmation.py)
CONFIRMATION_TABLE = "confirmation.json"
# pairs of configurations compared on this host in three words (analysis/samehost.py)
SAME_HOST_TABLE = "same_host.json"
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

# The files of the raw layout (docs/raw-data.md): every reader and writer names them from here,
# and each JSON one is read and written through its record type (servelab.store.records).
POINT_FILE = "point.json"  # a measured point, and a warm-up
REQUESTS_FILE = "requests.jsonl.gz"  # a point's requests, one row each
TELEMETRY_FILE = "telemetry.jsonl"  # a point's telemetry samples
PROMPTS_FILE = "prompts.jsonl.gz"  # the prompts of one launch of a server configuration
DATASET_FILE = "dataset.json"  # a dataset workload's file identity and what was sampled
TRACE_FILE = "trace.json"  # a trace workload's file identity and the window replayed
RUN_FILE = "run.json"  # a finished sweep of one server configuration
LAUNCH_FILE = "launch.json"  # a configuration's latest server launch
CAPACITY_FILE = "capacity.json"  # the facts of its server's startup log
SERVER_LOG = "server.log"  # the server's own output
CAPTURE_FILE = "capture.json"  # one profiling job: profiled, or not and why
WINDOWS_FILE = "windows.json"  # the diagnostic points of a profiling pass
PROFILE_FILE = "profile.json"  # a profiling pass's trace analysis
RUNTIME_FILE = "runtime.json"  # the server runtime
CLIENTS_FILE = "clients.json"  # runtime/clients.json: the other tools' venvs (client.cross_check)
CLIENTS_DIR = "clients"  # raw/<sc>/clients/<tool>/rep_<NN>/concurrency_<CCC>/: their runs
CLIENT_FILE = "client.json"  # a tool's run of one point: its command, exit, CPU and load window
ARRIVALS_DIR = "arrivals"  # raw/<sc>/arrivals/r<rate>.json: an open-loop rate's send schedule
SEARCH_DIR = "search"  # raw/<sc>/search/: the SLO capacity search's points and its record
SEARCH_FILE = "search.json"
RAW_LAYOUT_FILES = (
    POINT_FILE,
    REQUESTS_FILE,
    TELEMETRY_FILE,
    PROMPTS_FILE,
    DATASET_FILE,
    TRACE_FILE,
    RUN_FILE,
    LAUNCH_FILE,
    CAPACITY_FILE,
    SERVER_LOG,
    CAPTURE_FILE,
    WINDOWS_FILE,
    PROFILE_FILE,
    RUNTIME_FILE,
    SEARCH_FILE,
    CLIENTS_FILE,
    CLIENT_FILE,
)


# an SLO capacity search's path, one figure per searched server configuration: search-<sc>
SEARCH_FIGURE_PREFIX = "search-"


def search_figure_name(sc: str) -> str:
    """The figure of server configuration `sc`'s SLO capacity search, without suffix."""
    return f"{SEARCH_FIGURE_PREFIX}{sc}"


def figure_names(telemetry: bool, searched: Sequence[str] = ()) -> list[str]:
    """The analysis figures of an experiment, without suffix, in the order the analysis draws
    them: FIGURES, utilization against tokens/s with telemetry, each searched configuration's
    search path."""
    names = [*FIGURES, TELEMETRY_FIGURE] if telemetry else list(FIGURES)
    return names + [search_figure_name(sc) for sc in searched]


def default_cache_dir() -> Path:
    """$SERVELAB_CACHE, else $XDG_CACHE_HOME/servelab, else ~/.cache/servelab."""
    env = os.environ.get("SERVELAB_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "servelab"


MEASURING_LOCK = "measuring-server.lock"


def measuring_lock_path() -> Path:
    """The host's measuring-server lock (servelab.launch.hostlock.MeasuringLock):
    $SERVELAB_LOCK_DIR/measuring-server.lock, else <cache>/locks/<host>/measuring-server.lock
    in default_cache_dir(), whatever an experiment's runtime.cache_dir says. The host's name is
    in the path because a cache may be shared by the nodes of a cluster (docs/cluster.md), and
    one node's measurement does not disturb another's."""
    env = os.environ.get("SERVELAB_LOCK_DIR")
    if env:
        return Path(env) / MEASURING_LOCK
    return default_cache_dir() / "locks" / (platform.node() or "localhost") / MEASURING_LOCK


# an open-loop point's folder: r, the rate with at least four digits before the point and
# three after it (r0002.500); the glob matches every such name and nothing that ends in
# .partial or .incomplete
RATE_GLOB = "r[0-9][0-9][0-9][0-9]*.[0-9][0-9][0-9]"


# a point measured again after a host check failed (servelab.measure.remeasure): attempt N (2
# or more) in <point>/attempt-<N>/, beside the first attempt's files in <point>/
ATTEMPT_PREFIX = "attempt-"


def attempt_dir(point_dir: Path, attempt: int) -> Path:
    """Where attempt `attempt` of a point is measured: the point's folder for the first,
    <point>/attempt-<N>/ for a re-measure."""
    return point_dir if attempt == 1 else point_dir / f"{ATTEMPT_PREFIX}{attempt}"


def attempt_dirs(point_dir: Path) -> list[Path]:
    """A point's complete re-measures (attempt-<N>/ with its point.json), by attempt; an
    attempt cut short (attempt-<N>.partial, .incomplete) never counts."""
    found = []
    for d in point_dir.glob(f"{ATTEMPT_PREFIX}*"):
        n = d.name.removeprefix(ATTEMPT_PREFIX)
        if n.isdigit() and int(n) >= 2 and (d / POINT_FILE).is_file():
            found.append((int(n), d))
    return [d for _, d in sorted(found)]


def rate_dir(rate: float) -> str:
    """The folder name of a rate's points: r0002.500 for 2.5 requests per second."""
    return Level.at_rate(rate).dirname


@dataclass(frozen=True)
class ExperimentPaths:
    """The folders of one experiment, e.g. ExperimentPaths(Path("results/quickstart-cpu"))."""

    root: Path

    @property
    def raw(self) -> Path:
        return self.root / "raw"

    def raw_config(self, sc: str) -> Path:
        return self.raw / sc

    def level_point(self, sc: str, repeat: int, level: Level) -> Path:
        """The folder of one measured point (its point.json and requests): c<concurrency>
        (c0008) for a closed-loop point, r<rate to the thousandth> (r0002.500) for an open-loop
        one (Level.dirname)."""
        return self.raw / sc / f"rep{repeat:02d}" / level.dirname

    def point(self, sc: str, repeat: int, concurrency: int) -> Path:
        """The folder of one closed-loop point (its point.json and requests)."""
        return self.level_point(sc, repeat, Level.at_concurrency(concurrency))

    def rate_point(self, sc: str, repeat: int, rate: float) -> Path:
        """The folder of one open-loop point: r<rate to the thousandth>, e.g. r0002.500."""
        return self.level_point(sc, repeat, Level.at_rate(rate))

    def slot(self, sc: str, slot: Slot) -> Path:
        """The folder of a planned point, closed or open loop."""
        return self.level_point(sc, slot.repeat, slot.level)

    def arrivals(self, sc: str, rate: float) -> Path:
        """The send schedule of one rate's points (every repeat sends the same one)."""
        return self.raw / sc / ARRIVALS_DIR / f"{rate_dir(rate)}.json"

    def search(self, sc: str) -> Path:
        """raw/<sc>/search/: the SLO capacity search of one configuration
        (servelab.measure.slo_search)."""
        return self.raw / sc / SEARCH_DIR

    def search_point(self, sc: str, repeat: int, rate: float) -> Path:
        """A rate the search measured, one repeat: raw/<sc>/search/rep<RR>/r<rate>/."""
        return self.search(sc) / f"rep{repeat:02d}" / rate_dir(rate)

    def search_warmup(self, sc: str) -> Path:
        """The warm-up of the search's own server launch."""
        return self.search(sc) / "warmup"

    def search_arrivals(self, sc: str, rate: float) -> Path:
        """The send schedule of a rate the search measured."""
        return self.search(sc) / ARRIVALS_DIR / f"{rate_dir(rate)}.json"

    def search_record(self, sc: str) -> Path:
        """raw/<sc>/search/search.json: the search's path and its answer."""
        return self.search(sc) / SEARCH_FILE

    def search_files(self) -> list[Path]:
        """Every configuration's search.json, in folder order."""
        return sorted(self.raw.glob(f"*/{SEARCH_DIR}/{SEARCH_FILE}"))

    def arrival_files(self) -> list[Path]:
        """Every send schedule, in folder order."""
        return sorted(self.raw.glob(f"*/{ARRIVALS_DIR}/{RATE_GLOB}.json"))

    def warmup(self, sc: str) -> Path:
        return self.raw / sc / "warmup"

    def warmup_file(self, sc: str) -> Path:
        """The point.json of a configuration's warm-up."""
        return self.warmup(sc) / POINT_FILE

    def prompts(self, sc: str) -> Path:
        return self.raw / sc / PROMPTS_FILE

    def dataset(self, sc: str) -> Path:
        """raw/<sc>/dataset.json: the dataset a configuration's prompts were sampled from."""
        return self.raw / sc / DATASET_FILE

    def trace(self, sc: str) -> Path:
        """raw/<sc>/trace.json: the trace a configuration replayed, and its window."""
        return self.raw / sc / TRACE_FILE

    def run(self, sc: str) -> Path:
        return self.raw / sc / RUN_FILE

    def point_files(self) -> list[Path]:
        """Every complete measured point's point.json, in folder order: `.partial` and
        `.incomplete` folders never match."""
        closed = f"*/rep[0-9][0-9]/c[0-9][0-9][0-9][0-9]/{POINT_FILE}"
        open_ = f"*/rep[0-9][0-9]/{RATE_GLOB}/{POINT_FILE}"
        return sorted([*self.raw.glob(closed), *self.raw.glob(open_)])

    def warmup_files(self) -> list[Path]:
        """Every configuration's warm-up point.json, in folder order."""
        return sorted(self.raw.glob(f"*/warmup/{POINT_FILE}"))

    def run_files(self) -> list[Path]:
        """Every run.json, in folder order."""
        return sorted(self.raw.glob(f"*/{RUN_FILE}"))

    @property
    def servers(self) -> Path:
        return self.root / "server"

    def server(self, sc: str) -> Path:
        return self.servers / sc

    def launch(self, sc: str) -> Path:
        return self.server(sc) / LAUNCH_FILE

    def capacity(self, sc: str) -> Path:
        return self.server(sc) / CAPACITY_FILE

    def server_log(self, sc: str) -> Path:
        return self.server(sc) / SERVER_LOG

    def launch_files(self) -> list[Path]:
        """Every configuration's launch.json, in folder order."""
        return sorted(self.servers.glob(f"*/{LAUNCH_FILE}"))

    def capacity_files(self) -> list[Path]:
        """Every configuration's capacity.json, in folder order."""
        return sorted(self.servers.glob(f"*/{CAPACITY_FILE}"))

    @property
    def profiles(self) -> Path:
        return self.root / "profile"

    def profile(self, sc: str) -> Path:
        return self.profiles / sc

    def capture(self, sc: str) -> Path:
        return self.profile(sc) / CAPTURE_FILE

    def windows(self, sc: str) -> Path:
        return self.profile(sc) / WINDOWS_FILE

    def capture_files(self) -> list[Path]:
        """Every profiled configuration's capture.json, in folder order."""
        return sorted(self.profiles.glob(f"*/{CAPTURE_FILE}"))

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def runtime(self) -> Path:
        return self.root / "runtime"

    @property
    def runtime_record(self) -> Path:
        """runtime/runtime.json: the server runtime the runtime stage made."""
        return self.runtime / RUNTIME_FILE

    @property
    def clients_record(self) -> Path:
        """runtime/clients.json: the venvs of the tools of client.cross_check."""
        return self.runtime / CLIENTS_FILE

    def clients(self, sc: str) -> Path:
        """raw/<sc>/clients/: the other tools' runs of this configuration's points, one
        vllm-bench tree (rep_<NN>/concurrency_<CCC>/) per tool."""
        return self.raw / sc / CLIENTS_DIR

    def config_runtime_record(self, sc: str) -> Path:
        """runtime/<sc>/runtime.json: the runtime of a configuration with its own
        (server.configs[].runtime)."""
        return self.runtime / sc / RUNTIME_FILE

    def config_runtime_records(self) -> list[Path]:
        """Every runtime/<sc>/runtime.json there is, by configuration."""
        return sorted(self.runtime.glob(f"*/{RUNTIME_FILE}"))

    @property
    def analysis(self) -> Path:
        return self.root / "analysis"

    @property
    def bundle(self) -> Path:
        return self.root / "bundle"

    @property
    def reproduction(self) -> Path:
        return self.root / "reproduction"
