"""The GPU host-speed canary (servelab.hostfacts.gpucanary) run in a server launch's runtime:
with the launch's Python (a venv) or in its image (`<engine> run`, as the runtime stage's GPU
pre-flight runs its probe), with the server's GPUs and environment, but no published port and a
container name of its own."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace

from servelab.hostfacts.gpucanary import (
    GpuAbsent,
    GpuCanary,
    GpuMeasure,
    GpuWork,
    Runner,
    measure_gpu,
    script_args,
)
from servelab.launch.server import ServerLaunch


def gpu_canary_command(launch: ServerLaunch, work: GpuWork) -> tuple[list[str], dict[str, str]]:
    """The command that times the GPU canary where `launch` runs its server, and its whole
    environment (this process's, the launch's variables on top)."""
    env = {**launch.env, "PYTHONUNBUFFERED": "1"}
    if launch.container is None:
        return [launch.python, *script_args(work)], {**os.environ, **env}
    c = replace(
        launch.container,
        name=f"{launch.container.name}-canary",
        env_names=tuple(sorted(env)),
    )
    cmd = c.run_command(["python3", *script_args(work)], "", 0)
    return cmd, {**os.environ, **c.process_env(env)}


def gpu_canary(
    launch: ServerLaunch,
    device: str,
    work: GpuWork | None = None,
    run: Runner = subprocess.run,
) -> GpuMeasure | None:
    """How a sweep job times the GPU canary around `launch`: None on a CPU runtime (device
    "cpu") and for a server servelab did not launch (an endpoint: no runtime to run it in)."""
    if device != "gpu" or launch.endpoint is not None:
        return None
    done = work or GpuWork()

    def measure() -> GpuCanary | GpuAbsent:
        cmd, env = gpu_canary_command(launch, done)
        return measure_gpu(cmd, env, done, run)

    return measure
