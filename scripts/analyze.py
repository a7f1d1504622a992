from pathlib import Path

from servelab.analysis.pipeline import analyze, options_from_config
from servelab.smk import job

with job(snakemake, "analysis") as say:  # noqa: F821
    cfg = snakemake.params.config  # noqa: F821
    exp_dir = Path(snakemake.output.report).parents[1]  # noqa: F821  <exp>/analysis/report.md
    results = analyze(
        exp_dir, exp_dir / "analysis", options_from_config(cfg), figures=cfg["analysis"]["figures"]
    )
    for d in results["diagnoses"]:
        where = f" c={d['concurrency']}" if "concurrency" in d else ""
        say(f"diagnosis {d['kind']}: {d['server_config']}{where}")
    for c in results["claims"]:
        say(f"claim {c['verdict']}: {c['claim']}")
