"""The thin layer between a Snakemake `script:` and the library.

`job(snakemake, stage)` sends progress to the terminal and to the rule's log, times the stage,
and turns an expected error (ServelabError) into one clear line instead of a traceback.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, TextIO

from servelab.documents import JsonValue
from servelab.env.model import model_dir
from servelab.errors import ServelabError
from servelab.experiment import Experiment
from servelab.job import MeasureJob
from servelab.store.paths import ExperimentPaths
from servelab.store.records import RuntimeRecord

WATCH_INTERVAL_S = 1.0


class Named(Protocol):
    """A rule's params or input files (a Snakemake named list): each entry by its name."""

    def __getattr__(self, name: str) -> str: ...


class Snakemake(Protocol):
    """What servelab reads of a `script:` job's `snakemake` object: the workflow's validated
    config, the rule's params and input files by name, and its log files."""

    config: Mapping[str, JsonValue]
    params: Named
    input: Named
    log: Sequence[str]


def _workflow_ancestor() -> int | None:
    """The pid of the snakemake process that runs this job (None when there is none)."""
    import psutil

    proc = psutil.Process().parent()
    while proc is not None:
        try:
            if any("snakemake" in part for part in proc.cmdline()[:2]):
                return int(proc.pid)
            proc = proc.parent()
        except psutil.Error:
            return None
    return None


def die_with_workflow() -> None:
    """SIGTERM this job when the snakemake process that started it is gone (killed, even with
    SIGKILL), so a job never runs on, or leaves a server behind, without its workflow."""
    import os
    import signal
    import threading

    import psutil

    pid = _workflow_ancestor()
    if pid is None:
        return

    def alive() -> bool:
        try:  # a killed workflow may linger as a zombie until its own parent reaps it
            return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    def watch() -> None:
        while alive():
            time.sleep(WATCH_INTERVAL_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="servelab-watch-workflow", daemon=True).start()


class _Tee:
    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def __call__(self, line: str) -> None:
        for s in self.streams:
            s.write(line + "\n")
            s.flush()


def experiment(smk: Snakemake) -> tuple[Experiment, ExperimentPaths]:
    """The typed experiment (built from the workflow's validated config) and its folders
    (the rule's `params.exp`)."""
    return Experiment.from_dict(smk.config), ExperimentPaths(Path(smk.params.exp))


def measure_job(smk: Snakemake, say: Callable[[str], None]) -> MeasureJob:
    """A measuring rule's job: the experiment and its folders, the model's folder
    (`input.model`), the runtime record (`input.runtime`, runtime.json), those of the
    configurations with their own runtime (`input.config_runtimes`, runtime/<sc>/runtime.json)
    and `say`."""
    exp, paths = experiment(smk)
    model = model_dir(Path(smk.input.model))
    own = {
        Path(p).parent.name: RuntimeRecord.read(Path(p))
        for p in getattr(smk.input, "config_runtimes", [])
    }
    runtime = RuntimeRecord.read(Path(smk.input.runtime))
    return MeasureJob(exp, paths, model, runtime, say, own_runtimes=own)


@contextmanager
def job(smk: Snakemake, stage: str) -> Iterator[Callable[[str], None]]:
    log_path = smk.log[0] if len(smk.log) else None
    log: TextIO = open(log_path, "w", encoding="utf-8") if log_path else sys.stderr  # noqa: SIM115
    say = _Tee(sys.stdout, log) if log_path else _Tee(sys.stdout)
    t0 = time.monotonic()
    die_with_workflow()
    say(f"== {stage}: started")
    try:
        yield say
    except ServelabError as exc:
        say(f"== {stage}: FAILED after {time.monotonic() - t0:.1f} s")
        msg = f"servelab error ({stage}): {exc}"
        log.write(msg + "\n")
        sys.stderr.write(msg + "\n")
        log.flush()
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        say(f"== {stage}: interrupted after {time.monotonic() - t0:.1f} s")
        raise SystemExit(130) from None
    except BaseException:
        log.write(traceback.format_exc())
        log.flush()
        raise
    else:
        say(f"== {stage}: done in {time.monotonic() - t0:.1f} s")
    finally:
        if log_path:
            log.close()
