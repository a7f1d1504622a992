"""The README and the evidence index say what the repository holds.

The README stays a page for users (at most 160 lines), every link and every path it names
exists, every docs/*.md is in its list, its table of the default run is the named release's
summary.csv, and each release's table in evidence/quickstart-cpu/README.md is that release's.
The README's commands are checked by tests/test_documented_commands.py; the one of them no
other test plans is dry-run here.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from workflow_env import snakemake_here

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
EVIDENCE_INDEX = REPO / "evidence" / "quickstart-cpu" / "README.md"
MAX_LINES = 160
FOLDERS = "docs|config|evidence|benchmarks|envs|containers|datasets|src|rules|profiles|scripts"


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_readme_is_short() -> None:
    n = len(_text(README).splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines, at most {MAX_LINES}: move reference to docs/"


def test_readme_links_and_paths_resolve() -> None:
    text = _text(README)
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert links, "the README links nothing"
    for target in links:
        assert "://" not in target, f"{target}: the README links only within the repository"
        assert (REPO / target).exists(), f"README.md links {target}, which does not exist"
    named = {
        m.rstrip(".,;:")
        for m in re.findall(rf"(?<![\w/.-])(?:{FOLDERS})/[\w./-]+", text)
        if "<" not in m
    }
    assert "benchmarks/README.md" in named
    missing = sorted(p for p in named if not (REPO / p).exists())
    assert not missing, f"README.md names paths that do not exist: {missing}"


def test_readme_lists_every_doc() -> None:
    text = _text(README)
    docs = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))
    assert docs
    unlisted = [d for d in docs if f"[{d}]({d})" not in text]
    assert not unlisted, f"README.md's documentation list lacks {unlisted}"


def _throughput_means(release: Path) -> dict[str, list[int]]:
    """Mean output tok/s per server config, by ascending concurrency, rounded as the tables
    print them."""
    with (release / "tables" / "summary.csv").open(encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["metric"] == "output_throughput"]
    out: dict[str, list[tuple[float, int]]] = {}
    for r in rows:
        mean = float(r["mean"])
        out.setdefault(r["server_config"], []).append((float(r["concurrency"]), round(mean)))
    return {sc: [v for _, v in sorted(pairs)] for sc, pairs in out.items()}


def _tables(text: str) -> dict[str, list[int]]:
    """`| config | n | n | ... |` rows of a Markdown text: config -> its numbers."""
    rows = re.findall(r"^\| (max-num-seqs-\d+) ((?:\| [\d,.]+ )+)\|$", text, re.M)
    return {sc: [int(v.replace(",", "")) for v in cells.split("|")[1:]] for sc, cells in rows}


def test_readme_table_is_the_named_release() -> None:
    text = _text(README)
    tags = set(re.findall(r"evidence/quickstart-cpu/(v\d+)/report\.md", text))
    assert len(tags) == 1, f"the README names one release for its table, found {tags}"
    release = REPO / "evidence" / "quickstart-cpu" / tags.pop()
    table = _tables(text)
    assert set(table) == {"max-num-seqs-1", "max-num-seqs-8"}, table
    assert table == _throughput_means(release), f"README.md's table is not {release.name}'s"
    figures = re.findall(r"!\[[^]]*\]\((evidence/quickstart-cpu/(v\d+)/figures/[^)]+)\)", text)
    assert [tag for _, tag in figures] == [release.name], figures


def _release_sections() -> list[tuple[str, str]]:
    parts = re.split(r"^## (v\d+)\n", _text(EVIDENCE_INDEX), flags=re.M)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def test_evidence_index_tables_are_each_releases() -> None:
    sections = _release_sections()
    releases = sorted(p.name for p in EVIDENCE_INDEX.parent.glob("v*") if p.is_dir())
    assert sorted(tag for tag, _ in sections) == releases
    wrong = {}
    for tag, body in sections:
        table = _tables(body.split("\n### ", 1)[0])
        expected = _throughput_means(EVIDENCE_INDEX.parent / tag)
        if table != expected:
            wrong[tag] = (table, expected)
    assert not wrong, f"tables that are not their release's summary.csv (table, csv): {wrong}"


@pytest.mark.parametrize("config", ["config/experiments/max-num-seqs-sweep.yaml"])
def test_readme_knee_command_plans_every_configuration(config: str) -> None:
    cmd = f"snakemake --cores all --configfile {config}"
    assert cmd in _text(README)
    proc = snakemake_here(["-n", "--nolock", "--cores", "all", "--configfile", config])
    for n in (1, 2, 4, 8):
        assert f"results/max-num-seqs-sweep/raw/max-num-seqs-{n}/run.json" in proc.stdout, n
