"""A sequential sweep (`sweep.repeats: {min, max, budget_s}`): every server configuration
measured round by round until the stopping rule has decided every claim (docs/analysis.md,
"Sequential rounds").

With `interleave: true` every round runs on a fresh launch per configuration, in turn (A B, then
B A); with `side_by_side: true` too, a round's launches are started at once and kept up
together, the round's points alternating between them level by level (`side_by_side`,
docs/analysis.md "Side by side").

A round is one balanced repeat of every point of every server configuration; the Latin or
Williams order continues across rounds (servelab.design.schedule), so the design is balanced at
every stopping point, and a round is never cut short by the rule. The first `min` rounds of a
configuration are measured on one server launch, as a fixed design's repeats; each further
round is measured on a fresh launch per configuration (its points record it as `launch`).
After each round from `min` on, the looks (servelab.analysis.rounds) say which questions are
decided (the claims, with a `reference:` the orderings a reproduction against it will judge,
and the pairs of `analysis.compare` until each is SAME or DIFFERENT at every level and metric,
servelab.analysis.samehost); measuring stops when none is open, at `max`, or when the last
round's time says the next would overrun `budget_s`.

Every run.json of the sweep is written at the end with the same `sequential` record: the
rule and its parameters, the rounds, why it stopped, every look, and every server launch it
started with the round of the look that followed it (launch.json keeps only the latest one;
the end-of-run summary says where each round's time went). A rerun keeps the
completed points and looks again before measuring anything (a new claim can ask for more
rounds; the old ones are not measured again).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from servelab.analysis.dataset import Dataset, load_dataset
from servelab.analysis.groups import Groups
from servelab.analysis.rounds import STOPPED, asked_with, looks, open_claims, round_record
from servelab.analysis.runtimes import runtime_ids, runtime_pairs
from servelab.analysis.samehost import Plan, open_rows, same_host
from servelab.design.schedule import Slot, in_turn
from servelab.design.stopping import StoppingRule
from servelab.documents.declared import (
    ComparedLook,
    RoundLaunch,
    SequentialRecord,
)
from servelab.errors import ServelabError
from servelab.experiment import Experiment
from servelab.job import MeasureJob, Say
from servelab.launch.hostlock import MeasuringLock
from servelab.launch.server import raise_on_signals
from servelab.launch.session import serve_together
from servelab.measure.alternate import alternate
from servelab.measure.sweep import Live, SweepJob, next_launch_index
from servelab.store.records import LaunchRecord

# a point named in a comparison claim
CELL = re.compile(r"config=([^,\]]+),(?:c|rate)=(\d+(?:\.\d+)?)")


def stopping_rule(exp: Experiment) -> StoppingRule:
    """The experiment's stopping rule: its plan, and the analysis's alpha."""
    plan = exp.sweep.rounds
    if plan is None:
        raise ServelabError("sweep.repeats is a number: a fixed design has no stopping rule")
    return StoppingRule(plan.min, plan.max, exp.analysis.alpha, plan.budget_s)


def run_rounds(
    measure_job: MeasureJob, reference_orderings: Sequence[str] = ()
) -> SequentialRecord:
    """Measure every server configuration of the job's experiment round by round until the
    rule stops; write every run.json last; the sequential record. `reference_orderings`: with
    a `reference:`, the orderings a reproduction against it will judge
    (reproduce.reference_orderings, read by the caller); none without one."""
    raise_on_signals()
    exp, paths, say = measure_job.exp, measure_job.paths, measure_job.say
    rule = stopping_rule(exp)
    t_job = time.monotonic()
    jobs = [SweepJob(measure_job, sc) for sc in exp.server.names]
    orderings = questions_of_reference(exp, reference_orderings)
    how = Arrangement.of(exp)
    announce(say, rule, orderings, how)
    asked = asked_with(exp.analysis, orderings)
    interleave = how.interleave
    k = 1 if interleave else rule.min_rounds
    round_s: list[float] = []
    launches: list[RoundLaunch] = []
    slots: dict[str, list[Slot]] = {}
    compared_looks: list[ComparedLook] = []
    t0 = time.monotonic()  # a step's start: rounds 1 to min, then each further round
    while True:
        # the round of the look that follows it: `min` for the first step's rounds
        launches += measure_round(measure_job, jobs, k, max(k, rule.min_rounds), how, slots)
        if k < rule.min_rounds:  # interleaved: the first step's rounds one at a time
            k += 1
            continue
        round_s.append(round(time.monotonic() - t0, 3))
        ds = load_dataset(paths.root, validity=exp.analysis.validity)
        all_looks = looks(ds, asked, rule, k)
        row = all_looks[-1]
        compared, asked_pairs = compared_open(exp, ds, rule, interleave)
        if asked_pairs:
            compared_looks.append({"round": k, "asked": asked_pairs, "open": len(compared)})
        still = open_claims(row) + compared
        say(
            f"look after round {k}: {len(row) + asked_pairs - len(still)} of "
            f"{len(row) + asked_pairs} questions decided"
            + (f"; open: {'; '.join(still)}" if still else "")
        )
        if not still:
            stopped = "decided"
        elif k >= rule.max_rounds:
            stopped = "maximum"
        elif _overruns(rule, t_job, round_s):
            stopped = "budget"
        else:
            k += 1
            t0 = time.monotonic()
            continue
        break
    say(f"stopped after round {k}: {STOPPED[stopped]}")
    record: SequentialRecord = {
        "rule": rule.to_json(),
        "rounds": k,
        "stopped": stopped,
        "round_s": round_s,
        "launches": launches,
        "orderings": orderings,
        "looks": [round_record(j, r, orderings) for j, r in enumerate(all_looks, rule.min_rounds)],
        "compared": compared_looks,
        "side_by_side": how.side_by_side,
    }
    wall = time.monotonic() - t_job
    for job in jobs:
        job.write_run(slots[job.sc], wall, sequential=record)
    return record


@dataclass(frozen=True)
class Arrangement:
    """How a sequential plan's rounds meet the server launches: `interleave`, every round on
    a fresh launch per configuration, in turn; `side_by_side`, those launches up together."""

    interleave: bool
    side_by_side: bool

    @classmethod
    def of(cls, exp: Experiment) -> Arrangement:
        plan = exp.sweep.rounds
        interleave = bool(plan and plan.interleave)
        return cls(interleave, interleave and bool(plan and plan.side_by_side))


def announce(say: Say, rule: StoppingRule, orderings: Sequence[str], how: Arrangement) -> None:
    """The plan, said before its first round: the rule, the orderings asked, the launches."""
    say(
        f"sequential sweep: rounds {rule.min_rounds} to {rule.max_rounds}, alpha "
        f"{rule.alpha:g} spent over {rule.looks} looks ({rule.look_alpha(rule.min_rounds):.4g} "
        f"each)" + (f", budget {rule.budget_s:g} s" if rule.budget_s else "")
    )
    if orderings:
        said = "; ".join(orderings)
        say(f"and the {len(orderings)} orderings the reproduction will judge: {said}")
    if how.side_by_side:
        say(
            "side by side: every round on a fresh launch of each configuration, all up at once, "
            "their points alternating level by level"
        )
    elif how.interleave:
        say("interleaved: every round on a fresh launch per configuration, in turn")


def measure_round(
    measure_job: MeasureJob,
    jobs: list[SweepJob],
    k: int,
    look_round: int,
    how: Arrangement,
    slots: dict[str, list[Slot]],
) -> list[RoundLaunch]:
    """Measure what rounds 1..k still lack of every configuration (in turn, or side by side),
    each configuration's plan into `slots`; the launches it started, recorded with the round
    of the look that follows them (`look_round`)."""
    turn = in_turn(jobs, k) if how.interleave else jobs
    firsts = {job.sc: next_launch_index(job.server_dir) for job in jobs}
    if how.side_by_side:
        slots |= side_by_side(measure_job, turn, k)
    else:
        for job in turn:
            slots[job.sc] = job.measure_missing(k)
    return [launch for job in turn for launch in launched(job, firsts[job.sc], look_round)]


def compared_open(
    exp: Experiment, ds: Dataset, rule: StoppingRule, interleave: bool
) -> tuple[list[str], int]:
    """The rows still UNKNOWN at this look, and how many rows are asked: those of
    `analysis.compare` (a rerun's or a bisection step's questions, which name what is asked);
    without any, where configurations ran on different runtimes, those of "Runtimes compared"
    (a version A/B's), in the family the report answers them in; each row open until SAME or
    DIFFERENT."""
    a = exp.analysis
    # the pairs runtimes_compared asks, in its order of the configurations
    pairs = list(a.compare) or runtime_pairs(runtime_ids(ds, list(Groups(ds).configs)))
    doc = same_host(ds, pairs, a.margin_pct, a.alpha, Plan(rule.looks, interleave))
    return open_rows(doc), sum(len(p["rows"]) for p in doc["pairs"]) if doc else 0


def side_by_side(measure_job: MeasureJob, jobs: list[SweepJob], k: int) -> dict[str, list[Slot]]:
    """Round k of a side-by-side plan: a fresh server of every configuration with a point of
    the round still to measure, started at once (servelab.launch.session.serve_together) and
    kept up together; the round's points alternate between them level by level, in the
    round's balanced order (`jobs` first at the first level, reversed at the next, and so on),
    so that the points a comparison pairs are measured seconds apart; then each launch's
    points a host check found disturbed are measured again. Every configuration's plan."""
    planned = {job.sc: job.missing(k) for job in jobs}
    active = [job for job in jobs if planned[job.sc][2]]
    slices = (measure_job.exp.sweep.rounds.slices or 1) if measure_job.exp.sweep.rounds else 1
    if active:
        exp = measure_job.exp
        # held over the host canaries before and after the launches too (SweepJob.measure)
        with MeasuringLock(exp.server.lock_timeout_s, measure_job.say) as lock:
            starts = [job.prepare(next_launch_index(job.server_dir)) for job in active]
            logs = [job.paths.server_log(job.sc) for job in active]
            where = [(st.launch, log) for st, log in zip(starts, logs, strict=True)]
            with serve_together(where, exp.server, measure_job.say, lock=lock) as sessions:
                lives = [
                    job.on_launch(session, st, planned[job.sc][0], planned[job.sc][1])
                    for job, st, session in zip(active, starts, sessions, strict=True)
                ]
                measure_side_by_side(lives, planned, slices)
            for live in lives:
                live.job.stopped(live)
    return {sc: plan[0] for sc, plan in planned.items()}


def measure_side_by_side(
    lives: list[Live], planned: dict[str, tuple[list[Slot], list[Slot], bool]], slices: int
) -> None:
    """The points of a side-by-side round on its launches, position by position, each
    launch's position in the round's balanced turn; then each launch's points a host check
    found disturbed measured again."""
    todo = {live.job.sc: planned[live.job.sc][1] for live in lives}
    n = max(len(t) for t in todo.values())
    for p in range(n):
        here = [live for live in in_turn(lives, p + 1) if p < len(todo[live.job.sc])]
        slots = [todo[live.job.sc][p] for live in here]
        measure_level(here, slots, f"{p + 1}/{n}", slices)
    for live in lives:
        live.finish()


def measure_level(here: list[Live], slots: list[Slot], progress: str, slices: int) -> None:
    """The points at one position of a side-by-side round, one per launch in `here` (in the
    position's turn): one after another, or, with `slices` > 1 and the same level on every
    side, in slices that alternate between the servers (servelab.measure.alternate)."""
    if slices > 1 and len(here) > 1 and len({slot.level for slot in slots}) == 1:
        pids = [live.pid() for live in here]
        points = [
            live.open(slot, tuple(q for q in pids if q is not None and q != pids[i]))
            for i, (live, slot) in enumerate(zip(here, slots, strict=True))
        ]
        alternate(points, slices, progress)
        return
    for live, slot in zip(here, slots, strict=True):
        live.measure(slot, progress)


def launched(job: SweepJob, first: int, k: int) -> list[RoundLaunch]:
    """The server launch the job started in the step of rounds that ends at round k, if it
    started one (launch.json's index from `first` on): its round, configuration, index, start
    (`ready_s`) and wait for the measuring-server lock. launch.json keeps the latest launch
    alone; the sequential record keeps every one, for the end-of-run summary."""
    record = LaunchRecord.read_if_present(job.paths.launch(job.sc))
    if record is None or record.launch < first:
        return []  # every point of the step was already complete: no launch
    return [
        {
            "round": k,
            "server_config": job.sc,
            "launch": record.launch,
            "ready_s": record.ready_s,
            "lock_waited_s": round(record.lock_waited_s, 3),
        }
    ]


def questions_of_reference(exp: Experiment, orderings: Sequence[str]) -> list[str]:
    """Of the orderings a reproduction against the reference will judge (comparison claims),
    those of points this experiment measures and that its claims do not already ask."""
    measured = {(sc, c) for sc in exp.server.names for c in exp.sweep.levels}
    out: list[str] = []
    for q in orderings:
        cells = {(sc, float(c)) for sc, c in CELL.findall(q)}
        if cells <= measured and q not in exp.analysis.claims and q not in out:
            out.append(q)
    return out


def _overruns(rule: StoppingRule, t_job: float, round_s: list[float]) -> bool:
    """Whether one more round would end past the rule's budget (never without one), at the
    last step's time per round (the first step measured `min` rounds at once)."""
    if rule.budget_s is None:
        return False
    per_round = round_s[-1] / (rule.min_rounds if len(round_s) == 1 else 1)
    return time.monotonic() - t_job + per_round > rule.budget_s
