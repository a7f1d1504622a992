"""Where a server's compile caches live: one folder per runtime in servelab's cache.

vLLM compiles the model at every start (torch.compile through its own backend; on GPUs also
CUDA graph capture) and keeps what it compiled in two caches: vLLM's own under
`VLLM_CACHE_ROOT` (default ~/.cache/vllm) and PyTorch's Inductor/AOTAutograd cache under
`TORCHINDUCTOR_CACHE_DIR` (default /tmp/torchinductor_<user>). Left at their defaults they
are lost with /tmp, and in a container with the container. servelab points both at
`<cache>/compile/<runtime key>/` (`vllm/`, `inductor/`), the runtime key being the lock's
sha256 (venv) or the image's digest (container), so every start of the same runtime reuses
what an earlier start compiled; in a container the folder is mounted read-write at
CONTAINER_ROOT.

A cache never changes what is measured: both caches are keyed by their owners on everything
that decides the compiled code (vLLM: the model's config, the compilation settings, vLLM's
source hash; PyTorch: the graph, the PyTorch version and its settings) and a hit replays the
code a miss would have compiled. servelab keeps one folder per runtime on top of that, and
records the cache's state before each start (`state`: files and bytes, `warm`) in launch.json
so a cold and a warm start can be told apart and compared (docs/raw-data.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from servelab.documents.declared import CacheFiles, CompileCacheState
from servelab.env.container import Mount
from servelab.store.paths import default_cache_dir

CONTAINER_ROOT = "/var/cache/servelab-compile"
SUBDIRS = {"VLLM_CACHE_ROOT": "vllm", "TORCHINDUCTOR_CACHE_DIR": "inductor"}


def runtime_key(runtime: Mapping[str, object]) -> str | None:
    """The runtime's identity for the cache folder: venv-<lock sha256[:16]> or
    image-<digest[:16]>; None when the record carries neither (nothing to key on)."""
    if runtime.get("kind") == "container":
        ref = str(runtime.get("image_ref") or "")
        digest = str(
            runtime.get("image_digest")
            or runtime.get("image_sha256")
            or (ref.rpartition("@")[2] if "@sha256:" in ref else "")
        ).removeprefix("sha256:")
        return f"image-{digest[:16]}" if digest else None
    sha = runtime.get("lock_sha256")
    return f"venv-{str(sha)[:16]}" if sha else None


@dataclass(frozen=True)
class CompileCache:
    """The compile-cache folder of one runtime."""

    root: Path
    key: str

    def prepare(self) -> None:
        for sub in SUBDIRS.values():
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def env(self, container: bool) -> dict[str, str]:
        """The server's environment that points vLLM and PyTorch at the folder, as the server
        sees it (in a container: under CONTAINER_ROOT)."""
        base = CONTAINER_ROOT if container else str(self.root.resolve())
        return {var: f"{base}/{sub}" for var, sub in SUBDIRS.items()}

    def mount(self) -> Mount:
        return Mount(str(self.root.resolve()), CONTAINER_ROOT, read_only=False)

    def state(self) -> CompileCacheState:
        """What the folder holds before a start: `key`, `path`, files and bytes per cache
        (CacheFiles, under its folder's name) and `warm` (any file at all)."""
        caches: dict[str, CacheFiles] = {}
        for var, sub in SUBDIRS.items():
            files = size = 0
            for dirpath, _dirs, names in os.walk(self.root / sub):
                for name in names:
                    try:
                        size += os.lstat(os.path.join(dirpath, name)).st_size
                    except OSError:
                        continue
                    files += 1
            caches[sub] = {"env": var, "files": files, "bytes": size}
        return {
            "key": self.key,
            "path": str(self.root),
            "vllm": caches["vllm"],
            "inductor": caches["inductor"],
            "warm": any(c["files"] for c in caches.values()),
        }


def compile_cache_for(
    runtime: Mapping[str, object], cache_dir: Path | None = None
) -> CompileCache | None:
    """The runtime's compile-cache folder in servelab's cache (cache_dir, else the default
    cache); None when the runtime has no key."""
    key = runtime_key(runtime)
    if key is None:
        return None
    return CompileCache((cache_dir or default_cache_dir()) / "compile" / key, key)
