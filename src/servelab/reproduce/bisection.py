"""`servelab bisect`: run a bisection (servelab.analysis.bisect) step by step on this host.

An experiment config with a `bisect:` section (docs/reproduce.md, "Bisect across releases")
names the ordered setups, the good and bad ends and the metric. Each step is an experiment of
its own, derived from that config by `step_config`: two server configurations, the good end and
the setup under test, each with its own runtime (lock or image) and arguments laid over the
experiment's, measured at one level in a sequential, interleaved plan that stops once the
metric is SAME or DIFFERENT (`analysis.compare` with that metric alone), or at the plan's `max`
rounds. The step's answer is read from its `analysis/same_host.json`; its run, bundle and
report stay in `results/<experiment>-<NN>-<setup>/`. The chain is written to
`results/<experiment>/bisection/` (bisection.json, report.md) with each step's experiment.

A step whose results already hold a same_host.json is not measured again (snakemake sees its
outputs up to date), so an interrupted bisection resumes where it stopped.
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import cast

import yaml

from servelab.analysis.bisect import (
    BisectionJson,
    BisectQuestion,
    StepAnswer,
    bisect,
    bisection_section,
)
from servelab.errors import ServelabError
from servelab.experiment import BisectSection, BisectVersion, Experiment
from servelab.reproduce.rerun import Runtime
from servelab.reproduce.sides import ResolvedConfig, ServerConfigJson
from servelab.store.jsonio import read_json, write_json
from servelab.store.paths import SAME_HOST_TABLE

DEFAULT_ROUNDS = (3, 6)
# runs one step's config file; returns the exit code (the workflow's, normally snakemake)
Runner = Callable[[Path], int]


def question(exp: Experiment) -> BisectQuestion:
    """The bisection the experiment asks, its ends and level checked, in one line each."""
    b = exp.bisect
    if b is None:
        raise ServelabError(f"{exp.name}: the config has no bisect: section; add one")
    names = [v.name for v in b.versions]
    if len(set(names)) != len(names):
        raise ServelabError(f"bisect.versions: {names} repeats a name; give each setup its own")
    for key, name in (("good", b.good), ("bad", b.bad)):
        if name not in names:
            raise ServelabError(f"bisect.{key}: {name!r} is not one of bisect.versions {names}")
    good, bad = b.index(b.good), b.index(b.bad)
    if good >= bad:
        raise ServelabError(
            f"bisect.good: {b.good} is not before bisect.bad {b.bad} in bisect.versions; list "
            "the setups oldest first"
        )
    return BisectQuestion(
        tuple(names), good, bad, b.metric, level_of(exp, b), exp.analysis.margin_pct, b.check_bad
    )


def level_of(exp: Experiment, b: BisectSection) -> float:
    levels = [float(x) for x in exp.sweep.levels]
    if b.level is None:
        if not levels:
            raise ServelabError("bisect.level: null, and the sweep names no level; give one")
        return max(levels)
    return float(b.level)


def _own(v: BisectVersion, rt: Mapping[str, object]) -> ServerConfigJson:
    """A setup as a server configuration of a step: its name, arguments and runtime (only
    where it differs from the experiment's, `rt`)."""
    entry: ServerConfigJson = {"name": v.name, "args": dict(v.args)}
    if v.lock is not None and v.lock != rt.get("lock"):
        entry["runtime"] = Runtime(lock=v.lock).as_config()
    elif v.image is not None and v.image != rt.get("image"):
        entry["runtime"] = Runtime(image=v.image, image_sha256=v.image_sha256).as_config()
    return entry


def step_name(exp: Experiment, q: BisectQuestion, index: int) -> str:
    return f"{exp.name}-{index:02d}-{q.versions[index]}"


def step_config(exp: Experiment, q: BisectQuestion, index: int) -> dict[str, object]:
    """The experiment of the step measuring setup `index` against the good end."""
    b = exp.bisect
    assert b is not None
    base = cast(ResolvedConfig, copy.deepcopy(exp.to_dict()))  # resolved: the schema's
    good, other = b.versions[q.good], b.versions[index]
    plan = exp.sweep.rounds
    lo, hi = (plan.min, plan.max) if plan is not None else DEFAULT_ROUNDS
    axis = exp.sweep.axis
    level = int(q.level) if axis == "concurrency" else q.level
    base.pop("bisect", None)
    analysis: dict[str, object] = {
        **base["analysis"],
        "claims": [],
        "pairs": [],
        "compare": [{"a": good.name, "b": other.name, "metrics": [q.metric]}],
    }
    return {
        **base,
        "experiment": step_name(exp, q, index),
        "server": {**base["server"], "configs": [_own(v, base["runtime"]) for v in (good, other)]},
        "sweep": {
            **{k: v for k, v in base["sweep"].items() if k not in ("concurrency", "rate")},
            axis: [level],
            "repeats": {
                "min": lo,
                "max": hi,
                "interleave": True,
                "side_by_side": bool(plan is not None and plan.side_by_side),
                "slices": plan.slices if plan is not None else None,
            },
        },
        "analysis": analysis,
        "profile": {**base["profile"], "enabled": False},
        "reference": None,
    }


def read_step(root: Path, q: BisectQuestion, index: int, wall_s: float | None) -> StepAnswer:
    """The step's answer from its analysis (same_host.json), one line if it has none."""
    table = root / "analysis" / SAME_HOST_TABLE
    if not table.is_file():
        raise ServelabError(
            f"{table}: missing; the step of {q.versions[index]} did not finish (see its log)"
        )
    doc = read_json(table)
    rows = [r for p in doc["pairs"] for r in p["rows"] if r["metric"] == q.metric]
    row = next((r for r in rows if math.isclose(float(r["level"]), q.level)), None)
    if row is None:
        raise ServelabError(f"{table}: no row for {q.metric} at {q.level:g}")
    return StepAnswer(
        row["word"],
        row["direction"],
        row["speed"],
        row["low"],
        row["high"],
        int(row["n"]),
        root.name,
        row["rounds_needed"],
        wall_s,
        _windows(root),
    )


def _windows(root: Path) -> float | None:
    import csv

    points = root / "analysis" / "points.csv"
    if not points.is_file():
        return None
    with points.open(newline="", encoding="utf-8") as fh:
        return round(sum(float(r["duration"] or 0) for r in csv.DictReader(fh)), 3)


def snakemake_runner(cores: str) -> Runner:
    def run(cfg: Path) -> int:
        cmd = ["snakemake", "--cores", cores, "--configfile", str(cfg)]
        print(f"bisect: {' '.join(cmd)}", flush=True)
        return subprocess.run(cmd, check=False).returncode

    return run


def run_bisection(exp: Experiment, runner: Runner, say: Callable[[str], None]) -> BisectionJson:
    """Every step, measured through `runner`, and the chain written under
    results/<experiment>/bisection/."""
    q = question(exp)
    results = Path(exp.results_dir)

    def step(index: int) -> StepAnswer:
        name = step_name(exp, q, index)
        root = results / name
        root.mkdir(parents=True, exist_ok=True)
        cfg = root / "bisect-step.yaml"
        cfg.write_text(yaml.safe_dump(step_config(exp, q, index), sort_keys=False), "utf-8")
        say(f"step: {q.versions[index]} against {q.versions[q.good]} ({name})")
        t0 = time.monotonic()
        code = runner(cfg)
        if code != 0:
            raise ServelabError(
                f"{cfg}: the step's run failed (exit {code}); it keeps what it measured: fix "
                "the cause and run servelab bisect again to resume"
            )
        answer = read_step(root, q, index, round(time.monotonic() - t0, 1))
        say(f"step: {q.versions[index]}: {answer.word}" + _dir(answer))
        return answer

    doc = bisect(q, step)
    out = results / exp.name / "bisection"
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "bisection.json", doc)
    (out / "report.md").write_text("\n".join(bisection_section(doc)) + "\n", encoding="utf-8")
    return doc


def _dir(a: StepAnswer) -> str:
    out = f" ({a.direction})" if a.direction else ""
    if a.speed is not None and a.low is not None and a.high is not None:
        out += f", {a.speed:.3f} [{a.low:.3f}, {a.high:.3f}] in {a.rounds} rounds"
    return out


def main_say(line: str) -> None:
    print(f"bisect: {line}", file=sys.stdout, flush=True)
