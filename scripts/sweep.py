from pathlib import Path

from servelab.jsonio import read_json
from servelab.model import model_dir
from servelab.smk import job
from servelab.sweep import run_sweep

with job(snakemake, f"sweep {snakemake.wildcards.sc}") as say:  # noqa: F821
    run_sweep(
        snakemake.params.config,  # noqa: F821
        snakemake.wildcards.sc,  # noqa: F821
        model_dir(Path(snakemake.input.model)),  # noqa: F821
        read_json(Path(snakemake.input.runtime)),  # noqa: F821
        Path(snakemake.output.run).parents[2],  # noqa: F821  <exp>/raw/<sc>/run.json
        say,
    )
