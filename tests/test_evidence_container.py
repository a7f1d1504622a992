"""A bundle whose server ran from a container image and whose model came from the hub:
provenance names the image by digest, the attestation lists it, the release check accepts it."""

from __future__ import annotations

import json
from pathlib import Path

from test_evidence import REPO, experiment

from servelab.env.model import tree_digest
from servelab.evidence.bundle import build_bundle
from servelab.evidence.release import unpinned_reasons
from servelab.evidence.verify import verify
from servelab.store.jsonio import write_json

DIGEST = "sha256:6666717cd1cadf9adfff8abec9c3f2eca6e27e742de06fe7d7f129fa3d647732"
COMMIT = "aa8e72537993ba99e69dfaafa59ed015b17504d1"


def test_container_and_hf_provenance(tmp_path: Path) -> None:
    paths, exp = experiment(tmp_path)
    files = {"config.json": "1" * 64, "model-00001-of-00002.safetensors": "2" * 64}
    write_json(
        paths.model / "servelab-model.json",
        {
            "source": "hf",
            "repo": "Qwen/Qwen2.5-3B-Instruct",
            "revision": COMMIT,
            "allow_patterns": None,
            "path": "/cache/models/Qwen--Qwen2.5-3B-Instruct/" + COMMIT,
            "files": files,
            "tree_sha256": tree_digest(files),
            "bytes": 6_000_000_000,
            "checked": {"lfs_sha256": 1, "git_blob_sha1": 1},
        },
    )
    write_json(
        paths.runtime / "runtime.json",
        {
            "kind": "container",
            "engine": "docker",
            "engine_executable": "/usr/bin/docker",
            "engine_version": "27.3.1",
            "image": f"vllm/vllm-openai:v0.27.1-x86_64-cu129@{DIGEST}",
            "image_ref": f"vllm/vllm-openai@{DIGEST}",
            "image_digest": DIGEST,
            "image_sha256": None,
            "image_id": "sha256:" + "e" * 64,
            "repo_digests": [f"vllm/vllm-openai@{DIGEST}"],
            "labels": {},
            "python": "python3",
            "python_version": "3.12.3",
            "vllm_version": "0.27.1",
            "packages": {"vllm": "0.27.1"},
            "profiler_config": True,
            "nsys": None,
            "nsys_version": None,
            "lock": None,
            "lock_sha256": None,
        },
    )
    out = tmp_path / "bundle"
    build_bundle(exp, paths, out, REPO)
    assert verify(out, do_rebuild=True) == []
    prov = json.loads((out / "provenance.json").read_text())
    rt = prov["runtime"]
    assert (rt["kind"], rt["engine"], rt["image_digest"], rt["vllm_version"]) == (
        "container",
        "docker",
        DIGEST,
        "0.27.1",
    )
    assert prov["model"]["repo"] == "Qwen/Qwen2.5-3B-Instruct"
    assert prov["model"]["revision"] == COMMIT
    deps = json.loads((out / "attestation.intoto.json").read_text())["predicate"][
        "buildDefinition"
    ]["resolvedDependencies"]
    assert {
        "uri": f"servelab-runtime-image:vllm/vllm-openai@{DIGEST}",
        "digest": {"sha256": DIGEST.removeprefix("sha256:")},
    } in deps
    assert {"uri": "servelab-model:hf", "digest": {"gitCommit": COMMIT}} in deps
    reasons = unpinned_reasons(prov)
    assert not [r for r in reasons if "image" in r or "model" in r or "lock" in r]
