"""Host facts that can explain a performance difference between two runs, one module per kind:

- `cpu`: identity, instruction-set flags, frequency, topology, affinity, cgroup quota.
- `gpu`: GPUs (UUIDs, PCI bus ids, what their power and energy readings are), driver, the
  newest CUDA it supports and topology through NVML; the driver against an image's CUDA.
- `gpuids`: which NVML device a GPU id names (NVML and CUDA indices, UUIDs, MIG ids, PCI bus
  ids), and when that is ambiguous.
- `isa`: the instruction set PyTorch and oneDNN use in the server's runtime.
- `host`: the provenance host block and the measuring node of a launch record.
- `compare`: two runs' host facts classified (differs, unknown, equivalent, identical).

A fact that cannot be read is None, never an error: provenance is written on any host. The
names below are the package's interface (`hostfacts.cpu_facts()`, ...).
"""

from servelab.hostfacts.compare import (
    FREQUENCY_MARGIN_PCT,
    HOST_CLASSES,
    HOST_FACTS,
    MISSING,
    compare_hosts,
    difference_names,
    host_qualifier,
)
from servelab.hostfacts.cpu import (
    ISA_FLAGS,
    cgroup_cpu_quota,
    cpu_facts,
    cpu_list,
    isa_class,
    numa_nodes,
    parse_cfs,
    parse_cpu_max,
    parse_cpuinfo,
    parse_khz,
)
from servelab.hostfacts.gpu import (
    TOPOLOGY,
    cuda_compatibility,
    gpu_facts,
    list_gpus,
    power_reading,
    reading_facts,
)
from servelab.hostfacts.host import host_facts, node_facts
from servelab.hostfacts.isa import (
    ISA_ENV,
    ISA_MARK,
    ISA_PROBE,
    describe_isa,
    parse_isa_probe,
    runtime_isa,
)

__all__ = [
    "FREQUENCY_MARGIN_PCT",
    "HOST_CLASSES",
    "HOST_FACTS",
    "ISA_ENV",
    "ISA_FLAGS",
    "ISA_MARK",
    "ISA_PROBE",
    "MISSING",
    "TOPOLOGY",
    "cgroup_cpu_quota",
    "compare_hosts",
    "cpu_facts",
    "cpu_list",
    "cuda_compatibility",
    "describe_isa",
    "difference_names",
    "gpu_facts",
    "host_facts",
    "host_qualifier",
    "isa_class",
    "list_gpus",
    "node_facts",
    "numa_nodes",
    "parse_cfs",
    "parse_cpu_max",
    "parse_cpuinfo",
    "parse_isa_probe",
    "parse_khz",
    "power_reading",
    "reading_facts",
    "runtime_isa",
]
