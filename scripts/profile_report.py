from pathlib import Path

from servelab.env.model import model_dir
from servelab.profile.report import analyze_capture
from servelab.smk import experiment, job

with job(snakemake, f"profile report {snakemake.wildcards.sc}") as say:
    exp, paths = experiment(snakemake)
    profile = analyze_capture(
        exp.profile, paths, snakemake.wildcards.sc, model_dir(Path(snakemake.input.model))
    )
    say(f"{profile['status']}: {', '.join(profile['windows']) or profile['reason']}")
