from servelab.analysis.pipeline import analyze
from servelab.smk import experiment, job

with job(snakemake, "analysis") as say:
    exp, paths = experiment(snakemake)
    results = analyze(paths.root, paths.analysis, exp.analysis, figures=exp.analysis.figures)
    for d in results["diagnoses"]:
        where = f" c={d['concurrency']}" if "concurrency" in d else ""
        say(f"diagnosis {d['kind']}: {d['server_config']}{where}")
    for c in results["claims"]:
        say(f"claim {c['verdict']}: {c['claim']}")
