"""Side-by-side rounds (sweep.repeats.side_by_side): every configuration's server of a round up
at once, the round's points alternating between them level by level, the starts overlapping.
The loop (servelab.measure.sequential.side_by_side) is driven with the server and the points
stubbed on a fake clock, so the order of every point and every second of the summary is known;
the overlapping wait (servelab.launch.server.wait_all_ready) with servers that answer after a
known number of looks; the config's refusals and the rerun's default on their own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from analysis_fixtures import servelab_point
from experiment_fixtures import measure_job
from test_rounds import CLEAR, MEANS, NULL, experiment
from test_summary_rounds import READY, Clock, breakdown

from servelab.config import validate
from servelab.design.schedule import Slot
from servelab.errors import ServelabError
from servelab.launch import server as server_mod
from servelab.measure import sequential as rounds_mod
from servelab.measure.sweep import Live, Start, SweepJob
from servelab.reproduce import rerun as rerun_mod
from servelab.store.jsonio import write_json
from servelab.store.records import LaunchRecord

OTHER_S = 5.0  # per round: prompts, warm-ups, shutdowns


class FakeLive:
    """A launch that is up (SweepJob.on_launch, stubbed): each point measured is written with
    MEANS' throughput and its launch, and appended to `order`; the clock moves by its
    duration."""

    def __init__(
        self, job: SweepJob, start: Start, order: list[tuple[str, int, int]], clock: Clock
    ):
        self.job, self.start, self.order, self.clock = job, start, order, clock
        self.finished = False

    def measure(self, slot: Slot, label: str) -> None:
        sc, root, c = self.job.sc, self.job.paths.root, int(slot.level.value)
        point = servelab_point(root, sc, slot.repeat, c, MEANS[(sc, c)], 100.0)
        folder = root / "raw" / sc / f"rep{slot.repeat:02d}" / f"c{c:04d}"
        write_json(folder / "point.json", {**point, "launch": self.start.index})
        self.order.append((sc, slot.repeat, c))
        self.clock.now += point["duration"]

    def finish(self) -> None:
        self.finished = True


def stub_side_by_side(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, *, own_runtimes: bool = False
) -> tuple[list[tuple[str, int, int]], list[list[str]]]:
    """The servers and the points stubbed: `prepare` writes the launch's launch.json (READY's
    start), `serve_together` (handed the measuring-server lock, held) moves the clock by the longest start of the servers it starts at
    once (recorded in `together`), each point by its duration. The order the points were
    measured in, and which servers were up together. `own_runtimes`: each configuration's
    launches record a lock of its own, as two vLLM releases' would."""
    order: list[tuple[str, int, int]] = []
    together: list[list[str]] = []
    index: dict[str, int] = {}  # each configuration's launch being started

    def prepare(job: SweepJob, launch_index: int) -> Start:
        index[job.sc] = launch_index
        LaunchRecord.new(
            {
                "launch": launch_index,
                "server_config": job.sc,
                "command": ["vllm", "serve"],
                "env": {},
                "args": {},
                "port": 8000,
                "started_epoch_ns": 0,
                "ready_s": READY[(job.sc, launch_index)],
                "lock": {"path": "/l", "waited_s": 0.0, "holder": None},
                "runtime_lock_sha256": f"lock-of-{job.sc}" if own_runtimes else "one-lock",
            }
        ).write(job.paths.launch(job.sc))
        # the stub's launch is its configuration's name
        return Start(job.sc, 8000, launch_index, None, None, clock.now)  # type: ignore[arg-type]

    @contextmanager
    def serve_together(
        starts: Any, settings: Any, say: Any, *, lock: Any = None
    ) -> Iterator[list[str]]:
        # handed the measuring-server lock held since before the host canaries of the round
        assert lock is not None and lock.held
        names = [sc for sc, _ in starts]
        together.append(names)
        clock.now += max(READY[(sc, index[sc])] for sc in names) + OTHER_S
        yield names

    def on_launch(job: SweepJob, session: Any, start: Start, slots: Any, todo: Any) -> Live:
        return FakeLive(job, start, order, clock)  # type: ignore[return-value]

    monkeypatch.setattr(SweepJob, "prepare", prepare)
    monkeypatch.setattr(SweepJob, "on_launch", on_launch)
    monkeypatch.setattr(SweepJob, "stopped", lambda job, live: None)
    monkeypatch.setattr(rounds_mod, "serve_together", serve_together)
    monkeypatch.setattr(rounds_mod, "time", clock)
    return order, together


def test_a_round_keeps_both_servers_up_and_alternates_their_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every round starts a fresh server of a and b at once; at each level of the round's
    balanced order both are measured back to back, the first of the pair flipping level by
    level and round by round (a b, b a in round 1; b a, a b in round 2), so that neither side
    is always measured first and each pair is seconds apart."""
    order, together = stub_side_by_side(monkeypatch, Clock())
    exp = experiment(tmp_path, [CLEAR, NULL], interleave=True, side_by_side=True)
    job = measure_job(exp, tmp_path / "seq", model_dir=tmp_path)
    rec = rounds_mod.run_rounds(job)
    assert rec["side_by_side"] is True and rec["rounds"] == 5
    assert together == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"], ["a", "b"]]
    first_of_pair = [order[i][0] for i in range(0, len(order), 2)]
    pairs = [(order[i], order[i + 1]) for i in range(0, len(order), 2)]
    # the two points of a pair: the same round and level, one of each side
    assert all(x[1:] == y[1:] and {x[0], y[0]} == {"a", "b"} for x, y in pairs)
    assert first_of_pair == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]
    assert [(x["round"], x["server_config"], x["launch"]) for x in rec["launches"]] == [
        (3, "a", 1), (3, "b", 1), (3, "b", 2), (3, "a", 2), (3, "a", 3), (3, "b", 3),
        (4, "b", 4), (4, "a", 4), (5, "a", 5), (5, "b", 5),
    ]  # fmt: skip


def test_the_summary_counts_overlapping_starts_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Side by side, a round's two starts overlap: the summary's step of rounds 1-3 counts
    the longest start of each pair (31.5 + 21.0 + 19.5 s), not their sum (140.5 s), and says
    the starts were side by side."""
    stub_side_by_side(monkeypatch, Clock())
    exp = experiment(tmp_path, [CLEAR, NULL], interleave=True, side_by_side=True)
    job = measure_job(exp, tmp_path / "seq", model_dir=tmp_path)
    rec = rounds_mod.run_rounds(job)
    (job.paths.root / "benchmarks").mkdir()
    sweep_s = sum(rec["round_s"]) + 7.0
    (job.paths.root / "benchmarks" / "sweep.tsv").write_text(f"s\th:m:s\n{sweep_s}\t0:00:00\n")
    (step,) = [ln for ln in breakdown(job.paths.root) if ln.strip().startswith("rounds 1-3")]
    assert "6 server starts side by side 72.0 s" in step, step


def test_the_looks_count_the_compared_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pair of analysis.compare is asked at every look beside the claims: the record keeps
    how many rows it asked and how many were UNKNOWN, and the summary counts them among the
    questions (a rerun has no claims: before, its looks said "0 of 0 questions")."""
    stub_side_by_side(monkeypatch, Clock())
    exp = experiment(tmp_path, [], interleave=True, side_by_side=True)
    cfg = exp.to_dict()
    cfg["analysis"]["compare"] = [{"a": "a", "b": "b"}]
    exp = validate(cfg)
    job = measure_job(exp, tmp_path / "seq", model_dir=tmp_path)
    rec = rounds_mod.run_rounds(job)
    assert [c["round"] for c in rec["compared"]] == list(range(3, rec["rounds"] + 1))
    assert all(c["asked"] == 6 for c in rec["compared"])  # 2 levels x 3 metrics
    (job.paths.root / "benchmarks").mkdir()
    (job.paths.root / "benchmarks" / "sweep.tsv").write_text("s\th:m:s\n500\t0:00:00\n")
    lines = breakdown(job.paths.root)
    (step,) = [ln for ln in lines if ln.strip().startswith("rounds 1-3")]
    assert "of 6 questions decided" in step, step


def test_two_runtimes_keep_the_rounds_going_until_their_rows_are_decided(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Configurations on different runtimes (a version A/B) are compared in "Runtimes
    compared" without an analysis.compare entry: the looks ask those rows too, so the plan
    measures on while any is UNKNOWN rather than stopping once the claims are decided. With
    analysis.compare (a bisection step asks one metric), its rows alone are asked."""
    stub_side_by_side(monkeypatch, Clock(), own_runtimes=True)
    exp = experiment(tmp_path, [CLEAR], interleave=True, side_by_side=True)
    job = measure_job(exp, tmp_path / "seq", model_dir=tmp_path)
    rec = rounds_mod.run_rounds(job)
    assert rec["compared"] and all(c["asked"] == 6 for c in rec["compared"])
    # a's throughput is twice b's in every round (MEANS): DIFFERENT at both levels at once,
    # and TTFT and TPOT with it, so the plan stops at the first look that decides them all
    last = rec["compared"][-1]
    assert (last["open"] == 0) == (rec["stopped"] == "decided"), rec

    cfg = experiment(tmp_path, [CLEAR], interleave=True, side_by_side=True).to_dict()
    cfg["analysis"]["compare"] = [{"a": "a", "b": "b", "metrics": ["output_throughput"]}]
    job = measure_job(validate(cfg), tmp_path / "step", model_dir=tmp_path)
    rec = rounds_mod.run_rounds(job)
    assert rec["compared"] and all(c["asked"] == 2 for c in rec["compared"])  # 2 levels


def test_side_by_side_is_refused_where_it_cannot_run() -> None:
    """Without interleave, and on a GPU runtime (two servers would share its memory): one line
    naming the key and what to set."""
    base = experiment(Path("/tmp/unused"), [], interleave=True, side_by_side=True).to_dict()
    cfg = {
        **base,
        "sweep": {**base["sweep"], "repeats": {"min": 3, "max": 5, "side_by_side": True}},
    }
    with pytest.raises(ServelabError, match=r"side_by_side needs interleave: true") as e:
        validate(cfg)
    assert "\n" not in str(e.value)
    gpu = {**base, "runtime": {**base["runtime"], "device": "gpu"}}
    with pytest.raises(ServelabError, match=r"side_by_side: false") as e:
        validate(gpu)
    assert "GPU" in str(e.value) and "\n" not in str(e.value)


class SlowServer:
    """A server that answers /health at its `ready_at`-th look (Server.ready_now's stand-in)."""

    def __init__(self, ready_at: int) -> None:
        self.ready_at, self.looks = ready_at, 0

    def ready_now(self, t0: float, timeout_s: float) -> float | None:
        self.looks += 1
        return float(self.looks) if self.looks >= self.ready_at else None


def test_overlapping_starts_are_each_waited_for_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """wait_all_ready looks at every server still starting in each pass, so a server ready
    first is seen ready at its own time (not after the slower one), and a ready one is not
    looked at again."""
    monkeypatch.setattr(server_mod.time, "sleep", lambda s: None)
    fast, slow = SlowServer(2), SlowServer(5)
    waited = server_mod.wait_all_ready([slow, fast], 60, lambda s: None)  # type: ignore[list-item]
    assert waited == [5.0, 2.0]
    assert (fast.looks, slow.looks) == (2, 5)


def test_a_rerun_measures_side_by_side_where_memory_holds_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two CPU servers of 1 GiB of KV cache each need 2 x (1 + 2) GiB: with 8 GiB available
    the rerun's default is side by side, with 4 GiB one server at a time."""
    runtime = {"device": "cpu", "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}}
    monkeypatch.setattr(rerun_mod, "available_memory_bytes", lambda: 8 * 2**30)
    assert rerun_mod.memory_holds(runtime, 2)
    monkeypatch.setattr(rerun_mod, "available_memory_bytes", lambda: 4 * 2**30)
    assert not rerun_mod.memory_holds(runtime, 2)
    monkeypatch.setattr(rerun_mod, "available_memory_bytes", lambda: None)
    assert not rerun_mod.memory_holds(runtime, 2)
