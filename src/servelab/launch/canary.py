"""The GPU host-speed canary (servelab.hostfacts.gpucanary) run in a server launch's runtime:
with the launch's Python (a venv) or in its image (`<engine> run`, as the runtime stage's GPU
pre-flight runs its probe), with the server's GPUs and environment, but no published port and a
container name of its own (`<server's container name>-canary`).

In a docker or podman container, what a killed job may have left on the GPU is removed by name
before the canary is timed: a container of the server's name and one of the canary's. A canary
that gives no answer in time has its container removed too: killing the engine's client does
not stop the container. The sweep times the canary while it holds the host's measuring-server
lock (servelab.measure.sweep), so no other measuring server shares the GPU meanwhile.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace

from servelab.env.container import ContainerRun
from servelab.hostfacts.gpucanary import (
    GpuAbsent,
    GpuCanary,
    GpuMeasure,
    GpuWork,
    Runner,
    measure_gpu,
    script_args,
)
from servelab.launch.containers import remove_container
from servelab.launch.server import ServerLaunch


def canary_container(launch: ServerLaunch) -> ContainerRun | None:
    """The container the GPU canary runs in: the launch's, named `<name>-canary`, passed the
    launch's variables by name; None for a venv."""
    if launch.container is None:
        return None
    env = {**launch.env, "PYTHONUNBUFFERED": "1"}
    return replace(
        launch.container, name=f"{launch.container.name}-canary", env_names=tuple(sorted(env))
    )


def gpu_canary_command(launch: ServerLaunch, work: GpuWork) -> tuple[list[str], dict[str, str]]:
    """The command that times the GPU canary where `launch` runs its server, and its whole
    environment (this process's, the launch's variables on top)."""
    env = {**launch.env, "PYTHONUNBUFFERED": "1"}
    c = canary_container(launch)
    if c is None:
        return [launch.python, *script_args(work)], {**os.environ, **env}
    cmd = c.run_command(["python3", *script_args(work)], "", 0)
    return cmd, {**os.environ, **c.process_env(env)}


def clear_gpu(launch: ServerLaunch, run: Runner = subprocess.run) -> str | None:
    """Remove the containers a killed job may have left on the launch's GPUs (the server's name
    and the canary's), each checked gone; None when none is left, else why the canary must not
    be timed. An apptainer run leaves no named container (`remove_container` has nothing to
    do)."""
    box = canary_container(launch)
    if launch.container is None or box is None:
        return None
    for c in (launch.container, box):
        if not remove_container(c, run):
            rm = " ".join(c.remove_command() or [])
            return f"container {c.name}, left by an earlier job, is still there: run `{rm}`"
    return None


def gpu_canary(
    launch: ServerLaunch,
    device: str,
    work: GpuWork | None = None,
    run: Runner = subprocess.run,
) -> GpuMeasure | None:
    """How a sweep job times the GPU canary around `launch` (what a killed job left removed
    first, `clear_gpu`; a canary container that times out removed): None on a CPU runtime
    (device "cpu") and for a server servelab did not launch (an endpoint: no runtime to run it
    in)."""
    if device != "gpu" or launch.endpoint is not None:
        return None
    done = work or GpuWork()

    def measure() -> GpuCanary | GpuAbsent:
        left = clear_gpu(launch, run)
        if left is not None:
            return GpuAbsent(left)
        cmd, env = gpu_canary_command(launch, done)
        box = canary_container(launch)
        remove = box.remove_command() if box is not None else None
        return measure_gpu(cmd, env, done, run, remove=remove)

    return measure
