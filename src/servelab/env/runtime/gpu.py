"""The GPU pre-flight of the runtime stage: can the runtime run on this host's GPUs at all?

A server that cannot (an image whose PyTorch has no kernels for the GPU, a quantization whose
kernels need a newer GPU) fails only after a start of up to server.startup_timeout_s, once per
server configuration. The runtime stage finds out first:

- each GPU the server will get (in a container, chosen here once for the whole run by UUID,
  `container_gpus`, and kept in runtime.json's `gpu_choice`: every launch, host-speed canary
  and profiling pass of the run takes that choice), and its compute capability, from NVML on
  this host (servelab.hostfacts.gpu_facts);
- the runtime's PyTorch build, asked in the runtime itself with the server's GPUs and
  runtime.env (in a container: a `python3 -c` run in the image): its version, the CUDA version
  it was built with (torch.version.cuda) and the architectures it holds kernels for (what
  torch.cuda.get_arch_list() returns);
- the least compute capability each quantization in server.args and server.configs needs: what
  the runtime's own vLLM says (QuantizationConfig.get_min_capability(), as vLLM checks it at the
  server's start), else QUANT_MIN_CAPABILITY.

A GPU that cannot run either stops the stage with one line naming the GPU, its compute
capability and what to change. The facts go into runtime.json (`torch_build`, `gpu_check`,
and in a container `gpu_choice`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NotRequired, TypedDict

from servelab.documents.declared import (
    GpuCheckRecord,
    GpuChoiceJson,
    GpuFacts,
    RuntimeJson,
    TorchBuild,
)
from servelab.env.container import ENGINES, ContainerRun
from servelab.env.container.gpus import GpuChoice, choose_gpus, with_indices
from servelab.env.runtime.tools import Runner, call, last_line
from servelab.errors import ServelabError
from servelab.experiment import RuntimeSection, ServerSection
from servelab.hostfacts.gpu import gpu_facts, list_gpus

# vLLM's QuantizationConfig.get_min_capability() (compute capability x 10) per method, as
# vllm/model_executor/layers/quantization/<method>.py returns it: awq.py and auto_awq.py 75
# (its kernels use Turing's instructions), awq_marlin.py 80, gptq.py 60, gptq_marlin.py 75,
# fp8.py 80 (weight-only through Marlin below 8.9), bitsandbytes.py 70, gguf.py 60. Used only
# when the runtime's own vLLM cannot be asked; a method not listed is not checked.
QUANT_MIN_CAPABILITY: dict[str, int] = {
    "awq": 75,
    "auto_awq": 75,
    "awq_marlin": 80,
    "gptq": 60,
    "gptq_marlin": 75,
    "fp8": 80,
    "bitsandbytes": 70,
    "gguf": 60,
}
GPU_PROBE_MARK = "SERVELAB-GPU-PROBE "
# Run as `python -c GPU_PROBE_SCRIPT METHOD...` in the runtime, with the server's GPUs.
# torch._C._cuda_getArchFlags() is what torch.cuda.get_arch_list() returns once CUDA is
# available: the build's own list, also where no GPU is seen.
GPU_PROBE_SCRIPT = r"""
import json, os, sys
out = {"torch_version": None, "cuda": None, "arch_list": None, "error": None,
       "quantization": {}, "image_cuda": os.environ.get("CUDA_VERSION") or None}
try:
    import torch
    out["torch_version"] = str(torch.__version__)
    out["cuda"] = torch.version.cuda
    flags = getattr(torch._C, "_cuda_getArchFlags", None)
    text = flags() if flags is not None else None
    out["arch_list"] = text.split() if text else None
except Exception as exc:
    out["error"] = (type(exc).__name__ + ": " + str(exc))[:300]
for name in sys.argv[1:]:
    try:
        from vllm.model_executor.layers.quantization import get_quantization_config
        out["quantization"][name] = int(get_quantization_config(name).get_min_capability())
    except Exception as exc:
        out["quantization"][name] = (type(exc).__name__ + ": " + str(exc))[:200]
print("SERVELAB-GPU-PROBE " + json.dumps(out, sort_keys=True), flush=True)
"""
GPU_PROBE_TIMEOUT_S = 600
IMAGE, VENV = "image", "venv"  # the GPU probe's "runtime": where it ran
_ARCH = re.compile(r"^(sm|compute)_(\d+)(\d)([a-z]?)$")


class QuantUseJson(TypedDict):
    """A quantization in runtime.json's gpu_check (`QuantUse.to_json`)."""

    method: str
    where: str
    min_capability: str | None
    source: str | None


class GpuProbeOutput(TypedDict):
    """What GPU_PROBE_SCRIPT prints: the runtime's PyTorch build and each quantization's least
    compute capability (x 10) as its vLLM says, or the error asking it."""

    torch_version: str | None
    cuda: str | None
    arch_list: list[str] | None
    error: str | None
    quantization: dict[str, int | str]
    image_cuda: str | None


class GpuProbe(GpuProbeOutput):
    """The GPU probe's answer and where it ran (IMAGE, VENV)."""

    runtime: str


class CheckedGpu(TypedDict):
    """A GPU runtime.json's gpu_check found able to run the runtime."""

    index: int
    name: str | None
    compute_capability: str
    arch_ok: bool | None


class Preflight(TypedDict):
    """The GPU pre-flight's part of runtime.json (`preflight`); `gpu_choice` in a container."""

    torch_build: TorchBuild
    torch_cuda: str | None
    image_cuda: str | None
    gpu_check: GpuCheckRecord
    gpu_choice: NotRequired[GpuChoiceJson]


class GpuFields(TypedDict, total=False):
    """The GPU pre-flight's fields of runtime.json (a GPU runtime)."""

    torch_build: TorchBuild
    torch_cuda: str | None
    image_cuda: str | None
    gpu_check: GpuCheckRecord
    gpu_choice: GpuChoiceJson


def add_gpu_fields(record: RuntimeJson, gpu: GpuFields) -> None:
    """Put the GPU pre-flight's fields into a runtime record (none on a CPU runtime)."""
    if "torch_build" in gpu:
        record["torch_build"] = gpu["torch_build"]
    if "torch_cuda" in gpu:
        record["torch_cuda"] = gpu["torch_cuda"]
    if "image_cuda" in gpu:
        record["image_cuda"] = gpu["image_cuda"]
    if "gpu_check" in gpu:
        record["gpu_check"] = gpu["gpu_check"]
    if "gpu_choice" in gpu:
        record["gpu_choice"] = gpu["gpu_choice"]


@dataclass(frozen=True)
class QuantUse:
    """A quantization method the server is started with, and the config key that sets it."""

    method: str
    where: str  # server.args.quantization, server.configs[NAME].args.quantization
    min_capability: int | None = None  # x 10 (75: 7.5); None: not known
    source: str | None = None  # "the image's vLLM <version>" (or venv's), "servelab's table"

    def to_json(self) -> QuantUseJson:
        return {
            "method": self.method,
            "where": self.where,
            "min_capability": None
            if self.min_capability is None
            else _cc_text(self.min_capability),
            "source": self.source,
        }


def _cc_text(cc10: int) -> str:
    return f"{cc10 // 10}.{cc10 % 10}"


def quantizations(server: ServerSection | None) -> list[QuantUse]:
    """Every quantization method the server configurations use (vLLM's --quantization), each
    with the key that sets it (a configuration's own args, else server.args), once."""
    if server is None:
        return []
    out: list[QuantUse] = []
    for c in server.configs or ():
        args, where = c.args, f"server.configs[{c.name}].args.quantization"
        if "quantization" not in args:
            args, where = server.args, "server.args.quantization"
        if args.get("quantization") is None:
            continue
        use = QuantUse(str(args["quantization"]), where)
        if use not in out:
            out.append(use)
    return out


def parse_gpu_probe(text: str) -> GpuProbeOutput | None:
    for line in reversed(text.splitlines()):
        if line.startswith(GPU_PROBE_MARK):
            data: GpuProbeOutput = json.loads(line[len(GPU_PROBE_MARK) :])
            return data
    return None


def _finish_probe(proc: Any, where: str) -> GpuProbeOutput:
    data = parse_gpu_probe(proc.stdout or "") if proc.returncode == 0 else None
    if data is None:
        raise ServelabError(
            f"runtime: the GPU probe in {where} failed ({last_line(proc)}); a server started "
            "there would fail the same way: check that the GPUs reach it (docker, podman: the "
            "NVIDIA Container Toolkit; apptainer: --nv)"
        )
    return data


def container_gpu_probe(
    base: ContainerRun, rt: RuntimeSection, methods: Sequence[str], run: Runner
) -> GpuProbe:
    """GPU_PROBE_SCRIPT in the image, with the server's GPUs (base.gpus) and runtime.env
    (passed by name, as to the server)."""
    env = {k: str(v) for k, v in rt.env.items()}
    probe = replace(base, name=f"servelab-gpu-probe-{os.getpid()}", env_names=tuple(sorted(env)))
    cmd = probe.run_command(["python3", "-c", GPU_PROBE_SCRIPT, *methods], "", 0)
    proc = call(run, cmd, GPU_PROBE_TIMEOUT_S, {**os.environ, **probe.process_env(env)})
    return {**_finish_probe(proc, base.image), "runtime": IMAGE}


def venv_gpu_probe(
    python: str, rt: RuntimeSection, methods: Sequence[str], run: Runner
) -> GpuProbe:
    """GPU_PROBE_SCRIPT in the venv's Python, with runtime.env."""
    env = {**os.environ, **{k: str(v) for k, v in rt.env.items()}}
    proc = call(run, [python, "-c", GPU_PROBE_SCRIPT, *methods], GPU_PROBE_TIMEOUT_S, env)
    return {**_finish_probe(proc, python), "runtime": VENV}


def parse_arch(name: str) -> tuple[str, int, int, str] | None:
    """sm_86 -> ("sm", 8, 6, ""); sm_90a -> ("sm", 9, 0, "a"); compute_120 -> ("compute",
    12, 0, ""); None for anything else."""
    m = _ARCH.match(name)
    return None if m is None else (m[1], int(m[2]), int(m[3]), m[4])


def arch_runs(cc: tuple[int, int], arch_list: Sequence[str]) -> bool:
    """Whether a build for arch_list runs on a GPU of compute capability cc: a cubin (sm_XY)
    runs on the same major version at minor Y or above (sm_XYa: on X.Y alone); PTX
    (compute_XY) is compiled at load time for any GPU of X.Y or above."""
    for name in arch_list:
        parsed = parse_arch(name)
        if parsed is None:
            continue
        kind, major, minor, suffix = parsed
        if suffix == "a":
            ok = cc == (major, minor)
        elif kind == "compute":
            ok = cc >= (major, minor)
        else:
            ok = cc[0] == major and cc[1] >= minor
        if ok:
            return True
    return False


def _lowest(arch_list: Sequence[str]) -> int:
    """The least compute capability (x 10) an arch list runs on."""
    found = [p[1] * 10 + p[2] for p in map(parse_arch, arch_list) if p is not None]
    return min(found) if found else 0


def resolve(uses: Sequence[QuantUse], probe: Mapping[str, Any], vllm: str | None) -> list[QuantUse]:
    """Each quantization with its least compute capability: the runtime's vLLM's answer
    (probe["quantization"]), else QUANT_MIN_CAPABILITY, else unknown."""
    answers = probe.get("quantization") or {}
    source = f"the {probe.get('runtime') or 'runtime'}'s vLLM {vllm or '?'}"
    out = []
    for use in uses:
        said = answers.get(use.method)
        if isinstance(said, int):
            out.append(replace(use, min_capability=said, source=source))
        elif use.method in QUANT_MIN_CAPABILITY:
            table = QUANT_MIN_CAPABILITY[use.method]
            out.append(replace(use, min_capability=table, source="servelab's table"))
        else:
            out.append(use)
    return out


def refusal(
    gpu: Mapping[str, Any], probe: Mapping[str, Any], uses: Sequence[QuantUse]
) -> str | None:
    """The one line that stops the stage for this GPU, or None when it can run the runtime."""
    major, minor = (int(x) for x in str(gpu["compute_capability"]).split(".")[:2])
    cc10 = major * 10 + minor
    arch = probe.get("arch_list")
    problems: list[str] = []
    fixes: list[str] = []
    needs: list[int] = []
    if arch and not arch_runs((major, minor), arch):
        where = probe.get("runtime") or "runtime"
        problems.append(
            f"the {where}'s PyTorch {probe.get('torch_version')} (CUDA {probe.get('cuda')}) has "
            f"no kernels for it (built for {' '.join(arch)})"
        )
        pin = "runtime.lock to a lock" if where == VENV else "runtime.image to an image"
        fixes.append(f"pin {pin} whose PyTorch is built for sm_{cc10}")
        needs.append(_lowest(arch))
    for use in uses:
        if use.min_capability is None or use.min_capability <= cc10:
            continue
        problems.append(
            f"{use.where} {use.method} needs {_cc_text(use.min_capability)} ({use.source})"
        )
        alts = sorted(m for m, v in QUANT_MIN_CAPABILITY.items() if v <= cc10)
        fixes.append(
            f"set {use.where} to a method that runs on {major}.{minor} ({', '.join(alts)})"
        )
        needs.append(use.min_capability)
    if not problems:
        return None
    fixes.append(f"run on GPUs of compute capability {_cc_text(max(needs))} or newer")
    return (
        f"runtime: GPU {gpu['index']} ({gpu.get('name') or '?'}) has compute capability "
        f"{major}.{minor}: {'; '.join(problems)}; {', or '.join(fixes)}"
    )


def container_gpus(rt: RuntimeSection, environ: Mapping[str, str], nvml: Any = None) -> GpuChoice:
    """The GPUs every launch of the run gives its container, chosen once, here
    (servelab.env.container.gpus.choose_gpus: runtime.gpu_devices, else the job's
    CUDA_VISIBLE_DEVICES, else the runtime.gpus GPUs with the least memory in use), by UUID,
    with each one's NVML index now."""
    listing = list_gpus(nvml)
    return with_indices(choose_gpus(rt.gpu_devices, rt.gpus, environ, listing), listing)


def server_gpus(
    rt: RuntimeSection, environ: Mapping[str, str], nvml: Any = None
) -> str | tuple[str, ...]:
    """The GPUs the pre-flight looks at and gives its probe. In a container, the ones every
    launch will give it (`container_gpus`), by UUID; in a venv, the job's CUDA_VISIBLE_DEVICES
    (as a cluster scheduler sets it), else "all"."""
    if rt.kind in ENGINES:
        return container_gpus(rt, environ, nvml).gpus
    if rt.gpu_devices:
        return tuple(str(g) for g in rt.gpu_devices)
    visible = [g.strip() for g in (environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")]
    return tuple(g for g in visible if g) or "all"


def _selected(gpus: list[GpuFacts], selection: Any) -> list[GpuFacts]:
    """The GPUs of NVML's list that selection names, by index, UUID or PCI bus id; every GPU
    for "all" or for ids none of them carries (a MIG id)."""
    if not isinstance(selection, tuple):
        return gpus
    wanted = {str(s).lower() for s in selection}

    def named(g: GpuFacts) -> bool:
        keys = (str(g.get("index")), g.get("uuid"), g.get("pci_bus_id"))
        return any(k is not None and str(k).lower() in wanted for k in keys)

    hits = [g for g in gpus if named(g)]
    return hits or gpus


@dataclass(frozen=True)
class GpuCheck:
    """What the pre-flight compares: the runtime's answers, the quantizations, and NVML."""

    probe: Mapping[str, Any]
    uses: tuple[QuantUse, ...]
    selection: Any  # server_gpus' answer
    nvml: Any = None  # the pynvml module (None: imported)


def check_gpus(check: GpuCheck, say: Callable[[str], None]) -> GpuCheckRecord:
    """runtime.json's gpu_check; raises (one line) for the first GPU that cannot run it.
    Without NVML there is nothing to compare: status "unchecked" and the reason."""
    facts = gpu_facts(check.nvml)
    probe = check.probe
    out: GpuCheckRecord = {
        "status": "ok",
        "reason": None,
        "gpus": [],
        "quantization": [u.to_json() for u in check.uses],
    }
    gpus = _selected(list(facts.get("gpus") or []), check.selection)
    if not gpus or facts.get("gpu_reason"):
        out["status"] = "unchecked"
        out["reason"] = facts.get("gpu_reason") or "no GPU selected"
        say(f"runtime: GPUs not checked: {out['reason']}")
        return out
    for gpu in gpus:
        cc_text = gpu.get("compute_capability")
        if not cc_text:
            continue
        line = refusal(gpu, probe, check.uses)
        if line is not None:
            raise ServelabError(line)
        arch = probe.get("arch_list")
        cc = tuple(int(x) for x in str(cc_text).split("."))
        out["gpus"].append(
            {
                "index": gpu["index"],
                "name": gpu.get("name"),
                "compute_capability": cc_text,
                "arch_ok": arch_runs((cc[0], cc[1]), arch) if arch else None,
            }
        )
    named = ", ".join(f"{g['index']} ({g['compute_capability']})" for g in out["gpus"])
    say(f"runtime: GPUs {named or 'none with a known compute capability'} can run it")
    return out


def torch_build(probe: Mapping[str, Any]) -> TorchBuild:
    """runtime.json's torch_build: the runtime's PyTorch as the GPU probe found it."""
    return {
        "torch_version": probe.get("torch_version"),
        "cuda": probe.get("cuda"),
        "arch_list": probe.get("arch_list"),
        "error": probe.get("error"),
    }


# ask(selection, methods): the GPU probe's answer in the runtime, with the GPUs `selection`
# (server_gpus) and the quantization methods to ask its vLLM about
Ask = Callable[[Any, list[str]], GpuProbe]


def preflight(
    ask: Ask,
    rt: RuntimeSection,
    server: ServerSection | None,
    nvml: Any,
    vllm: str | None,
    say: Callable[[str], None],
) -> Preflight:
    """The runtime stage's GPU pre-flight (a GPU runtime): runtime.json's torch_build,
    gpu_check and, in a container, gpu_choice (the GPUs every launch of the run is given);
    raises (one line) when a GPU cannot run the runtime. vllm: the runtime's vLLM version, for
    the messages."""
    uses = quantizations(server)
    choice = container_gpus(rt, os.environ, nvml) if rt.kind in ENGINES else None
    selection = choice.gpus if choice is not None else server_gpus(rt, os.environ, nvml)
    if choice is not None:
        say(f"runtime: GPUs {', '.join(choice.ids) or 'all'} for every launch ({choice.origin})")
    probe = ask(selection, [u.method for u in uses])
    arch = " ".join(probe.get("arch_list") or []) or "no architecture it names"
    say(
        f"runtime: PyTorch {probe.get('torch_version') or '?'} built with CUDA "
        f"{probe.get('cuda') or '?'} for {arch}"
        + (f" ({probe['error']})" if probe.get("error") else "")
    )
    check = GpuCheck(probe, tuple(resolve(uses, probe, vllm)), selection, nvml)
    out: Preflight = {
        "torch_build": torch_build(probe),
        "torch_cuda": probe.get("cuda"),
        "image_cuda": probe.get("image_cuda"),
        "gpu_check": check_gpus(check, say),
    }
    if choice is not None:
        out["gpu_choice"] = choice.to_json()
    return out
