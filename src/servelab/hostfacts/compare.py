"""Comparing the hosts of two runs: every recorded host fact, classified as a
performance-relevant difference, another difference, or unknown, and the words a verdict
uses for the result."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

from servelab.documents.declared import HostComparison, UnknownRow
from servelab.hostfacts.cpu import ISA_FLAGS

# A CPU frequency within this margin of the other host's counts as the same (turbo, rounding,
# and the MHz a VM reports move a few percent between boots of the same machine type).
FREQUENCY_MARGIN_PCT = 5.0


class _Missing:
    """A fact the record does not hold at all (an older bundle, a runtime not probed)."""

    def __repr__(self) -> str:
        return "MISSING"


class _NotApplicable:
    """A fact that does not apply to the run (the runtime's CPU ISA on a GPU run)."""

    def __repr__(self) -> str:
        return "N/A"


MISSING: Final = _Missing()
_NA: Final = _NotApplicable()
# A fact as a getter reads it from a provenance record: the recorded JSON value, compared
# only by equality (and by _near), or MISSING or _NA.
Getter = Callable[[Mapping[str, object]], object]


def _host(p: Mapping[str, object]) -> Mapping[str, object]:
    h = p.get("host")
    return h if isinstance(h, Mapping) else {}


def _key(p: Mapping[str, object], key: str) -> object:
    h = _host(p)
    return h[key] if key in h else MISSING


def _cpu(key: str, none: object = None) -> Getter:
    """A cpu_facts key; `none` is what a recorded None means (None: the host could not say)."""

    def get(p: Mapping[str, object]) -> object:
        cf = _host(p).get("cpu_facts")
        if not isinstance(cf, Mapping) or key not in cf:
            return MISSING
        return none if cf[key] is None else cf[key]

    return get


def _flag(name: str) -> Getter:
    def get(p: Mapping[str, object]) -> object:
        flags = _cpu("flags")(p)
        return flags.get(name, MISSING) if isinstance(flags, Mapping) else flags

    return get


def _model_name(p: Mapping[str, object]) -> object:
    name = _cpu("model_name")(p)
    return _key(p, "cpu") if name is MISSING or name is None else name


def _frequency(p: Mapping[str, object]) -> object:
    top, now = _cpu("max_mhz")(p), _cpu("mhz")(p)
    if top is MISSING and now is MISSING:
        return MISSING
    return top if top not in (None, MISSING) else (None if now is MISSING else now)


def _near(a: object, b: object) -> bool:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return bool(a == b)
    return abs(100.0 * (a / b - 1.0)) <= FREQUENCY_MARGIN_PCT


def _gpus(p: Mapping[str, object]) -> list[object] | _Missing:
    g = _host(p).get("gpus")
    return g if isinstance(g, list) else MISSING


def _per_gpu(key: str) -> Getter:
    """The value of every GPU in index order ([] with no GPU)."""

    def get(p: Mapping[str, object]) -> object:
        gpus = _gpus(p)
        if isinstance(gpus, _Missing) or not gpus:
            return gpus if isinstance(gpus, _Missing) else []
        recorded = [g for g in gpus if isinstance(g, Mapping) and key in g]
        if len(recorded) < len(gpus):
            return MISSING
        values = [g[key] for g in recorded]
        return None if all(v is None for v in values) else values

    return get


def _cuda(p: Mapping[str, object]) -> object:
    gpus = _gpus(p)
    if isinstance(gpus, _Missing) or not gpus:
        return gpus if isinstance(gpus, _Missing) else []
    return _key(p, "cuda")


def _pairs(p: Mapping[str, object]) -> object:
    gpus = _gpus(p)
    if isinstance(gpus, _Missing) or len(gpus) < 2:
        return gpus if isinstance(gpus, _Missing) else []
    pairs = _host(p).get("gpu_topology")
    if not isinstance(pairs, list):
        return MISSING
    return [
        f"{q.get('a')}-{q.get('b')}:"
        + ("NVLINK" if q.get("nvlink") else str(q.get("common_ancestor")))
        for q in pairs
    ]


def _runtime_isa(key: str) -> Getter:
    """What the server runtime reported (CPU runs only: on a GPU the CPU ISA is not what
    computes)."""

    def get(p: Mapping[str, object]) -> object:
        gpus = _gpus(p)
        if isinstance(gpus, list) and gpus:
            return _NA
        runtime = p.get("runtime") or {}
        isa = runtime.get("isa") if isinstance(runtime, Mapping) else None
        if not isinstance(isa, Mapping):
            return MISSING
        return isa.get(key)

    return get


def _env_caps(p: Mapping[str, object]) -> object:
    value = _runtime_isa("env")(p)
    return {} if value is None else value


_Same = Callable[[object, object], bool]


def _eq(a: object, b: object) -> bool:
    return bool(a == b)


# (fact, short name, performance-relevant, getter, comparison): the order is the order in which
# a verdict names them, what explains a CPU difference first. docs/reproduce.md says why each
# one is (or is not) performance-relevant.
HOST_FACTS: list[tuple[str, str, bool, Getter, _Same]] = [
    ("runtime.cpu_capability", "PyTorch CPU capability", True, _runtime_isa("cpu_capability"), _eq),
    ("runtime.onednn_isa", "oneDNN ISA", True, _runtime_isa("onednn_isa"), _eq),
    ("runtime.isa_env", "ISA caps in the server env", True, _env_caps, _eq),
    ("cpu.isa_class", "ISA class", True, _cpu("isa_class"), _eq),
    *[(f"cpu.{f}", f, True, _flag(f), _eq) for f in ISA_FLAGS],
    ("host.machine", "architecture", True, lambda p: _key(p, "machine"), _eq),
    ("cpu.vendor", "CPU vendor", True, _cpu("vendor"), _eq),
    ("cpu.family", "CPU family", True, _cpu("family"), _eq),
    ("cpu.model", "CPU model", True, _cpu("model"), _eq),
    ("cpu.stepping", "CPU stepping", True, _cpu("stepping"), _eq),
    ("cpu.model_name", "CPU model name", True, _model_name, _eq),
    ("cpu.frequency_mhz", "CPU frequency", True, _frequency, _near),
    ("cpu.logical_cpus", "logical CPUs", True, lambda p: _key(p, "cores"), _eq),
    ("cpu.affinity_cpus", "CPU affinity", True, _cpu("affinity_cpus"), _eq),
    ("cpu.cgroup_cpu_quota", "cgroup CPU quota", True, _cpu("cgroup_cpu_quota", "unlimited"), _eq),
    ("cpu.threads_per_core", "SMT", True, _cpu("threads_per_core"), _eq),
    ("cpu.cores_per_socket", "cores per socket", True, _cpu("cores_per_socket"), _eq),
    ("cpu.sockets", "sockets", True, _cpu("sockets"), _eq),
    ("cpu.numa_nodes", "NUMA nodes", True, _cpu("numa_nodes"), _eq),
    ("cpu.hypervisor", "hypervisor", True, _cpu("hypervisor"), _eq),
    ("gpu.name", "GPU model", True, _per_gpu("name"), _eq),
    ("gpu.memory_total_bytes", "GPU memory", True, _per_gpu("memory_total_bytes"), _eq),
    ("gpu.max_sm_clock_mhz", "GPU max SM clock", True, _per_gpu("max_sm_clock_mhz"), _eq),
    ("gpu.max_mem_clock_mhz", "GPU max memory clock", True, _per_gpu("max_mem_clock_mhz"), _eq),
    (
        "gpu.applied_sm_clock_mhz",
        "GPU applied SM clock",
        True,
        _per_gpu("applied_sm_clock_mhz"),
        _eq,
    ),
    (
        "gpu.applied_mem_clock_mhz",
        "GPU applied memory clock",
        True,
        _per_gpu("applied_mem_clock_mhz"),
        _eq,
    ),
    ("gpu.power_limit_w", "GPU power limit", True, _per_gpu("power_limit_w"), _eq),
    ("gpu.mig_mode", "MIG mode", True, _per_gpu("mig_mode"), _eq),
    ("gpu.ecc_mode", "ECC mode", True, _per_gpu("ecc_mode"), _eq),
    ("gpu.pcie_max_gen", "PCIe generation", True, _per_gpu("pcie_max_gen"), _eq),
    ("gpu.pcie_max_width", "PCIe width", True, _per_gpu("pcie_max_width"), _eq),
    ("gpu.nvlinks_active", "NVLinks", True, _per_gpu("nvlinks_active"), _eq),
    ("gpu.topology", "GPU topology", True, _pairs, _eq),
    ("gpu.driver", "GPU driver", True, _per_gpu("driver"), _eq),
    ("gpu.cuda", "CUDA driver version", True, _cuda, _eq),
    ("host.memory_bytes", "memory size", False, lambda p: _key(p, "memory_bytes"), _eq),
    ("host.os", "OS", False, lambda p: _key(p, "os"), _eq),
    ("host.kernel", "kernel", False, lambda p: _key(p, "kernel"), _eq),
    ("host.python", "pipeline Python", False, lambda p: _key(p, "python"), _eq),
    ("cpu.affinity", "CPU ids", False, _cpu("affinity"), _eq),
    ("gpu.vbios", "VBIOS", False, _per_gpu("vbios"), _eq),
    ("gpu.persistence_mode", "persistence mode", False, _per_gpu("persistence_mode"), _eq),
    ("gpu.pcie_gen", "PCIe generation now", False, _per_gpu("pcie_gen"), _eq),
    ("gpu.pcie_width", "PCIe width now", False, _per_gpu("pcie_width"), _eq),
]
HOST_CLASSES = ("identical", "equivalent", "differs", "unknown")
# A CPU quota or frequency difference is a host difference like any relevant fact, whether or
# not both runs timed the host-speed canary: the canary under-reads a quota (a server that does
# not use every core, busy loops beside it), so it cannot stand in for the fact.


def _json(v: object) -> object:
    return None if v is MISSING or v is _NA else v


def _decisive(u: UnknownRow) -> bool:
    """An unknown that keeps two hosts from being called equivalent: a relevant fact one side
    records and the other does not, or the CPU's instruction set recorded by neither (two
    bundles from before it was recorded). A fact neither side records, such as the runtime's
    ISA of two container runs, leaves the rest of the comparison standing."""
    if not u["relevant"]:
        return False
    isa = u["fact"] == "cpu.isa_class" or u["fact"].removeprefix("cpu.") in ISA_FLAGS
    return len(u["missing_in"]) == 1 or isa


def compare_hosts(
    ref: Mapping[str, object] | None, new: Mapping[str, object] | None
) -> HostComparison:
    """Classify every host-fact difference between two provenance records.

    class: differs (a performance-relevant fact differs), unknown (none known to differ, but a
    relevant fact is not recorded on one side, or neither records the CPU's ISA), identical
    (every fact the same), equivalent (only facts that do not affect performance differ)."""
    out: HostComparison = {
        "class": "unknown",
        "relevant_differences": [],
        "other_differences": [],
        "unknown": [],
        "qualifier": "",
    }
    if ref is None or new is None:
        sides = [w for w, p in (("reference", ref), ("fresh", new)) if p is None]
        out["unknown"].append(
            {"fact": "host", "short": "host facts", "relevant": True, "missing_in": sides}
        )
        out["qualifier"] = host_qualifier(out)
        return out
    for fact, short, relevant, get, same in HOST_FACTS:
        a, b = get(ref), get(new)
        if a is _NA or b is _NA or (a is None and b is None):
            continue
        if a is MISSING or b is MISSING or a is None or b is None:
            if a is MISSING and b is MISSING and not relevant:
                continue
            missing = [w for w, v in (("reference", a), ("fresh", b)) if v is MISSING or v is None]
            out["unknown"].append(
                {
                    "fact": fact,
                    "short": short,
                    "relevant": relevant,
                    "missing_in": missing,
                    "reference": _json(a),
                    "fresh": _json(b),
                }
            )
            continue
        if same(a, b):
            if a != b:  # within the margin
                out["other_differences"].append(
                    {
                        "fact": fact,
                        "short": short,
                        "reference": a,
                        "fresh": b,
                        "note": f"within {FREQUENCY_MARGIN_PCT:g}%",
                    }
                )
            continue
        rows = out["relevant_differences"] if relevant else out["other_differences"]
        rows.append({"fact": fact, "short": short, "reference": a, "fresh": b})
    if out["relevant_differences"]:
        out["class"] = "differs"
    elif any(_decisive(u) for u in out["unknown"]):
        out["class"] = "unknown"
    elif out["other_differences"]:
        out["class"] = "equivalent"
    else:
        out["class"] = "identical"
    out["qualifier"] = host_qualifier(out)
    return out


def _label(row: Mapping[str, object]) -> str:
    """A flag by its name; a short scalar with both values ("logical CPUs 2 -> 4")."""
    a, b = row.get("reference"), row.get("fresh")
    scalar = all(
        isinstance(v, str | int | float) and not isinstance(v, bool) and len(str(v)) <= 24
        for v in (a, b)
    )
    return f"{row['short']} {a} -> {b}" if scalar and "reference" in row else str(row["short"])


def _grouped(rows: Sequence[Mapping[str, object]]) -> list[str]:
    """The rows' labels, every ISA flag at once as one "ISA flags"."""
    shorts = [_label(r) for r in rows]
    flags = [f for f in ISA_FLAGS if f in shorts]
    if len(flags) == len(ISA_FLAGS):  # all of them: one name
        at = shorts.index(flags[0])
        shorts = [s for s in shorts if s not in flags]
        shorts.insert(at, "ISA flags")
    return shorts


def _names(rows: Sequence[Mapping[str, object]], limit: int | None = 10) -> str:
    shorts = _grouped(rows)
    if limit is None or len(shorts) <= limit:
        return ", ".join(shorts)
    return ", ".join(shorts[:limit]) + f" and {len(shorts) - limit} more"


def difference_names(rows: Sequence[Mapping[str, object]], limit: int | None = 10) -> str:
    """Differences named in a line: "avx512f, CPU model 85 -> 143" (every ISA flag at once as
    "ISA flags"; `limit` at most, then "and N more"; None: all)."""
    return _names(rows, limit)


def host_qualifier(host: HostComparison) -> str:
    """How the verdict names the host, in a few words: "on a host that differs in 2
    performance-relevant facts", "on an equivalent host", "on the same host or an identical
    one", or how many relevant facts a side does not record. The facts themselves are named
    once, in the comparison's table of what differs (servelab.reproduce.differences)."""
    cls = host["class"]
    if cls == "differs":
        return f"on a host that differs in {_facts(host['relevant_differences'])}"
    if cls == "equivalent":
        return "on an equivalent host (no performance-relevant difference)"
    if cls == "identical":
        return "on the same host or an identical one (no host fact differs)"
    missing = [u for u in host["unknown"] if u["relevant"]]
    return f"on a host not known to be equivalent ({_facts(missing)} not recorded on both sides)"


def _facts(rows: Sequence[Mapping[str, object]]) -> str:
    """ "3 performance-relevant facts" (all the ISA flags count as one)."""
    n = len(_grouped(rows))
    return f"{n} performance-relevant fact" + ("" if n == 1 else "s")
