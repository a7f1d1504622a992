from pathlib import Path

from servelab.jsonio import read_json
from servelab.model import model_dir
from servelab.smk import experiment, job
from servelab.sweep import run_sweep

with job(snakemake, f"sweep {snakemake.wildcards.sc}") as say:
    exp, paths = experiment(snakemake)
    run_sweep(
        exp,
        paths,
        snakemake.wildcards.sc,
        model_dir=model_dir(Path(snakemake.input.model)),
        runtime=read_json(Path(snakemake.input.runtime)),
        say=say,
    )
