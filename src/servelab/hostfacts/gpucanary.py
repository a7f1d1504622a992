"""The GPU host-speed canary: a fixed matmul and a device-to-device copy, timed through the
runtime's PyTorch (a GPU server's speed is its GPU's).

servelab's own environment has no PyTorch: GPU_CANARY_SCRIPT runs in the runtime's Python (a
venv's python, or `python3` in the image, with the server's GPUs: servelab.launch.canary builds
the command) and prints one line, GPU_CANARY_MARK and JSON: each repeat's seconds, or why it
could not run (no PyTorch, no CUDA device). `parse_gpu_canary` reads that line into a
`GpuCanary` or a `GpuAbsent` with the reason; `measure_gpu` runs a command and reads it, never
raising: a canary that cannot run is recorded as absent, it does not stop a sweep.

The work (`GpuWork`, docs/analysis.md "Host speed") is fixed: MATMUL_ITERS products of two
MATMUL_N x MATMUL_N fp16 matrices drawn from a seeded generator on the device, and COPIES copies
of a COPY_MIB MiB buffer into another. Both run in turn, untimed, until WARMUP_S seconds have
passed (a GPU's clocks and temperature settle under load; a cold burst reads its boost clock),
then REPEATS timed repeats of each, each between two torch.cuda.synchronize() calls. Its `id`
(a hash of the sizes, dtype, counts, seed and warm-up) says which work was timed: two canaries
compare only on the same work. Beside the timings the script records the GPU's state under
load, after the warm-up and after the repeats (hostfacts.gpustate: SM clock, temperature,
power, throttle reasons through the runtime's pynvml), and the PyTorch and CUDA builds it ran
with (`build_text`: two runs' canaries compare only on the same builds, analysis.hostspeed).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NotRequired, TypedDict, cast

from servelab.documents.declared import GpuCanaryJson, PartDriftJson, RunGpuCanaryJson
from servelab.hostfacts.gpustate import NVML_STATE_SCRIPT, GpuState
from servelab.hostfacts.timing import (
    DRIFT_FLOOR,
    PartDrift,
    Timing,
    drift_line,
    overall,
    part_drift,
    summary,
)

# 2 x 8192^3 = 1.1 TFLOP a product, 22 TFLOP a repeat: about 35 ms on an H100 SXM (cuBLAS near
# 650 TFLOP/s in fp16), 80 ms on an A100 (about 280 TFLOP/s), 0.5 s on a T4. The copy reads and
# writes 256 MiB 100 times, 54 GB a repeat: about 20 ms at an H100's 2.7 TB/s, 30 ms on an
# A100. A warm-up of WARMUP_S (at least one pass of each) and five repeats: about 2 s of GPU
# work on either, beside the seconds the runtime takes to import PyTorch and make its CUDA
# context. About 0.9 GiB of GPU memory.
MATMUL_N = 8192
MATMUL_DTYPE = "float16"
MATMUL_ITERS = 20
COPY_MIB = 256
COPIES = 100
REPEATS = 5
SEED = 20261204
# seconds of untimed matmuls and copies before the timed repeats: long enough for a GPU's clock
# to leave its first boost and its power draw to reach the load's (NVML averages power over
# about a second), short beside a sweep
WARMUP_S = 1.5
GPU_CANARY_MARK = "SERVELAB-GPU-CANARY "
GPU_CANARY_TIMEOUT_S = 600
# Run as `python -c GPU_CANARY_SCRIPT N DTYPE ITERS MIB COPIES REPEATS SEED WARMUP_S` in the
# runtime; it times on the first GPU it sees (the server's first) and prints one marked JSON
# line. The GPU's state is read (NVML_STATE_SCRIPT) while a pass of matmuls runs, untimed.
GPU_CANARY_SCRIPT = (
    r"""
import json, sys, time
def say(out):
    print("SERVELAB-GPU-CANARY " + json.dumps(out, sort_keys=True), flush=True)
n, dtype_name, iters, mib, copies, repeats, seed = sys.argv[1:8]
n, iters, mib, copies, repeats, seed = (int(v) for v in (n, iters, mib, copies, repeats, seed))
warmup_s = float(sys.argv[8]) if len(sys.argv) > 8 else 0.0
"""
    + NVML_STATE_SCRIPT
    + r"""
try:
    import torch
except Exception as exc:
    say({"present": False, "reason": "PyTorch is not importable: " + str(exc)[:200]})
    sys.exit(0)
if not torch.cuda.is_available():
    built = torch.version.cuda
    say({"present": False, "reason": "CUDA not available to PyTorch " + str(torch.__version__)
         + (" (built with CUDA " + built + ")" if built else " (built without CUDA)")})
    sys.exit(0)
try:
    dev = torch.device("cuda", 0)
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    a = torch.randn((n, n), generator=gen, device=dev, dtype=dtype)
    b = torch.randn((n, n), generator=gen, device=dev, dtype=dtype)
    c = torch.empty((n, n), device=dev, dtype=dtype)
    src = torch.randn(mib * 1024 * 1024 // a.element_size(), generator=gen, device=dev, dtype=dtype)
    dst = torch.empty_like(src)
    nvml, handle = nvml_open(torch, dev)
    def matmuls():
        for _ in range(iters):
            torch.matmul(a, b, out=c)
    def copying():
        for _ in range(copies):
            dst.copy_(src)
    def timed(work):
        torch.cuda.synchronize(dev)
        start = time.perf_counter()
        work()
        torch.cuda.synchronize(dev)
        return time.perf_counter() - start
    def under_load(at):
        torch.cuda.synchronize(dev)
        matmuls()
        state = gpu_state(nvml, handle, at)
        torch.cuda.synchronize(dev)
        return state
    began, passes = time.perf_counter(), 0
    while passes == 0 or time.perf_counter() - began < warmup_s:
        timed(matmuls)
        timed(copying)
        passes += 1
    warmed = time.perf_counter() - began
    states = [under_load("after_warmup")] if nvml is not None else []
    matmul_s = [timed(matmuls) for _ in range(repeats)]
    copy_s = [timed(copying) for _ in range(repeats)]
    out = {"present": True, "matmul_s": matmul_s, "copy_s": copy_s,
           "device": torch.cuda.get_device_name(dev), "torch_version": str(torch.__version__),
           "cuda": torch.version.cuda, "warmup": {"seconds": warmed, "passes": passes},
           "work": {"matmul_n": n, "dtype": dtype_name, "matmul_iters": iters, "copy_mib": mib,
                    "copies": copies, "repeats": repeats, "seed": seed, "warmup_s": warmup_s}}
    if nvml is None:
        out["gpu_state_reason"] = handle
    else:
        out["gpu_state"] = states + [under_load("after_repeats")]
    say(out)
except Exception as exc:
    say({"present": False, "reason": (type(exc).__name__ + ": " + str(exc))[:300]})
"""
)


class GpuParamsJson(TypedDict):
    """The GPU canary's work parameters (GpuWork.params)."""

    matmul_n: int
    dtype: str
    matmul_iters: int
    copy_mib: int
    copies: int
    repeats: int
    seed: int
    warmup_s: NotRequired[float]  # absent: one untimed pass of each (canaries before WARMUP_S)


class GpuWorkJson(GpuParamsJson):
    """The work parameters and their hash (GpuWork.id)."""

    id: str


class GpuWarmupJson(TypedDict):
    """How long the warm-up ran, and how many passes of the matmuls and copies it made."""

    seconds: float
    passes: int


class GpuDriftJson(TypedDict):
    matmul: PartDriftJson
    copy: PartDriftJson
    verdict: str


@dataclass(frozen=True)
class GpuWork:
    """The GPU canary's fixed work: its sizes, dtype, counts, seed and the seconds of warm-up
    before the timed repeats (0: one untimed pass of each, as canaries recorded before the
    warm-up was timed)."""

    matmul_n: int = MATMUL_N
    dtype: str = MATMUL_DTYPE
    matmul_iters: int = MATMUL_ITERS
    copy_mib: int = COPY_MIB
    copies: int = COPIES
    repeats: int = REPEATS
    seed: int = SEED
    warmup_s: float = WARMUP_S

    @property
    def id(self) -> str:
        """A hash of the work's parameters: the same on every host for the same work."""
        text = json.dumps(self.params(), sort_keys=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def params(self) -> GpuParamsJson:
        """The work's parameters by name, in GPU_CANARY_SCRIPT's argument order; without
        warmup_s when it is 0, so that a canary recorded before the warm-up was timed keeps
        its id."""
        out: GpuParamsJson = {
            "matmul_n": self.matmul_n,
            "dtype": self.dtype,
            "matmul_iters": self.matmul_iters,
            "copy_mib": self.copy_mib,
            "copies": self.copies,
            "repeats": self.repeats,
            "seed": self.seed,
        }
        if self.warmup_s:
            out["warmup_s"] = self.warmup_s
        return out

    def args(self) -> list[str]:
        """GPU_CANARY_SCRIPT's arguments."""
        return [str(getattr(self, k)) for k in self.__dataclass_fields__]

    @property
    def repeat_tflop(self) -> float:
        """The floating-point work of one matmul repeat, in TFLOP."""
        return 2.0 * self.matmul_n**3 * self.matmul_iters / 1e12

    @property
    def repeat_gb(self) -> float:
        """The bytes one copy repeat reads and writes, in GB."""
        return 2.0 * self.copy_mib * 1024 * 1024 * self.copies / 1e9

    def to_json(self) -> GpuWorkJson:
        return {**self.params(), "id": self.id}

    @classmethod
    def from_json(cls, doc: GpuParamsJson) -> GpuWork:
        return cls(
            int(doc["matmul_n"]),
            str(doc["dtype"]),
            int(doc["matmul_iters"]),
            int(doc["copy_mib"]),
            int(doc["copies"]),
            int(doc["repeats"]),
            int(doc["seed"]),
            float(doc.get("warmup_s") or 0.0),
        )


@dataclass(frozen=True)
class GpuCanary:
    """One timing of the GPU canary: `matmul`, seconds of a repeat's MATMUL_ITERS products
    (lower is faster), and `copy`, GB/s read and written by the device copies (higher is
    faster); the GPU, PyTorch and CUDA it ran on; how long it warmed up (seconds, passes; None
    in canaries recorded before); the GPU's state under load after the warm-up and after the
    repeats (`states`), or why it could not be read (`state_reason`)."""

    work: GpuWork
    matmul: Timing
    copy: Timing
    device: str | None = None
    torch_version: str | None = None
    cuda: str | None = None
    warmup: GpuWarmupJson | None = None
    states: tuple[GpuState, ...] = ()
    state_reason: str | None = None

    @property
    def tflops(self) -> float:
        """The matmul's median TFLOP/s."""
        return self.work.repeat_tflop / self.matmul.median if self.matmul.median else 0.0

    def to_json(self) -> GpuCanaryJson:
        out: GpuCanaryJson = {
            "work": self.work.to_json(),
            "matmul": self.matmul.to_json(),
            "matmul_tflops": self.tflops,
            "copy": self.copy.to_json(),
            "device": self.device,
            "torch_version": self.torch_version,
            "cuda": self.cuda,
        }
        if self.warmup is not None:
            out["warmup"] = {**self.warmup}
        if self.states:
            out["gpu_state"] = [s.to_json() for s in self.states]
        if self.state_reason is not None:
            out["gpu_state_reason"] = self.state_reason
        return out

    @classmethod
    def from_json(cls, doc: GpuCanaryJson) -> GpuCanary:
        """A recorded timing, or the script's answer; what canaries recorded before the
        warm-up and the GPU's state were kept reads as not known."""
        warm = doc.get("warmup")
        warmup: GpuWarmupJson | None = None
        if isinstance(warm, Mapping):
            warmup = {"seconds": float(warm["seconds"]), "passes": int(warm["passes"])}
        states = doc.get("gpu_state") or []
        reason = doc.get("gpu_state_reason")
        return cls(
            GpuWork.from_json(doc["work"]),
            Timing.from_json(doc["matmul"]),
            Timing.from_json(doc["copy"]),
            doc.get("device"),
            doc.get("torch_version"),
            doc.get("cuda"),
            warmup,
            tuple(GpuState.from_json(s) for s in states if isinstance(s, Mapping)),
            None if reason is None else str(reason),
        )

    @property
    def last_state(self) -> GpuState | None:
        """The GPU's state after the timed repeats (else the last one read)."""
        return self.states[-1] if self.states else None

    def medians(self) -> dict[str, float]:
        """{matmul_s, matmul_tflops, copy_gbps}: as validity.json and provenance.json keep them."""
        return {
            "matmul_s": self.matmul.median,
            "matmul_tflops": self.tflops,
            "copy_gbps": self.copy.median,
        }

    def line(self) -> str:
        """GPU matmul 34.1 ms (645 TFLOP/s), device copy 2712 GB/s (NVIDIA H100 80GB HBM3);
        SM clock 1410 MHz, 62 °C, 300 W, throttled: sw_thermal_slowdown (the state after the
        repeats; `GPU state not read: <why>` where it could not be read)."""
        text = (
            f"GPU matmul {self.matmul.median * 1e3:.1f} ms ({self.tflops:.0f} TFLOP/s), device "
            f"copy {self.copy.median:.0f} GB/s ({self.device or 'GPU ?'})"
        )
        state = self.last_state
        if state is not None:
            return f"{text}; {state.line()}"
        if self.state_reason is not None:
            return f"{text}; GPU state not read: {self.state_reason}"
        return text


def build_text(torch_version: str | None, cuda: str | None) -> str | None:
    """A PyTorch build in words: its version where the version names its CUDA (2.6.0+cu126 for
    CUDA 12.6), else the version and the CUDA (2.6.0 (CUDA 12.6), 2.6.0 (no CUDA)); None
    without a version."""
    if not torch_version:
        return None
    if cuda and torch_version.endswith("+cu" + cuda.replace(".", "")):
        return torch_version
    return f"{torch_version} ({f'CUDA {cuda}' if cuda else 'no CUDA'})"


@dataclass(frozen=True)
class GpuAbsent:
    """The GPU canary could not be timed, and why."""

    reason: str


def _seconds(values: object, name: str) -> list[float]:
    if not isinstance(values, list) or not values:
        raise ValueError(f"{name} is not a list of seconds")
    out = [float(v) for v in values]
    if any(v <= 0 for v in out):
        raise ValueError(f"{name} holds a time that is not positive")
    return out


def parse_gpu_canary(text: str, work: GpuWork) -> GpuCanary | GpuAbsent | None:
    """The last GPU_CANARY_MARK line of `text` as a GpuCanary (its work must be `work`), or
    the GpuAbsent it reports; None when no such line was printed."""
    for line in reversed(text.splitlines()):
        if not line.startswith(GPU_CANARY_MARK):
            continue
        try:
            doc = json.loads(line[len(GPU_CANARY_MARK) :])
            if not doc.get("present"):
                return GpuAbsent(str(doc.get("reason") or "the GPU canary gave no reason"))
            timed = GpuWork.from_json(doc["work"])
            if timed != work:
                return GpuAbsent(f"the GPU canary timed other work than asked: {timed}")
            matmul = summary(_seconds(doc.get("matmul_s"), "matmul_s"), "s")
            rates = [work.repeat_gb / s for s in _seconds(doc.get("copy_s"), "copy_s")]
            copy = summary(rates, "GB/s")
            timing = {"matmul": matmul.to_json(), "copy": copy.to_json(), "work": doc["work"]}
            # the answer with its timings summarized: a damaged one raises, caught below
            return GpuCanary.from_json(cast(GpuCanaryJson, {**doc, **timing}))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return GpuAbsent(f"the GPU canary's answer is damaged: {exc}")
    return None


Runner = Callable[..., "subprocess.CompletedProcess[str]"]
# measures the GPU canary in the runtime: a GpuCanary, or why it could not
GpuMeasure = Callable[[], GpuCanary | GpuAbsent]


def measure_gpu(
    cmd: Sequence[str],
    env: Mapping[str, str] | None,
    work: GpuWork,
    run: Runner = subprocess.run,
    timeout_s: float = GPU_CANARY_TIMEOUT_S,
    remove: Sequence[str] | None = None,
) -> GpuCanary | GpuAbsent:
    """Run `cmd` (a command ending in `python -c GPU_CANARY_SCRIPT *work.args()`, in the
    runtime) with `env` (None: this process's) and read its answer; never raises: a command
    that cannot run, ends badly or says nothing gives a GpuAbsent with the reason. `remove`:
    the command that removes the canary's container (`docker rm --force NAME`), run when it
    gives no answer in time: killing the engine's client on the timeout leaves the container
    running on the GPU."""
    extra: dict[str, dict[str, str]] = {} if env is None else {"env": dict(env)}
    try:
        proc = run(
            list(cmd), capture_output=True, text=True, timeout=timeout_s, check=False, **extra
        )
    except subprocess.TimeoutExpired:
        late = f"the GPU canary gave no answer within {timeout_s:g} s"
        return GpuAbsent(late if remove is None else f"{late}; {_removed(remove, run)}")
    except OSError as exc:
        return GpuAbsent(f"the GPU canary could not be started: {exc}")
    found = parse_gpu_canary(proc.stdout or "", work)
    if found is not None:
        return found
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    said = lines[-1][:300] if lines else "nothing printed"
    return GpuAbsent(f"the GPU canary ended with exit {proc.returncode} and no answer ({said})")


def _removed(remove: Sequence[str], run: Runner) -> str:
    """Remove what a canary that timed out left running; what happened, in words."""
    said = " ".join(remove)
    try:
        proc = run(list(remove), capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"its container could not be removed ({exc}): run `{said}`"
    if proc.returncode != 0:
        why = ((proc.stderr or "").strip().splitlines() or ["no message"])[-1][:200]
        return f"its container could not be removed (exit {proc.returncode}: {why}): run `{said}`"
    return f"its container was removed (`{said}`)"


def script_args(work: GpuWork) -> list[str]:
    """What follows the runtime's python: `-c GPU_CANARY_SCRIPT` and the work's arguments."""
    return ["-c", GPU_CANARY_SCRIPT, *work.args()]


@dataclass(frozen=True)
class GpuDrift:
    """Whether the GPU canary moved between two timings beyond its own noise (the rule of the
    CPU canary's parts: hostfacts.timing.part_drift)."""

    matmul: PartDrift
    copy: PartDrift
    verdict: str

    def to_json(self) -> GpuDriftJson:
        return {
            "matmul": self.matmul.to_json(),
            "copy": self.copy.to_json(),
            "verdict": self.verdict,
        }

    @classmethod
    def from_json(cls, doc: GpuDriftJson) -> GpuDrift:
        return cls(
            PartDrift.from_json(doc["matmul"]),
            PartDrift.from_json(doc["copy"]),
            str(doc["verdict"]),
        )

    def line(self) -> str:
        """steady (GPU matmul +0.4%, device copy -0.2%; beyond 5.0% and 5.0% it moved)."""
        named = {"GPU matmul": self.matmul, "device copy": self.copy}
        return drift_line(named, self.verdict)


def gpu_drift(before: GpuCanary, after: GpuCanary, floor: float = DRIFT_FLOOR) -> GpuDrift:
    """The matmul's seconds (higher: slower) and the copy's GB/s (higher: faster), each by
    part_drift; moved when a part moved, else unsteady when a part is."""
    matmul = part_drift(before.matmul, after.matmul, True, floor)
    copy = part_drift(before.copy, after.copy, False, floor)
    return GpuDrift(matmul, copy, overall(matmul, copy))


@dataclass(frozen=True)
class RunGpuCanary:
    """run.json `canary.gpu`: the GPU canary before a sweep job's first launch and after its
    last, and their drift; or, where either could not be timed, `present` false and why."""

    before: GpuCanary | None
    after: GpuCanary | None
    drift: GpuDrift | None
    reason: str = ""

    @property
    def present(self) -> bool:
        return self.drift is not None

    @classmethod
    def of(cls, before: GpuCanary | GpuAbsent, after: GpuCanary | GpuAbsent) -> RunGpuCanary:
        if isinstance(before, GpuAbsent):
            return cls(None, None, None, f"before the first launch: {before.reason}")
        if isinstance(after, GpuAbsent):
            return cls(None, None, None, f"after the last launch: {after.reason}")
        if before.work != after.work:
            return cls(None, None, None, "the timings before and after are of different work")
        return cls(before, after, gpu_drift(before, after))

    def to_json(self) -> RunGpuCanaryJson:
        if self.before is None or self.after is None or self.drift is None:
            return {"present": False, "reason": self.reason}
        return {
            "present": True,
            "before": self.before.to_json(),
            "after": self.after.to_json(),
            "drift": self.drift.to_json(),
        }

    @classmethod
    def from_json(cls, doc: RunGpuCanaryJson) -> RunGpuCanary:
        if not doc.get("present"):
            return cls(None, None, None, str(doc.get("reason") or ""))
        return cls(
            GpuCanary.from_json(doc["before"]),
            GpuCanary.from_json(doc["after"]),
            GpuDrift.from_json(doc["drift"]),
        )

    def line(self) -> str:
        """The summary's: GPU matmul 34.1 -> 34.3 ms, device copy 2712 -> 2705 GB/s: steady
        (...), then `; throttled after: sw_power_cap` for a timing whose GPU was throttling;
        or `GPU canary not timed: <why>`."""
        b, a, d = self.before, self.after, self.drift
        if b is None or a is None or d is None:
            return f"GPU canary not timed: {self.reason}"
        throttled = [
            f"throttled {when}: {', '.join(s.throttled)}"
            for when, c in (("before", b), ("after", a))
            if (s := c.last_state) is not None and s.throttled
        ]
        return (
            f"GPU matmul {b.matmul.median * 1e3:.1f} -> {a.matmul.median * 1e3:.1f} ms, "
            f"device copy {b.copy.median:.0f} -> {a.copy.median:.0f} GB/s: {d.line()}"
        ) + "".join(f"; {t}" for t in throttled)
