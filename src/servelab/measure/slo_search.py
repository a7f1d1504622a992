"""SLO capacity by search, measured: one server launch per searched configuration, after its
sweep, on which `servelab.analysis.search.search_rate` chooses each next rate from what the
rates before it measured (docs/analysis.md, "SLO capacity by search").

Each rate is measured as an open-loop point of the sweep (servelab.measure.point.PointJob), with the
experiment's repeats one after another and every validity check of an open-loop point; a
repeat's outcome is its SLO attainment (the share of its requests within every bound of
`analysis.slo`, each read as a per-request bound), how many requests it sent and whether it
passed the checks. A rate the early-stop decision leaves undecided is measured again, a round
of the repeats at a time, up to `search.max_rounds` rounds: round r's repeats are numbered on
from round r - 1's, so with 3 repeats a round, round 2 is rep04-rep06 and round 3 rep07-rep09.

Layout written (docs/raw-data.md):
  raw/<sc>/search/prompts.jsonl.gz  dataset.json  launch.json  capacity.json
  raw/<sc>/search/warmup/{requests.jsonl.gz,point.json}
  raw/<sc>/search/arrivals/r<RRRR.RRR>.json       each rate's send schedule (every round's)
  raw/<sc>/search/rep<RR>/r<RRRR.RRR>/{requests.jsonl.gz,point.json}
                                                   repeat RR of the rate: round 1's first,
                                                   then each further round's
  raw/<sc>/search/search.json                      written last: the path and the answer
A rerun keeps the complete points: the search replays their outcomes (the same outcomes give
the same path) and measures only what it has not.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from servelab.analysis.early_stop import min_requests
from servelab.analysis.search import (
    RateOutcome,
    RepeatOutcome,
    SearchResult,
    SearchSpec,
    SloBounds,
    search_rate,
    slo_attainment,
)
from servelab.analysis.search_records import write_search
from servelab.analysis.validity import check_point, failed
from servelab.design.level import Level
from servelab.design.schedule import Slot
from servelab.documents.declared import SearchJson
from servelab.experiment import Experiment
from servelab.job import MeasureJob
from servelab.launch.ports import choose_port
from servelab.launch.server import ServerLaunch, raise_on_signals
from servelab.launch.session import Session, build_launch, serve
from servelab.measure.point import PointJob, is_complete
from servelab.measure.sending import Replay, schedule_of
from servelab.measure.sweep import SweepJob, next_launch_index
from servelab.store.paths import DATASET_FILE, PROMPTS_FILE
from servelab.store.rawdata import RawPoint
from servelab.store.records import ArrivalsRecord, LaunchRecord, PointRecord, WarmupRecord
from servelab.telemetry import server_gpus
from servelab.workload.promptset import Item, PromptSet, write_prompts


@dataclass(frozen=True)
class SearchJob(SweepJob):
    """The search of one configuration: a sweep job whose launch records its capacity.json
    and launch.json in raw/<sc>/search/, leaving the sweep's in server/<sc>/ as they were."""

    @property
    def records_dir(self) -> Path:
        return self.paths.search(self.sc)


def search_spec(exp: Experiment) -> SearchSpec:
    """The search as the config asks it: `search` and the bounds of `analysis.slo`."""
    s = exp.search
    assert s is not None
    slo = exp.analysis.slo
    bounds = SloBounds(slo.p99_ttft_ms, slo.p99_tpot_ms, slo.p99_e2el_ms)
    return SearchSpec(
        start_rate=s.start_rate,
        bounds=bounds,
        target=s.target,
        growth=s.growth,
        tolerance=s.tolerance,
        max_measurements=s.max_measurements,
        min_rate=s.min_rate,
        max_rate=s.max_rate,
        max_rounds=s.max_rounds,
    )


@dataclass
class RateMeasurer:
    """Measures the rates the search asks for on one server launch."""

    sweep: SweepJob
    session: Session
    launch: ServerLaunch
    launch_index: int
    spec: SearchSpec
    prompts: PromptSet = field(default_factory=lambda: PromptSet([]))
    measured: int = 0  # rounds measured, of every rate
    # every round's repeats so far, by rate: the decision the log states after each round
    pooled: dict[float, list[RepeatOutcome]] = field(default_factory=dict)

    @cached_property
    def replay(self) -> Replay | None:
        """The trace window the search replays at every rate (None: no trace workload)."""
        return self.sweep.replay(self.session)

    def prompts_for(self, n: int, copy: int = 0) -> list[Item]:
        """The first n prompts of the workload (a search sends the same ones at every rate;
        the prefix_cache check catches a server that caches them). A trace's: the warm-up's
        (copy 0), or the copy-th replay of the window, its blocks its own."""
        skip = 0
        if self.replay is not None and copy:
            skip = self.sweep.exp.workload.warmup.requests + (copy - 1) * n
        if len(self.prompts.items) < skip + n:
            where = self.sweep.paths.search(self.sweep.sc)
            self.prompts = self.sweep.prompt_source.build(self.session, skip + n)
            write_prompts(where / PROMPTS_FILE, where / DATASET_FILE, self.prompts)
        return self.prompts.items[skip : skip + n]

    def schedule(self, rate: float) -> ArrivalsRecord:
        """The rate's send schedule, kept in raw/<sc>/search/arrivals/."""
        exp, sc = self.sweep.exp, self.sweep.sc
        assert exp.search is not None
        record = schedule_of(exp.search.arrival, rate, exp.workload.seed, self.replay)
        path = self.sweep.paths.search_arrivals(sc, rate)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            record.write(path)
        return record

    def repeats(self, round_: int) -> range:
        """The repeats of round `round_` (from 1): each round's numbered on from the round
        before's, `sweep.repeats` (a sequential plan's max) a round."""
        per = self.sweep.exp.sweep.most_repeats
        return range((round_ - 1) * per + 1, round_ * per + 1)

    def points(self, rate: float, prompts: list[Item], round_: int = 1) -> PointJob:
        exp = self.sweep.exp
        return PointJob(
            sc=self.sweep.sc,
            session=self.session,
            client=self.session.client(exp.workload),
            paths=self.sweep.paths,
            workload=exp.workload,
            sweep=exp.sweep,
            telemetry=exp.telemetry,
            prompts=prompts,
            dataset=self.prompts.dataset,
            launch_index=self.launch_index,
            orders={r: [rate] for r in self.repeats(round_)},
            say=self.sweep.say,
            arrivals={rate: self.schedule(rate)},
            gpus=server_gpus(
                exp.runtime.device, self.launch.container, self.launch.env, os.environ
            ),
            search=True,
            replay=self.replay,
        )

    def reach(self) -> str:
        """What the early-stop rule asks of a rate, in words: the requests it needs, all within
        the SLO, to meet it, and the lowest rate whose rounds can send that many."""
        exp = self.sweep.exp
        assert exp.search is not None
        need = min_requests(self.spec.allowed, self.spec.confidence)
        if need is None:
            return "no rate can meet a target of every request (early stopping)"
        per, rounds = exp.sweep.most_repeats, self.spec.max_rounds
        # requests a repeat must send for `rounds` rounds of `per` repeats to reach `need`
        each = math.ceil(need / (per * rounds))
        said = (
            f"a rate meets the SLO only with >= {need} requests, all within it: >= {each} a "
            f"repeat over {rounds} round(s) of {per} repeat(s)"
        )
        if self.replay is not None:
            if self.replay.requests < each:
                return f"{said}; the trace window sends {self.replay.requests}: no rate can"
            return said
        duration = exp.search.arrival.duration_s
        return f"{said}: rates above {(each - 1) / duration:g} req/s"

    def warmup(self) -> None:
        wl = self.sweep.exp.workload
        if wl.warmup.requests:
            self.points(self.spec.start_rate, self.prompts_for(wl.warmup.requests)).warmup(0)

    def measure(self, rate: float, round_: int) -> RateOutcome:
        """Every repeat of one round of one rate (those complete on disk from an earlier run
        are read, not measured again), and their outcomes."""
        self.measured += 1
        exp = self.sweep.exp
        assert exp.search is not None
        n = exp.search.arrival.requests(rate) if self.replay is None else self.replay.requests
        job = self.points(rate, self.prompts_for(n, self.measured), round_)
        outcomes = []
        for rep in self.repeats(round_):
            slot = Slot(rep, Level.at_rate(rate), 0, self.measured - 1)
            if not is_complete(job.folder(slot)):
                job.measure(slot, 0, f"search {self.measured}")
            outcomes.append(self.outcome(job, slot))
        self._note(rate, round_, outcomes)
        return RateOutcome(tuple(outcomes))

    def _note(self, rate: float, round_: int, outcomes: list[RepeatOutcome]) -> None:
        """The round's repeats in the log, each one's attainment (and why it is invalid), and
        the decision over every round of the rate so far."""
        attained = ", ".join(
            ("-" if o.attainment is None else f"{100 * o.attainment:.1f}%")
            + ("" if o.valid else f" (invalid: {'; '.join(o.reasons)})")
            for o in outcomes
        )
        if not any(o.valid for o in outcomes):
            attained += "; no valid repeat"
        seen = self.pooled.setdefault(rate, [])
        seen += outcomes
        d = RateOutcome(tuple(seen)).decide(self.spec.target, self.spec.confidence)
        self.sweep.note(
            f"search: rate {rate:g} req/s, round {round_}: {attained} within the SLO; {d.text()}"
        )

    def outcome(self, job: PointJob, slot: Slot) -> RepeatOutcome:
        """One repeat's attainment and validity, from its raw data."""
        folder = job.folder(slot)
        meta = PointRecord.read(folder / PointRecord.FILE).doc
        paths, sc = self.sweep.paths, self.sweep.sc
        warm = WarmupRecord.read_if_present(paths.search_warmup(sc) / PointRecord.FILE)
        launch = LaunchRecord.read_if_present(paths.search(sc) / LaunchRecord.FILE)
        args = launch.get("args") if launch is not None else None
        raw = RawPoint(meta, folder, args, warm.doc if warm is not None else None)
        records = raw.records()
        flags = check_point(records, meta, self.sweep.exp.analysis.validity, args, raw.warmup)
        bad = failed(flags)
        return RepeatOutcome(
            attainment=slo_attainment(records, self.spec.bounds),
            valid=not bad,
            requests=len(records),
            reasons=tuple(f"{f.check}: {f.reason}" for f in bad),
        )


def run_search(job: MeasureJob, sc: str) -> SearchJson:
    """The SLO capacity search of one server configuration, on a launch of its own;
    raw/<sc>/search/search.json written last. Returns its document."""
    raise_on_signals()
    exp, paths = job.exp, job.paths
    spec = search_spec(exp)
    sweep = SearchJob(job, sc)
    paths.search(sc).mkdir(parents=True, exist_ok=True)
    port = choose_port(exp.server.host, exp.server.port, sweep.note)
    launch = build_launch(job, sc, port=port)
    # numbered after the sweep's launches (and an earlier search's)
    launch_index = max(next_launch_index(sweep.server_dir), next_launch_index(paths.search(sc)))
    t0 = time.monotonic()
    sweep.note(f"SLO capacity search from {spec.start_rate:g} req/s (launch {launch_index})")
    with serve(launch, paths.server_log(sc), exp.server, sweep.note) as session:
        sweep.started(session, launch, port, launch_index)
        measurer = RateMeasurer(sweep, session, launch, launch_index, spec)
        sweep.note(f"search: {measurer.reach()}")
        measurer.warmup()
        result: SearchResult = search_rate(measurer.measure, spec)
    write_search(paths.search_record(sc), result)
    sweep.note(
        f"search: {result.answer.text()} ({len(result.path)} rates, {time.monotonic() - t0:.1f} s)"
    )
    return result.to_json()
