"""A measuring job's context: what every stage that starts a server (the sweep, the sequential
rounds, the profile capture) and what it launches (servelab.launch.session,
servelab.env.container) is given together.

`MeasureJob` holds the experiment, its results folders, the model's folder, the runtime record
(runtime.json, servelab.store.records.RuntimeRecord) and where progress lines go. A job on one
server configuration names it beside the context: `build_launch(job, sc, ...)`, or a `ConfigJob`
(the sweep's SweepJob, the profile capture's CaptureJob) that holds both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from servelab.experiment import Experiment
from servelab.store.paths import ExperimentPaths
from servelab.store.records import RuntimeRecord

Say = Callable[[str], None]


@dataclass(frozen=True)
class MeasureJob:
    """What a measuring job works with: the experiment and its folders, the model it serves,
    the runtime it serves it with, and the output for its progress lines."""

    exp: Experiment
    paths: ExperimentPaths
    model_dir: Path  # the model's local folder (servelab.env.model.model_dir)
    runtime: RuntimeRecord  # runtime.json: kind, python, image_ref, vllm_cli, ...
    say: Say = print
    # the records of the configurations with a runtime of their own (server.configs[].runtime),
    # by configuration: runtime/<sc>/runtime.json
    own_runtimes: Mapping[str, RuntimeRecord] = field(default_factory=dict)

    def runtime_of(self, sc: str) -> RuntimeRecord:
        """The runtime record server configuration `sc` runs in."""
        return self.own_runtimes.get(sc, self.runtime)


@dataclass(frozen=True)
class ConfigJob:
    """A measuring job on one of its experiment's server configurations (`sc`): what the sweep
    job and the capture job of a configuration share."""

    job: MeasureJob
    sc: str

    @property
    def exp(self) -> Experiment:
        return self.job.exp

    @property
    def paths(self) -> ExperimentPaths:
        return self.job.paths

    @property
    def model_dir(self) -> Path:
        return self.job.model_dir

    @property
    def runtime(self) -> RuntimeRecord:
        return self.job.runtime_of(self.sc)

    @property
    def say(self) -> Say:
        return self.job.say
