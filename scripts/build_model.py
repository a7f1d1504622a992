from pathlib import Path

from servelab.model import build_model
from servelab.smk import job

with job(snakemake, "model") as say:  # noqa: F821
    record = build_model(snakemake.params.model, Path(snakemake.output.record).parent)  # noqa: F821
    say(
        f"model: {record['source']} revision {record['revision'][:16]}, "
        f"{len(record['files'])} files"
    )
