from pathlib import Path

from servelab.model import model_dir
from servelab.profile.capture import analyze_capture
from servelab.smk import job

with job(snakemake, f"profile report {snakemake.wildcards.sc}") as say:  # noqa: F821
    profile = analyze_capture(
        snakemake.params.config,  # noqa: F821
        snakemake.wildcards.sc,  # noqa: F821
        Path(snakemake.input.capture).parents[2],  # noqa: F821  <exp>/profile/<sc>/capture.json
        model_dir(Path(snakemake.input.model)),  # noqa: F821
    )
    say(f"{profile['status']}: {', '.join(profile['windows']) or profile['reason']}")
