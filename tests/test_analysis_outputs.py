"""Every file the analysis writes under analysis/ is an output of the workflow's `analysis` rule
(rules/analysis.smk), and every output of that rule is written: Snakemake then knows each file
(a rerun replaces it, --delete-all-output removes it, a missing one is an error).

The experiment is the committed v8 release's raw data under a results folder of the test's,
analysed by scripts/analysis.py itself; the rule's outputs are what `snakemake --summary
analysis` lists for the same config. A file the analysis starts writing without the rule
declaring it fails here."""

from __future__ import annotations

import copy
import runpy
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from workflow_env import snakemake_here

from servelab.analysis.search import (
    RateOutcome,
    RepeatOutcome,
    SearchSpec,
    SloBounds,
    search_rate,
)
from servelab.analysis.search_records import write_search as write_search_record
from servelab.config import validate
from servelab.evidence.files import safe_extract

REPO = Path(__file__).resolve().parents[1]
RELEASE = REPO / "evidence" / "quickstart-cpu" / "v8"
SEARCHED = "max-num-seqs-8"


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return safe_extract(RELEASE / "v8.tar.gz", tmp_path_factory.mktemp("v8"))


def released_config(release: Path, results_dir: Path) -> dict[str, Any]:
    """The release's resolved config, writing into `results_dir`."""
    raw = yaml.safe_load((release / "config.resolved.yaml").read_text(encoding="utf-8"))
    return {**raw, "results_dir": str(results_dir)}


def with_search(cfg: dict[str, Any]) -> dict[str, Any]:
    """`cfg` with the SLO capacity search on one configuration and SLO bounds set."""
    out = copy.deepcopy(cfg)
    out["search"].update(enabled=True, server_configs=[SEARCHED])
    out["analysis"]["slo"]["p99_ttft_ms"] = 2000
    return out


def without_figures(cfg: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(cfg)
    out["analysis"]["figures"] = False
    return out


def write_search(root: Path, sc: str) -> None:
    """A finished search of `sc` (raw/<sc>/search/search.json): met up to 3.7 req/s."""

    def measure(rate: float, round_: int) -> RateOutcome:
        return RateOutcome((RepeatOutcome(1.0 if rate <= 3.7 else 0.5, True, 400),))

    result = search_rate(measure, SearchSpec(1, SloBounds(ttft_ms=2000), target=0.99))
    write_search_record(root / "raw" / sc / "search" / "search.json", result)


def experiment(release: Path, cfg: dict[str, Any]) -> Path:
    """The release's raw data as the experiment folder `cfg` names, with a search record for
    each configuration `cfg` searches."""
    root = Path(cfg["results_dir"]) / cfg["experiment"]
    for sub in ("raw", "server", "runtime", "model"):
        shutil.copytree(release / sub, root / sub)
    if cfg["search"]["enabled"]:
        for sc in cfg["search"]["server_configs"]:
            write_search(root, sc)
    return root


def run_analysis_script(cfg: dict[str, Any], root: Path) -> None:
    """scripts/analysis.py as the rule runs it: its `snakemake` object gives the validated
    config, params.exp and the log."""
    (root / "logs").mkdir(exist_ok=True)
    resolved = validate(cfg).to_dict()
    smk = SimpleNamespace(
        config=resolved,
        params=SimpleNamespace(config=resolved, exp=str(root)),
        log=[str(root / "logs" / "analysis.log")],
    )
    runpy.run_path(str(REPO / "scripts" / "analysis.py"), init_globals={"snakemake": smk})


def declared_outputs(cfg: dict[str, Any], tmp: Path) -> set[str]:
    """The `analysis` rule's outputs for `cfg`, as snakemake lists them (--summary: one row
    per output file, its rule in the third column)."""
    cfg_file = tmp / "config.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    proc = snakemake_here(
        ["analysis", "--summary", "--cores", "1", "--nolock", "--configfile", str(cfg_file)]
    )
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("output_file\t"))
    rows = [line.split("\t") for line in lines[header + 1 :]]
    return {row[0] for row in rows if len(row) > 2 and row[2] == "analysis"}


@pytest.mark.parametrize(
    ("case", "edit"),
    [
        ("as released", lambda cfg: cfg),
        ("searched, with SLO bounds", with_search),
        ("figures off", without_figures),
    ],
)
def test_every_file_the_analysis_writes_is_an_output_of_its_rule(
    release: Path, tmp_path: Path, case: str, edit: Any
) -> None:
    cfg = edit(released_config(release, tmp_path / "results"))
    root = experiment(release, cfg)
    run_analysis_script(cfg, root)
    analysis = root / "analysis"
    names = {p.relative_to(analysis).as_posix() for p in analysis.rglob("*") if p.is_file()}
    declared = declared_outputs(cfg, tmp_path)
    outside = sorted(p for p in declared if not p.startswith(f"{analysis}/"))
    assert outside == [], f"{case}: the rule's outputs outside analysis/"
    declared_names = {p.removeprefix(f"{analysis}/") for p in declared}
    assert sorted(names - declared_names) == [], f"{case}: written, not declared by the rule"
    assert sorted(declared_names - names) == [], f"{case}: declared by the rule, not written"
    # the files this check is about are among them
    assert "validity.json" in names
    if cfg["analysis"]["figures"]:
        assert {"figures/latency_throughput.png", "figures/utilization_vs_throughput.png"} <= names
    else:
        assert not any(n.startswith("figures/") for n in names)
    if cfg["search"]["enabled"]:
        assert {f"figures/search-{SEARCHED}.svg", f"figures/search-{SEARCHED}.png"} <= names
        assert "slo.json" in names
