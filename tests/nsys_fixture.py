"""Nsight Systems SQLite exports, generated: the tables servelab reads, with nsys's own DDL.

The DDL below follows the Nsight Systems SQLite schema reference (column names, order,
NOT NULL, the unquoted `end` column). Tables are created lazily, as nsys does: a table with no
rows is left out. `ts="epoch"` writes timestamps as `nsys export --ts-normalize` does (UTC epoch
nanoseconds); the default counts from the session start.

As a real export: TARGET_INFO_GPU lists every GPU nsys sees, used or not (the host's; inside a
container only the container's, numbered from 0: `container_gpu`), each with its UUID, and
TARGET_INFO_CUDA_DEVICE maps each process's CUDA device id (the kernel table's deviceId) to
one of them, with the same UUID (by default CUDA device i is GPU i); every kernel has a
demangled name (a
template instantiation; `Kernel.demangled`, or one made from its short name), a short name and
a mangled name; every launch has its CUDA API call in CUPTI_ACTIVITY_KIND_RUNTIME on the
launching thread, with the kernel's correlationId (one cudaGraphLaunch per graph replay);
NVTX ranges carry their thread (globalTid), and a range outside a registered domain keeps its
text in `text` (as torch.cuda.nvtx.range writes vLLM's step ranges).
"""

from __future__ import annotations

import json
import sqlite3
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DDL = {
    "StringIds": """CREATE TABLE StringIds (
        id                          INTEGER   NOT NULL   PRIMARY KEY,
        value                       TEXT      NOT NULL
    )""",
    "CUPTI_ACTIVITY_KIND_KERNEL": """CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
        start                       INTEGER   NOT NULL,
        end                         INTEGER   NOT NULL,
        deviceId                    INTEGER   NOT NULL,
        contextId                   INTEGER   NOT NULL,
        streamId                    INTEGER   NOT NULL,
        correlationId               INTEGER,
        globalPid                   INTEGER,
        demangledName               INTEGER   NOT NULL,
        shortName                   INTEGER   NOT NULL,
        mangledName                 INTEGER,
        launchType                  INTEGER,
        cacheConfig                 INTEGER,
        registersPerThread          INTEGER   NOT NULL,
        gridX                       INTEGER   NOT NULL,
        gridY                       INTEGER   NOT NULL,
        gridZ                       INTEGER   NOT NULL,
        blockX                      INTEGER   NOT NULL,
        blockY                      INTEGER   NOT NULL,
        blockZ                      INTEGER   NOT NULL,
        staticSharedMemory          INTEGER   NOT NULL,
        dynamicSharedMemory         INTEGER   NOT NULL,
        localMemoryPerThread        INTEGER   NOT NULL,
        localMemoryTotal            INTEGER   NOT NULL,
        gridId                      INTEGER   NOT NULL,
        sharedMemoryExecuted        INTEGER,
        graphNodeId                 INTEGER,
        sharedMemoryLimitConfig     INTEGER
    )""",
    "NVTX_EVENTS": """CREATE TABLE NVTX_EVENTS (
        start                       INTEGER   NOT NULL,
        end                         INTEGER,
        eventType                   INTEGER   NOT NULL,
        rangeId                     INTEGER,
        category                    INTEGER,
        color                       INTEGER,
        text                        TEXT,
        globalTid                   INTEGER,
        endGlobalTid                INTEGER,
        textId                      INTEGER,
        domainId                    INTEGER,
        uint64Value                 INTEGER,
        int64Value                  INTEGER,
        doubleValue                 REAL,
        uint32Value                 INTEGER,
        int32Value                  INTEGER,
        floatValue                  REAL,
        jsonTextId                  INTEGER,
        jsonText                    TEXT
    )""",
    "CUPTI_ACTIVITY_KIND_RUNTIME": """CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (
        start                       INTEGER   NOT NULL,
        end                         INTEGER   NOT NULL,
        eventClass                  INTEGER   NOT NULL,
        globalTid                   INTEGER,
        correlationId               INTEGER,
        nameId                      INTEGER   NOT NULL,
        returnValue                 INTEGER   NOT NULL,
        callchainId                 INTEGER
    )""",
    "TARGET_INFO_CUDA_DEVICE": """CREATE TABLE TARGET_INFO_CUDA_DEVICE (
        gpuId                       INTEGER   NOT NULL,
        cudaId                      INTEGER   NOT NULL,
        pid                         INTEGER,
        uuid                        TEXT,
        numMultiprocessors          INTEGER
    )""",
    "TARGET_INFO_SESSION_START_TIME": """CREATE TABLE TARGET_INFO_SESSION_START_TIME (
        utcEpochNs                  INTEGER,
        utcTime                     TEXT,
        localTime                   TEXT
    )""",
    "TARGET_INFO_GPU": """CREATE TABLE TARGET_INFO_GPU (
        vmId                        INTEGER   NOT NULL,
        id                          INTEGER   NOT NULL,
        name                        TEXT,
        busLocation                 TEXT,
        isDiscrete                  INTEGER,
        l2CacheSize                 INTEGER,
        totalMemory                 INTEGER,
        memoryBandwidth             INTEGER,
        clockRate                   INTEGER,
        smCount                     INTEGER,
        pwGpuId                     INTEGER,
        uuid                        TEXT,
        luid                        INTEGER,
        chipName                    TEXT,
        cuDevice                    INTEGER,
        ctxswDevPath                TEXT,
        ctrlDevPath                 TEXT,
        revision                    INTEGER,
        nodeMask                    INTEGER,
        constantMemory              INTEGER,
        maxIPC                      INTEGER,
        maxRegistersPerBlock        INTEGER,
        maxShmemPerBlock            INTEGER,
        maxShmemPerBlockOptin       INTEGER,
        maxShmemPerSm               INTEGER,
        maxRegistersPerSm           INTEGER,
        threadsPerWarp              INTEGER,
        asyncEngines                INTEGER,
        maxWarpsPerSm               INTEGER,
        maxBlocksPerSm              INTEGER,
        maxThreadsPerBlock          INTEGER,
        maxBlockDimX                INTEGER,
        maxBlockDimY                INTEGER,
        maxBlockDimZ                INTEGER,
        maxGridDimX                 INTEGER,
        maxGridDimY                 INTEGER,
        maxGridDimZ                 INTEGER,
        computeMajor                INTEGER,
        computeMinor                INTEGER,
        smMajor                     INTEGER,
        smMinor                     INTEGER
    )""",
    "META_DATA_EXPORT": """CREATE TABLE META_DATA_EXPORT (
        name                        TEXT      NOT NULL,
        value                       TEXT
    )""",
    "ENUM_NSYS_EVENT_TYPE": """CREATE TABLE ENUM_NSYS_EVENT_TYPE (
        id                          INTEGER   NOT NULL   PRIMARY KEY,
        name                        TEXT,
        label                       TEXT
    )""",
}
NVTX_TYPES = [
    (33, "NvtxCategory", "NVTX Category"),
    (34, "NvtxMark", "NVTX Mark"),
    (39, "NvtxThread", "NVTX Thread"),
    (59, "NvtxPushPopRange", "NVTX PushPop Range"),
    (60, "NvtxStartEndRange", "NVTX StartEnd Range"),
    (75, "NvtxDomainCreate", "NVTX Domain Create"),
    (76, "NvtxDomainDestroy", "NVTX Domain Destroy"),
]
SESSION_START = 1_790_000_000_000_000_000
PID = 4242
GLOBAL_PID = (1 << 56) | (PID << 24)  # serialized: PID = globalPid / 0x1000000 % 0x1000000
CLIENT_TID = 7  # the thread of the client's NVTX ranges
WORKER_TID = 11  # the server's worker thread: kernel launches and vLLM's step ranges
LAUNCH_LEAD_NS = 3_000  # a kernel starts this long after its launch call, by default
KERNEL_INSERT = (
    "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES "
    "(?, ?, ?, 1, ?, ?, ?, ?, ?, ?, 1, 0, 64, ?, ?, ?, ?, 1, 1, 0, 0, 0, 0, ?, 0, ?, 1)"
)


@dataclass
class Kernel:
    start: int
    end: int
    name: str
    device: int = 0
    stream: int = 7
    grid: tuple[int, int, int] = (1, 1, 1)
    block: int = 128
    graph_node: int | None = None
    correlation: int | None = None
    demangled: str | None = None  # the instantiation; None: made from the short name
    pid: int = PID
    tid: int = WORKER_TID
    launch: int | None = None  # the launch call's start; None: LAUNCH_LEAD_NS before start


@dataclass
class NvtxRange:
    start: int
    end: int | None
    message: str
    payload: int | None = None
    registered: bool = True
    domain: str | None = "servelab"
    event_type: int = 60
    tid: int = CLIENT_TID
    pid: int = PID


@dataclass
class NsysFixture:
    session_start: int = SESSION_START
    gpus: Sequence[tuple[int, str]] = ((0, "NVIDIA H100 80GB HBM3"),)
    kernels: list[Kernel] = field(default_factory=list)
    ranges: list[NvtxRange] = field(default_factory=list)
    strings: dict[str, int] = field(default_factory=dict)
    # TARGET_INFO_CUDA_DEVICE rows (gpuId, cudaId, pid); None: CUDA device i is GPU i
    cuda_devices: Sequence[tuple[int, int, int]] | None = None
    # TARGET_INFO_GPU.id -> its UUID (None: no UUID); absent ids: gpu_uuid(id)
    uuids: dict[int, str | None] = field(default_factory=dict)
    sm_count: int = 132

    def uuid(self, gid: int) -> str | None:
        return self.uuids[gid] if gid in self.uuids else gpu_uuid(gid)

    def string(self, value: str) -> int:
        if value not in self.strings:
            self.strings[value] = len(self.strings) + 1
        return self.strings[value]

    def kernel(self, start: int, dur: int, name: str, **kw: object) -> Kernel:
        k = Kernel(start, start + dur, name, **kw)  # type: ignore[arg-type]
        self.kernels.append(k)
        return k

    def write(
        self, path: Path, ts: str = "trace", omit: Iterable[str] = (), shuffle: bool = False
    ) -> Path:
        """Write the export. `shuffle` stores kernel rows out of start order."""
        omit = set(omit)
        shift = self.session_start if ts == "epoch" else 0
        if path.exists():
            path.unlink()
        con = sqlite3.connect(path)

        def make(table: str) -> bool:
            if table in omit:
                return False
            con.execute(DDL[table])
            return True

        # strings first so ids are stable: kernel names, then NVTX messages, then API names
        for k in self.kernels:
            self.string(k.name)
            self.string(_demangled_of(k))
            self.string(_mangled(k))
        for r in self.ranges:
            if r.registered:
                self.string(r.message)
        for api in (LAUNCH_API, GRAPH_API):
            self.string(api)
        if make("StringIds"):
            con.executemany(
                "INSERT INTO StringIds VALUES (?, ?)", [(i, v) for v, i in self.strings.items()]
            )
        if make("ENUM_NSYS_EVENT_TYPE"):
            con.executemany("INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?, ?)", NVTX_TYPES)
        if make("TARGET_INFO_SESSION_START_TIME"):
            con.execute(
                "INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, ?, ?)",
                (self.session_start, "2026-09-21T14:13:20.000Z", "2026-09-21T16:13:20.000"),
            )
        if make("META_DATA_EXPORT"):
            con.executemany(
                "INSERT INTO META_DATA_EXPORT VALUES (?, ?)",
                [
                    ("EXPORT_SCHEMA_VERSION", "3.16.1"),
                    ("EXPORT_PRODUCT_VERSION", "2024.6.2.225"),
                    ("EXPORT_PARAM_INPUT_FILE", "/tmp/servelab-fixture.nsys-rep"),
                ],
            )
        if self.gpus and make("TARGET_INFO_GPU"):
            for gid, name in self.gpus:
                con.execute(
                    "INSERT INTO TARGET_INFO_GPU (vmId, id, name, busLocation, smCount, uuid, "
                    "computeMajor, computeMinor) VALUES (0, ?, ?, ?, ?, ?, 9, 0)",
                    (gid, name, f"0000:{gid + 1:02x}:00.0", self.sm_count, self.uuid(gid)),
                )
        cuda = self.cuda_devices
        if cuda is None:
            cuda = [(gid, gid, PID) for gid, _ in self.gpus]
        if cuda and make("TARGET_INFO_CUDA_DEVICE"):
            con.executemany(
                "INSERT INTO TARGET_INFO_CUDA_DEVICE VALUES (?, ?, ?, ?, ?)",
                [(g, c, p, self.uuid(g), self.sm_count) for g, c, p in cuda],
            )
        corr = [
            k.correlation if k.correlation is not None else i + 1
            for i, k in enumerate(self.kernels)
        ]
        if self.kernels and make("CUPTI_ACTIVITY_KIND_KERNEL"):
            rows = [
                (
                    k.start + shift,
                    k.end + shift,
                    k.device,
                    k.stream,
                    corr[i],
                    _global(k.pid),
                    self.strings[_demangled_of(k)],
                    self.strings[k.name],
                    self.strings[_mangled(k)],
                    *k.grid,
                    k.block,
                    i + 1,
                    k.graph_node,
                )
                for i, k in enumerate(self.kernels)
            ]
            rows.sort(key=lambda r: (r[0], r[2], r[3]))
            if shuffle:
                rows = rows[1::2] + rows[0::2]
            con.executemany(KERNEL_INSERT, rows)
        if self.kernels and make("CUPTI_ACTIVITY_KIND_RUNTIME"):
            # one launch call per correlation id: a kernel launch, or a graph replay's
            # cudaGraphLaunch (its first kernel's launch time)
            calls: dict[tuple[int, int], tuple[int, int, bool]] = {}
            for i, k in enumerate(self.kernels):
                at = k.launch if k.launch is not None else k.start - LAUNCH_LEAD_NS
                key = (k.pid, corr[i])
                prev = calls.get(key)
                if prev is None or at < prev[0]:
                    calls[key] = (at, k.tid, k.graph_node is not None)
            con.executemany(
                "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 1, ?, ?, ?, 0, NULL)",
                sorted(
                    (
                        at + shift,
                        at + shift + 2_000,
                        _global(pid) | tid,
                        c,
                        self.strings[GRAPH_API if graph else LAUNCH_API],
                    )
                    for (pid, c), (at, tid, graph) in calls.items()
                ),
            )
        if self.ranges and make("NVTX_EVENTS"):
            domains: dict[str, int] = {}
            for r in self.ranges:
                if r.domain and r.domain not in domains:
                    domains[r.domain] = len(domains) + 1
                    con.execute(
                        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, "
                        "domainId) VALUES (?, NULL, 75, ?, ?, ?)",
                        (shift, r.domain, _global(r.pid) | r.tid, domains[r.domain]),
                    )
            for n, r in enumerate(self.ranges):
                con.execute(
                    "INSERT INTO NVTX_EVENTS (start, end, eventType, rangeId, text, globalTid, "
                    "endGlobalTid, textId, domainId, int64Value) VALUES (?, ?, ?, ?, ?, ?, ?, "
                    "?, ?, ?)",
                    (
                        r.start + shift,
                        r.end + shift if r.end is not None else None,
                        r.event_type,
                        n + 1,
                        None if r.registered else r.message,
                        _global(r.pid) | r.tid,
                        _global(r.pid) | r.tid,
                        self.strings[r.message] if r.registered else None,
                        domains.get(r.domain) if r.domain else 0,
                        r.payload,
                    ),
                )
        con.commit()
        con.close()
        return path


def gpu_uuid(index: int) -> str:
    """The UUID of the host's GPU `index`, as NVML writes it (`GPU-` and 32 hex digits; the
    format of tests/telemetry_fakes.fake_uuid, so the telemetry fakes' GPU i is this one)."""
    return f"GPU-5e1ab{index:03x}-7d2c-4f1e-9a3b-{0xC0FFEE000000 + index:012x}"


def container_gpu(host_index: int, name: str = "NVIDIA H100 80GB HBM3") -> NsysFixture:
    """An export of a server in a container given the host's GPU `host_index` alone: nsys sees
    that one GPU and lists it with id 0 (its CUDA device 0), under the host GPU's UUID."""
    return NsysFixture(gpus=((0, name),), uuids={0: gpu_uuid(host_index)})


LAUNCH_API = "cudaLaunchKernel_v7000"
GRAPH_API = "cudaGraphLaunch_v10000"


def _global(pid: int) -> int:
    return (1 << 56) | (pid << 24)


def _demangled(name: str) -> str:
    if name.startswith(("triton_", "nccl")):
        return name
    return f"void {name}<(int)128, true>(Params)"


def _demangled_of(k: Kernel) -> str:
    return k.demangled if k.demangled is not None else _demangled(k.name)


def _mangled(k: Kernel) -> str:
    if k.name.startswith(("triton_", "nccl")):
        return k.name
    tag = zlib.crc32(_demangled_of(k).encode()) % 10_000  # one per instantiation
    return f"_Z{len(k.name)}{k.name}ILi{tag}EEv6Params"


# FlashAttention-2's split-KV kernel as vllm-flash-attn instantiates it (flash_api.cpp,
# flash_fwd_launch_template.h): Flash_fwd_kernel_traits<head dim, block M, block N, warps,
# Q in regs, share Q/K smem, element type, base traits>, then Is_causal, Is_local, Has_alibi,
# Is_even_MN, Is_even_K, Is_softcap, Split, Append_KV. A decode-only forward (seqlen_q 1)
# runs with Is_causal false, a forward that holds a prefill with Is_causal true.
FA2_TRAITS = (
    "Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t, "
    "Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t>>"
)


def fa2_splitkv(causal: bool, even_mn: bool = False, split: bool = False) -> str:
    flags = [causal, False, False, even_mn, True, False, split, False]
    args = ", ".join("true" if f else "false" for f in flags)
    return f"void flash::flash_fwd_splitkv_kernel<{FA2_TRAITS}, {args}>(Flash_fwd_params)"


def step_name(context: int, context_tokens: int, generation: int) -> str:
    """vLLM's step range name (gpu_worker.annotate_profile): a decode request schedules one
    token."""
    return f"execute_context_{context}({context_tokens})_generation_{generation}({generation})"


def windows_file(path: Path, windows: Sequence[dict[str, object]]) -> Path:
    path.write_text(json.dumps({"format_version": 1, "windows": list(windows)}), "utf-8")
    return path


def model_config(path: Path, layers: int) -> Path:
    path.write_text(
        json.dumps({"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": layers}), "utf-8"
    )
    return path


# --- the known-answer scenario ------------------------------------------------------------
#
# A 3-layer model (not 36) whose attention kernel has grid (2, batch, 4) (not 9): the analysis
# must find both. The host has 8 H100s (TARGET_INFO_GPU ids 0-7); the server's process sees
# one of them, GPU 3, as its CUDA device 0 (CUDA_VISIBLE_DEVICES=3): the kernels' deviceId is
# 0, TARGET_INFO_CUDA_DEVICE maps it to GPU 3, and the other 7 GPUs are idle. Two windows:
#
#   c0001: 4 forwards, population 1.
#   c0002: 6 forwards, populations 1 (fill), 2, 2, 2, 2, 1 (drain).
#
# Each forward, per layer, on stream 7, back to back from the forward's start t:
#   gemm "nvjet_gemm" 10 us, attention "flash_fwd_kernel" (3 + 2 x batch) us,
#   "triton_fused_act" 2 us, gemm 8 us: a layer lasts 25 + 2 x batch us, and a forward
#   3 x (25 + 2b) us. Decode forwards (all but each window's first) are graph-replayed
#   (graphNodeId set, one correlation id per replay).
# On stream 21, "ncclDevKernel_AllReduce" of 30 us starts 60 us into every forward: it
# overlaps the compute stream, so busy time is the union, never the sum.
# Forwards start every 200 us. The NVTX range of c0002's window starts 5 us before its
# first forward; its wall-clock window (written in windows.json) is 40 us wider on each side.
# vLLM's worker wraps each step in an NVTX push/pop range (default domain, text) from 20 us
# before its forward's first kernel to the forward's end; the launches lie inside it.
# c0001: one prefill (1 request of 32 tokens), then decode 1; c0002: prefill 1, then a step
# with 1 prefill and 1 decode, decode 2 (x3), decode 1. Each kernel's launch call is 3 us
# before it (graph replays: one cudaGraphLaunch 3 us before the replay's first kernel).

FORWARD_PERIOD = 200_000
LAYERS = 3
C1_START = 1_000_000
C2_START = 3_000_000
C1_POPS = [1, 1, 1, 1]
C2_POPS = [1, 2, 2, 2, 2, 1]
# (context requests, generation requests) of each forward's step
C1_STEPS = [(1, 0), (0, 1), (0, 1), (0, 1)]
C2_STEPS = [(1, 0), (1, 1), (0, 2), (0, 2), (0, 2), (0, 1)]
PROMPT_TOKENS = 32
HOST_GPUS = tuple((i, "NVIDIA H100 80GB HBM3") for i in range(8))
SERVING_GPU = 3  # TARGET_INFO_GPU.id of the process's CUDA device 0


def layer_ns(batch: int) -> int:
    return 25_000 + 2_000 * batch


def add_forward(fx: NsysFixture, t: int, batch: int, graph: bool, corr: int) -> None:
    node = 100 if graph else None
    for layer in range(LAYERS):
        s = t + layer * layer_ns(batch)
        extra = {
            "graph_node": node + layer * 4 if node else None,
            "correlation": corr if graph else None,
        }
        fx.kernel(s, 10_000, "nvjet_gemm", grid=(16, 2, 1), **extra)
        fx.kernel(
            s + 10_000, 3_000 + 2_000 * batch, "flash_fwd_kernel", grid=(2, batch, 4), **extra
        )
        s2 = s + 13_000 + 2_000 * batch
        fx.kernel(s2, 2_000, "triton_fused_act", grid=(64, 1, 1), **extra)
        fx.kernel(s2 + 2_000, 8_000, "nvjet_gemm", grid=(16, 2, 1), **extra)
    fx.kernel(t + 60_000, 30_000, "ncclDevKernel_AllReduce", stream=21, grid=(4, 1, 1))


def scenario() -> NsysFixture:
    fx = NsysFixture(gpus=HOST_GPUS, cuda_devices=((SERVING_GPU, 0, PID),))
    corr = 10_000
    for start, pops, steps in ((C1_START, C1_POPS, C1_STEPS), (C2_START, C2_POPS, C2_STEPS)):
        for i, (b, (ctx, gen)) in enumerate(zip(pops, steps, strict=True)):
            corr += 1
            t = start + i * FORWARD_PERIOD
            add_forward(fx, t, b, graph=i > 0, corr=corr)
            name = step_name(ctx, ctx * PROMPT_TOKENS, gen)
            fx.ranges.append(step_range(t - 20_000, t + LAYERS * layer_ns(b), name))
    # requests of c0002 as NVTX start/end ranges (registered message, request index payload)
    end2 = C2_START + 5 * FORWARD_PERIOD + 3 * layer_ns(1)
    fx.ranges.append(NvtxRange(C2_START - 5_000, end2, "c0002", payload=0))
    fx.ranges.append(NvtxRange(C2_START + FORWARD_PERIOD - 5_000, end2 - 1_000, "c0002", payload=1))
    # an unrelated range in another domain with the same text must be ignored
    fx.ranges.append(NvtxRange(0, 10_000, "c0001", payload=None, domain="other"))
    return fx


def step_range(start: int, end: int, name: str, tid: int = WORKER_TID) -> NvtxRange:
    """A vLLM step range as torch.cuda.nvtx.range writes it: push/pop, default domain, its
    text unregistered, on the worker's thread."""
    return NvtxRange(start, end, name, registered=False, domain=None, event_type=59, tid=tid)


def scenario_windows(ts_epoch: bool = True) -> list[dict[str, object]]:
    """Wall-clock windows: c0001 exactly around its forwards, c0002 40 us wider each side."""
    base = SESSION_START if ts_epoch else 0
    clock = "epoch" if ts_epoch else "trace"
    c1_end = C1_START + 3 * FORWARD_PERIOD + 3 * layer_ns(1)
    c2_end = C2_START + 5 * FORWARD_PERIOD + 3 * layer_ns(1)
    return [
        {
            "label": "c0001",
            "start_ns": base + C1_START,
            "end_ns": base + c1_end + 10_000,
            "clock": clock,
            "output_tokens": 4,
            "concurrency": 1,
        },
        {
            "label": "c0002",
            "start_ns": base + C2_START - 40_000,
            "end_ns": base + c2_end + 40_000,
            "clock": clock,
            "output_tokens": 10,
            "concurrency": 2,
        },
    ]


# --- one study, two attention kernels ------------------------------------------------------
#
# The same forwards run by FlashAttention-2 (an A100) and by FlashAttention-3 (an H100), on a
# 4-layer model with 8 heads, at concurrency 4, 8 and 16; every forward is one vLLM step and
# its NVTX range says how many requests it holds (the step's population). Per window: 3 fill
# forwards that admit requests (mixed: a prefill with decodes), a steady run at the
# concurrency where every 4th forward is mixed, 2 drain forwards (decode). c0016's window
# begins inside a decode forward: its last STUDY_CUT layers fall in the window and the analysis
# must align them away.
#
# FA2 (flash_api.cpp, vllm-flash-attn's varlen split-KV kernel): grid (9, B, 8) on forwards
# that hold a prefill (Is_causal true), (1, B, 8) on decode-only ones (Is_causal false): gridY
# is the batch B. FA3 (hopper/tile_scheduler.hpp: VarlenDynamicPersistentTileScheduler::
# get_grid_shape returns {num_sm}): every launch has grid (132, 1, 1), the H100's SM count,
# whatever the batch; the two code paths are two instantiations of cutlass::device_kernel<
# flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<...>>> (Is_causal true / false). The
# population is then only in the step ranges. Launch times are the same in both: a mixed
# launch 5 us + 0.5 us x B^2 (it grows faster than the tokens: C8 -> C16 localises to it), a
# decode launch 8 us + 0.1 us per sequence.

STUDY_LAYERS = 4
STUDY_HEADS = 8
STUDY_CUT = 3
STUDY_PROMPT = 96  # tokens of the prefill in a mixed forward
H100_SMS = 132
STUDY_LEVELS = {"c0004": 4, "c0008": 8, "c0016": 16}
STUDY_STEADY = 24
STUDY_GAP_NS = 120_000  # between forwards (the engine's CPU work)


def fa3_fwd(causal: bool) -> str:
    """FlashAttention-3's forward kernel as cutlass wraps it (varlen, persistent scheduler)."""
    flags = ", ".join("true" if f else "false" for f in (causal, False, False, True))
    return (
        "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
        "flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1>>, "
        "cute::tuple<cute::C<128>, cute::C<176>, cute::C<128>>, 128, cutlass::bfloat16_t, "
        f"float, cutlass::arch::Sm90, {flags}, true, false, true, false>, "
        "flash::CollectiveEpilogueFwd<cute::tuple<cute::C<128>>, cute::tuple<cute::C<1>>, 128, "
        "cutlass::bfloat16_t, cutlass::arch::Sm90, 256, true, true, false, false>, "
        "flash::VarlenDynamicPersistentTileScheduler<128, 176, 256, 128, false, true, true, "
        "true, true>>>>(T1::Params)"
    )


def study_launch_ns(mixed: bool, batch: int) -> int:
    return 5_000 + 500 * batch * batch if mixed else 8_000 + 100 * batch


def _study_forward(
    fx: NsysFixture, t: int, batch: int, mixed: bool, kernel: str, layers: range
) -> int:
    """One forward from t (only `layers` of it), inside its step range; returns its end."""
    tokens = STUDY_PROMPT + batch - 1 if mixed else batch
    attn = study_launch_ns(mixed, batch)
    layer_ns = 10_000 + 10 * tokens + attn + 2_000 + 8_000
    s = t
    for _ in layers:
        fx.kernel(s, 10_000 + 10 * tokens, "nvjet_gemm", grid=(32, 4, 1))
        s += 10_000 + 10 * tokens
        if kernel == "fa2":
            fx.kernel(s, attn, "flash_fwd_splitkv_kernel",
                      grid=(9 if mixed else 1, batch, STUDY_HEADS), demangled=fa2_splitkv(mixed))  # fmt: skip
        else:
            fx.kernel(s, attn, "device_kernel", grid=(H100_SMS, 1, 1), demangled=fa3_fwd(mixed))
        s += attn
        fx.kernel(s, 2_000, "triton_poi_fused_mul_silu_0", grid=(64, 1, 1))
        fx.kernel(s + 2_000, 8_000, "nvjet_gemm", grid=(16, 4, 1))
        s += 10_000
    ctx, gen = (1, batch - 1) if mixed else (0, batch)
    name = f"execute_context_{ctx}({STUDY_PROMPT if mixed else 0})_generation_{gen}({gen})"
    start = t - 20_000 - (STUDY_LAYERS - len(layers)) * layer_ns
    fx.ranges.append(step_range(start, s, name))
    return s


def attention_study(kernel: str) -> tuple[NsysFixture, list[dict[str, object]]]:
    """The study as `kernel` ("fa2": A100, FlashAttention-2; "fa3": H100, FlashAttention-3)
    runs it: the export and its windows (epoch clock)."""
    gpu = "NVIDIA A100-SXM4-80GB" if kernel == "fa2" else "NVIDIA H100 80GB HBM3"
    fx = NsysFixture(gpus=((0, gpu),), sm_count=108 if kernel == "fa2" else H100_SMS)
    windows: list[dict[str, object]] = []
    t = 1_000_000
    for label, level in STUDY_LEVELS.items():
        plan = [(max(1, level * k // 4), True) for k in (1, 2, 3)]
        plan += [(level, j % 4 == 3) for j in range(STUDY_STEADY)]
        plan += [(max(1, level // 2), False), (max(1, level // 4), False)]
        start = t
        if label == "c0016":  # a decode forward cut by the window's start
            cut = range(STUDY_LAYERS - STUDY_CUT, STUDY_LAYERS)
            t = _study_forward(fx, t, level, False, kernel, cut) + STUDY_GAP_NS
        tokens = 0
        for batch, mixed in plan:
            t = _study_forward(fx, t, batch, mixed, kernel, range(STUDY_LAYERS)) + STUDY_GAP_NS
            tokens += batch
        windows.append(
            {
                "label": label,
                "start_ns": SESSION_START + start,
                "end_ns": SESSION_START + t,
                "clock": "epoch",
                "output_tokens": tokens,
                "concurrency": level,
                "requests": 2 * level,
            }
        )
        t += 50_000_000
    return fx, windows
