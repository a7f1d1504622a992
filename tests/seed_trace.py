"""A generated Nsight Systems export shaped like the published A100 / Qwen2.5-3B study.

The study profiled C64, C128 and C256 on a 36-layer model whose FlashAttention-2 split-KV kernel
runs two code paths: gridX=1 on decode-only forwards and gridX=9 on forwards that hold a
prefill. Its table (calls per path per window) and its steady state (mixed-path populations
42.42 / 108.83 / 218.00 sequences, 155.48 / 353.85 / 708.88 µs per launch) are rebuilt here:

- per window: 3 fill forwards (mixed, populations 1/4, 1/2, 3/4 of the steady level), a steady
  run whose populations cycle through a pattern around the level, 3 drain forwards (decode);
  mixed forwards spread evenly over the steady run; call counts per path as published
  (gridX=1: 8,892 / 8,496 / 7,684; gridX=9: 1,368 / 2,664 / 5,400). C256's window begins
  16 layers before the end of a decode forward (7,684 = 213 x 36 + 16), which the analysis
  must align away.
- the mixed path's per-launch time is the published mean times population / (mean population
  of the steady mixed forwards), so its steady mean is the published figure (to the ns); the
  decode path's is 30 µs + 0.1 µs per sequence (it does not double when the population does).
- per layer on stream 7: a GEMM, the KV-cache write, the attention kernel, a Triton kernel and a
  second GEMM (GEMM time grows with the forward's tokens: its population, or 2,048 for a mixed
  forward, the scheduler's token budget). On stream 21 an elementwise kernel overlaps the
  first layers of every forward: busy time is the union, never the sum.
- `batch_dim` puts the batch in gridY (9 x B x 16) or gridZ (9 x 16 x B).
- the attention kernel is named as vllm-flash-attn instantiates it: one short name,
  `flash_fwd_splitkv_kernel`, two demangled names: Is_causal true on the forwards that hold a
  prefill, false on decode-only forwards (flash_api.cpp turns causal off when seqlen_q is 1).

`Truth` holds what the generator built: per window and path, the steady forwards, their mean
population and mean per-launch duration, and the calls per path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nsys_fixture import SESSION_START, NsysFixture, fa2_splitkv, model_config, windows_file

LAYERS = 36
HEADS = 16
TOKEN_BUDGET = 2048
ATTENTION = "flash_fwd_splitkv_kernel"
GAP_NS = 150_000  # between forwards (the engine's CPU work)
WINDOW_GAP_NS = 50_000_000
FILL = (0.25, 0.5, 0.75)
DRAIN = (0.6, 0.3, 0.1)
MIXED_X, DECODE_X = 9, 1


@dataclass(frozen=True)
class SeedPoint:
    label: str
    concurrency: int
    pattern: tuple[int, ...]  # steady populations, cycled
    mixed_us: float  # published mean duration of a mixed launch in the steady state
    mixed_calls: int  # published calls per path in the window
    decode_calls: int


POINTS = (
    SeedPoint("c0064", 64, (42, 43, 42, 42, 43), 155.48, 1_368, 8_892),
    SeedPoint("c0128", 128, (108, 109, 109, 110, 108, 109), 353.85, 2_664, 8_496),
    SeedPoint("c0256", 256, (216, 218, 220, 218), 708.88, 5_400, 7_684),
)
PUBLISHED_POPULATION = {"c0064": 42.42, "c0128": 108.83, "c0256": 218.00}


def decode_ns(pop: int) -> int:
    return 30_000 + 100 * pop


@dataclass
class PathTruth:
    forwards: int = 0
    population_sum: int = 0
    launch_ns_sum: int = 0

    @property
    def population_mean(self) -> float:
        return self.population_sum / self.forwards

    @property
    def kernel_us_mean(self) -> float:
        return self.launch_ns_sum / 1000.0 / (self.forwards * LAYERS)


@dataclass
class WindowTruth:
    calls: dict[int, int] = field(default_factory=lambda: {MIXED_X: 0, DECODE_X: 0})
    steady: dict[int, PathTruth] = field(
        default_factory=lambda: {MIXED_X: PathTruth(), DECODE_X: PathTruth()}
    )
    steady_first: int = len(FILL)
    steady_last: int = 0
    steady_population_mean: float = 0.0
    output_tokens: int = 0


@dataclass
class Truth:
    batch_dim: str
    windows: dict[str, WindowTruth] = field(default_factory=dict)

    def path(self, x: int) -> str:
        """The path's name as the analysis should write it (batch dimension masked)."""
        return f"{x}x*x{HEADS}" if self.batch_dim == "y" else f"{x}x{HEADS}x*"


def _grid(x: int, batch: int, batch_dim: str) -> tuple[int, int, int]:
    return (x, batch, HEADS) if batch_dim == "y" else (x, HEADS, batch)


def _forward(
    fx: NsysFixture,
    t: int,
    pop: int,
    x: int,
    launch_ns: int,
    batch_dim: str,
    layers: range = range(LAYERS),
) -> int:
    """One forward from t (only `layers` of it); returns its end."""
    tokens = TOKEN_BUDGET if x == MIXED_X else pop
    g1, g2 = 20_000 + 40 * tokens, 15_000 + 30 * tokens
    layer_ns = g1 + 3_000 + launch_ns + 4_000 + g2
    if layers.start == 0:
        fx.kernel(t + 10_000, 40_000, "elementwise_kernel", stream=21, grid=(256, 1, 1))
    for i in layers:
        s = t + i * layer_ns
        fx.kernel(s, g1, "sm80_xmma_gemm_bf16bf16_bf16f32", grid=(32, 4, 1))
        s += g1
        fx.kernel(s, 3_000, "reshape_and_cache_flash_kernel", grid=(pop, 1, 1))
        s += 3_000
        fx.kernel(
            s,
            launch_ns,
            ATTENTION,
            grid=_grid(x, pop, batch_dim),
            block=128,
            demangled=fa2_splitkv(causal=x == MIXED_X),
        )
        s += launch_ns
        fx.kernel(s, 4_000, "triton_poi_fused_mul_silu_0", grid=(64, 1, 1))
        fx.kernel(s + 4_000, g2, "sm80_xmma_gemm_bf16bf16_bf16f32", grid=(16, 4, 1))
    return t + LAYERS * layer_ns


def seed_trace(batch_dim: str = "y") -> tuple[NsysFixture, list[dict[str, object]], Truth]:
    """The export, its windows (wall-clock, epoch) and what was built."""
    fx = NsysFixture(gpus=((0, "NVIDIA A100-SXM4-80GB"),))
    truth = Truth(batch_dim)
    windows: list[dict[str, object]] = []
    t = 1_000_000
    for p in POINTS:
        wt = truth.windows[p.label] = WindowTruth()
        mixed = p.mixed_calls // LAYERS
        decode = p.decode_calls // LAYERS
        cut = p.decode_calls - decode * LAYERS  # layers of a decode forward cut by the start
        steady_n = mixed + decode - len(FILL) - len(DRAIN)
        steady_mixed = mixed - len(FILL)
        level = sum(p.pattern) / len(p.pattern)
        pops = [p.pattern[j % len(p.pattern)] for j in range(steady_n)]
        is_mixed = [
            (j + 1) * steady_mixed // steady_n > j * steady_mixed // steady_n
            for j in range(steady_n)
        ]
        mixed_mean = sum(q for q, m in zip(pops, is_mixed, strict=True) if m) / steady_mixed

        def mixed_ns(pop: int, p: SeedPoint = p, mixed_mean: float = mixed_mean) -> int:
            return round(p.mixed_us * 1000 * pop / mixed_mean)

        start = t
        if cut:  # a decode forward whose last `cut` layers fall inside the window
            pop0 = 12
            d0 = decode_ns(pop0)
            layer_ns = 20_000 + 40 * pop0 + 3_000 + d0 + 4_000 + 15_000 + 30 * pop0
            f0 = t - (LAYERS - cut) * layer_ns
            t = _forward(fx, f0, pop0, DECODE_X, d0, batch_dim, range(LAYERS - cut, LAYERS))
            wt.calls[DECODE_X] += cut
            t += GAP_NS
        plan: list[tuple[int, int, bool]] = []  # (population, x, steady)
        plan += [(round(f * level), MIXED_X, False) for f in FILL]
        plan += [(q, MIXED_X if m else DECODE_X, True) for q, m in zip(pops, is_mixed, strict=True)]
        plan += [(round(f * level), DECODE_X, False) for f in DRAIN]
        for pop, x, steady in plan:
            ns = mixed_ns(pop) if x == MIXED_X else decode_ns(pop)
            t = _forward(fx, t, pop, x, ns, batch_dim) + GAP_NS
            wt.calls[x] += LAYERS
            wt.output_tokens += pop
            if steady:
                pt = wt.steady[x]
                pt.forwards += 1
                pt.population_sum += pop
                pt.launch_ns_sum += ns * LAYERS
        wt.steady_last = len(FILL) + steady_n - 1
        wt.steady_population_mean = sum(pops) / steady_n
        assert wt.calls == {MIXED_X: p.mixed_calls, DECODE_X: p.decode_calls}
        windows.append(
            {
                "label": p.label,
                "start_ns": SESSION_START + start,
                "end_ns": SESSION_START + t,
                "clock": "epoch",
                "output_tokens": wt.output_tokens,
                "concurrency": p.concurrency,
                "requests": p.concurrency * 2,
            }
        )
        t += WINDOW_GAP_NS
    return fx, windows, truth


def write_seed(folder: Path, batch_dim: str = "y") -> tuple[Path, Path, Path, Truth]:
    """trace.sqlite, windows.json and config.json (36 layers) in `folder`."""
    fx, windows, truth = seed_trace(batch_dim)
    trace = fx.write(folder / "trace.sqlite")
    return (
        trace,
        windows_file(folder / "windows.json", windows),
        model_config(folder / "config.json", LAYERS),
        truth,
    )
