"""The tests' measuring setup in one place: a test config typed as an Experiment, the results
folder it writes into (ExperimentPaths), the model's folder, a runtime record and the output for
progress lines, held as the one MeasureJob the measuring stages take (servelab.job).

`measure_job(cfg, root)` builds it; the `make_job` fixture (conftest.py) builds it under the
test's tmp_path. `capture_job` adds a profile capture's tool and Nsight Systems to it, as
servelab.profile.capture.plan_capture does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from servelab.env.container import Mount
from servelab.experiment import Experiment
from servelab.job import MeasureJob
from servelab.profile.capture import CaptureJob
from servelab.profile.plan import NsysUse
from servelab.store.paths import ExperimentPaths
from servelab.store.records import RuntimeRecord

# the make_job fixture (conftest.py): measure_job with the test's tmp_path as the default root
MakeJob = Callable[..., MeasureJob]


def quiet(line: str) -> None:
    """A `say` that drops every line."""


def measure_job(
    cfg: Experiment | Mapping[str, Any],
    root: Path,
    *,
    model_dir: Path | None = None,
    runtime: Mapping[str, Any] | None = None,
    say: Callable[[str], None] = quiet,
) -> MeasureJob:
    """The measuring job of `cfg` (a validated config dict, or already an Experiment) writing
    into `root`: the model in `model_dir` (default root/model), the runtime record `runtime`
    (default: none of its fields)."""
    exp = cfg if isinstance(cfg, Experiment) else Experiment.from_dict(dict(cfg))
    model = model_dir if model_dir is not None else root / "model"
    return MeasureJob(exp, ExperimentPaths(root), model, RuntimeRecord(dict(runtime or {})), say)


def capture_job(
    job: MeasureJob, sc: str, tool: str, nsys: str | None = None, mount: Mount | None = None
) -> CaptureJob:
    """The capture of `sc` with `tool`, running the Nsight Systems at `nsys` (mounted from the
    host with `mount`), or profile.nsys when None."""
    use = None if nsys is None else NsysUse(nsys, "host" if mount else "image", mount=mount)
    return CaptureJob(job, sc, tool, use)
