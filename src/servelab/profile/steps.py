"""vLLM's engine steps as its NVTX ranges name them, and the step enclosing a host call.

With the CUDA profiler on (--profiler-config '{"profiler": "cuda"}'), vLLM's GPU worker wraps
every engine step in an NVTX push/pop range (vllm/profiler/wrapper.py:
CudaProfilerWrapper.annotate_context_manager is torch.cuda.nvtx.range; the name comes from
vllm/v1/worker/gpu_worker.py: annotate_profile) named
`execute_context_{N}({T})_generation_{M}({T2})`: N context requests (a prefill, or a chunk of
one) with T tokens, M generation (decode) requests with T2 tokens
(vllm/v1/utils.py: compute_iteration_details); with detailed annotation
`execute_{tokens}_context_{N}(sq{T}sk...)_generation_{M}(sq{T2}sk...)`; older releases name it
`execute_new_{N}_cached_{M}` (new requests, and requests already running: a cached request may
still be in a chunked prefill). The ranges are on the worker's thread, in host time; a step is
projected onto the GPU through the launches made inside it (correlationId, see
servelab.profile.nsys).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass

# vLLM's per-step NVTX range names (see the module docstring), each with its format's name:
# groups are (context requests, context tokens, generation requests, generation tokens)
STEP_FORMATS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "context/generation",
        re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$"),
    ),
    (
        "context/generation (detailed)",
        re.compile(r"^execute_\d+_context_(\d+)\(sq(\d+)[^)]*\)_generation_(\d+)\(sq(\d+)[^)]*\)$"),
    ),
    ("new/cached", re.compile(r"^execute_new_(\d+)_cached_(\d+)$")),
)


@dataclass(frozen=True)
class StepRange:
    """One engine step as vLLM's NVTX range names it, in host time on the worker's thread."""

    start: int
    end: int
    tid: int  # globalTid
    context: int  # requests in prefill (or "new", in the new/cached format)
    generation: int  # requests in decode (or "cached")
    context_tokens: int | None
    generation_tokens: int | None
    form: str

    @property
    def requests(self) -> int:
        return self.context + self.generation

    @property
    def kind(self) -> str:
        if self.context and self.generation:
            return "mixed"
        if self.context:
            return "prefill"
        return "decode" if self.generation else "empty"


def parse_step_range(name: str) -> tuple[str, int, int, int | None, int | None] | None:
    """(format, context requests, generation requests, context tokens, generation tokens) of
    a vLLM step range name, or None."""
    for form, pat in STEP_FORMATS:
        m = pat.match(name)
        if m is None:
            continue
        if form == "new/cached":
            return form, int(m.group(1)), int(m.group(2)), None, None
        return form, int(m.group(1)), int(m.group(3)), int(m.group(2)), int(m.group(4))
    return None


class StepIndex:
    """Steps by thread, for the step whose range encloses a host call (thread, time)."""

    def __init__(self, steps: Iterable[StepRange]) -> None:
        self.per_thread: dict[int, list[StepRange]] = {}
        for st in sorted(steps, key=lambda r: (r.tid, r.start, r.end)):
            self.per_thread.setdefault(st.tid, []).append(st)
        self.starts = {t: [st.start for st in sts] for t, sts in self.per_thread.items()}

    def at(self, tid: int, t: int) -> StepRange | None:
        """The step range on thread `tid` that holds time `t`, or None."""
        sts = self.per_thread.get(tid)
        if not sts:
            return None
        j = bisect.bisect_right(self.starts[tid], t) - 1
        if j >= 0 and sts[j].start <= t < sts[j].end:
            return sts[j]
        return None
