from pathlib import Path

from servelab.jsonio import read_json
from servelab.model import model_dir
from servelab.profile.capture import run_profile
from servelab.smk import job

with job(snakemake, f"profile {snakemake.wildcards.sc}") as say:  # noqa: F821
    run_profile(
        snakemake.params.config,  # noqa: F821
        snakemake.wildcards.sc,  # noqa: F821
        model_dir(Path(snakemake.input.model)),  # noqa: F821
        read_json(Path(snakemake.input.runtime)),  # noqa: F821
        Path(snakemake.output.capture).parents[2],  # noqa: F821  <exp>/profile/<sc>/capture.json
        say,
    )
