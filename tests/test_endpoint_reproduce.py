"""What servelab cannot check of a run on a server it did not launch (runtime.kind endpoint):
the reproduction's "could not be checked" lines, the release's unpinned reason, the diagnoses
that need the server's arguments, and the bundle's provenance of such a run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from servelab.analysis.proposals import with_proposal
from servelab.documents.declared import ReproductionRecord
from servelab.evidence.bundle import _endpoint
from servelab.evidence.crate import _model_dependency, _runtime_dependency
from servelab.evidence.release import unpinned_reasons
from servelab.reproduce.markdown import _differences
from servelab.reproduce.provenance_diff import not_checked, provenance_diff
from servelab.reproduce.sides import Side

HOST = {"class": "unknown", "relevant_differences": [], "other_differences": []}
URL = "http://10.0.0.5:8000"


def endpoint_provenance(served: str = "served", local: bool = False) -> dict[str, Any]:
    """provenance.json of a run on a server servelab did not launch, as the bundle writes it."""
    return {
        "model": {
            "source": "endpoint",
            "repo": None,
            "revision": None,
            "files": {},
            "url": URL,
            "served_model": served,
            "model": {"id": served, "root": "/models/x", "max_model_len": 1024},
        },
        "runtime": {
            "kind": "endpoint",
            "lock": None,
            "lock_sha256": None,
            "python_version": "3.11.7",
            "packages": {},
            "url": URL,
            "served_model": served,
            "local": local,
            "vllm_version": "0.32.0",
        },
        "vllm_version": "0.32.0",
        "config": {"server": {"args": {}, "configs": [{"name": "endpoint", "args": {}}]}},
        "pipeline": {"git_commit": "a" * 40, "git_dirty": False},
        "host": {},
    }


def launched_provenance() -> dict[str, Any]:
    return {
        "model": {"source": "tiny", "repo": None, "revision": "b" * 64, "files": {"x": "c"}},
        "runtime": {"kind": "venv", "lock": "vllm-cpu.lock", "lock_sha256": "d" * 64},
        "vllm_version": "0.32.0",
        "config": {"server": {"args": {"max-model-len": 1024}, "configs": [{"name": "a"}]}},
        "pipeline": {"git_commit": "a" * 40, "git_dirty": False},
        "host": {},
    }


def side(prov: dict[str, Any], kind: str = "bundle") -> Side:
    return Side(given=f"{kind}/x", kind=kind, root=Path("."), provenance=prov)


def test_two_endpoint_runs_say_what_could_not_be_checked() -> None:
    ref, new = side(endpoint_provenance()), side(endpoint_provenance(local=True))
    lines = not_checked(ref, new)
    assert lines[:4] == [
        f"runtime lock or image: the reference's server at {URL} was not launched by servelab; "
        "its software is not pinned (only the vLLM version it reports is compared)",
        f"server command line and arguments: the reference's server at {URL} was not launched "
        "by servelab; they are not recorded, so its configuration is compared by name only",
        "model files: the reference measured 'served' as its server serves it (root /models/x, "
        "max_model_len 1024); no file of it is pinned, only its name is compared",
        "the server's host: the reference's server ran on another host than its client; the "
        "host facts compared are the client's",
    ]
    # the fresh run's server is local: no host line for it
    assert len(lines) == 7 and all("fresh run" in line for line in lines[4:])
    diff = provenance_diff(ref, new, HOST)
    assert diff["not_checked"] == lines and diff["blocking"] == []
    assert sum("servelab did not launch" in f for f in diff["not_clean_room"]) == 2


def test_an_endpoint_run_against_a_launched_one_is_not_comparable() -> None:
    ref, new = side(launched_provenance()), side(endpoint_provenance())
    diff = provenance_diff(ref, new, HOST)
    assert "model.source" in diff["blocking"] and "runtime.kind" in diff["blocking"]
    assert [line.split(":")[0] for line in diff["not_checked"]] == [
        "runtime lock or image",
        "server command line and arguments",
        "model files",
        "the server's host",
    ]
    assert all("fresh run" in line for line in diff["not_checked"])


def test_another_served_model_blocks_the_comparison() -> None:
    diff = provenance_diff(side(endpoint_provenance("a")), side(endpoint_provenance("b")), HOST)
    assert diff["blocking"] == ["model.served_model"]


def test_launched_runs_have_nothing_unchecked() -> None:
    diff = provenance_diff(side(launched_provenance()), side(launched_provenance()), HOST)
    assert diff["not_checked"] == []
    lines = _differences(cast(ReproductionRecord, {"provenance": diff}))
    assert not any("did not launch" in line for line in lines)


def test_the_report_lists_what_could_not_be_checked() -> None:
    diff = provenance_diff(side(endpoint_provenance()), side(endpoint_provenance()), HOST)
    lines = _differences(cast(ReproductionRecord, {"provenance": diff}))
    at = lines.index("Could not be checked (a server servelab did not launch):")
    assert lines[at + 2].startswith("- runtime lock or image: the reference's server at")
    assert len([x for x in lines[at + 2 :] if x.startswith("- ")]) == len(diff["not_checked"])


def test_a_side_without_provenance_is_read_from_its_config() -> None:
    config = {"runtime": {"kind": "endpoint", "url": URL, "served_model": "s"}}
    raw = Side(given="results/x", kind="experiment", root=Path("."), config=config)
    lines = not_checked(raw, side(launched_provenance()))
    assert len(lines) == 3 and "the reference's server at" in lines[0]


def test_an_endpoint_run_is_released_only_as_unpinned() -> None:
    reasons = unpinned_reasons(endpoint_provenance())
    assert reasons == [
        "the server was not launched by servelab (runtime.kind endpoint): its model and "
        "runtime are not pinned"
    ]
    assert unpinned_reasons(launched_provenance()) == []


def test_the_bundle_marks_an_endpoint_run_not_launched() -> None:
    prov = endpoint_provenance()
    mark = _endpoint(prov["runtime"])["endpoint"]
    assert mark["launched"] is False and mark["url"] == URL and mark["served_model"] == "served"
    assert mark["note"].startswith("not launched by servelab: its runtime (no lock, no image)")
    assert _endpoint(launched_provenance()["runtime"]) == {}
    # in-toto: the server and its model by name, with no digest (nothing pinned)
    assert _runtime_dependency(prov["runtime"]) == {"uri": f"servelab-endpoint:{URL}"}
    assert _model_dependency(prov["model"]) == {"uri": "servelab-model:endpoint:served"}
    assert _model_dependency(launched_provenance()["model"])["digest"] == {"sha256": "b" * 64}


def test_diagnoses_that_need_the_server_s_arguments_say_they_are_unknown() -> None:
    cap = {"launched": False, "max_concurrency": 8.5, "max_num_seqs": None}
    serialized = {"kind": "serialized", "server_config": "endpoint", "evidence": {}}
    found = with_proposal(serialized, cap, None)  # type: ignore[arg-type]
    assert found["no_remedy"] == (
        "--max-num-seqs is unknown: servelab did not launch this server (runtime.kind endpoint) "
        "and cannot change its arguments"
    )
    dip = {"kind": "non_monotonic", "server_config": "endpoint", "outside_capture_sizes": None}
    assert with_proposal(dip, cap, None)["no_remedy"].startswith(  # type: ignore[arg-type]
        "the list of CUDA graph capture sizes is unknown: servelab did not launch"
    )
