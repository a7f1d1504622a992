from pathlib import Path

from servelab.jsonio import read_json
from servelab.model import model_dir
from servelab.profile.capture import run_profile
from servelab.smk import experiment, job

with job(snakemake, f"profile {snakemake.wildcards.sc}") as say:
    exp, paths = experiment(snakemake)
    run_profile(
        exp,
        paths,
        snakemake.wildcards.sc,
        model_dir=model_dir(Path(snakemake.input.model)),
        runtime=read_json(Path(snakemake.input.runtime)),
        say=say,
    )
