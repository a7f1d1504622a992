from pathlib import Path

from servelab.model import build_model
from servelab.runtime import cache_dir_of
from servelab.smk import job

with job(snakemake, "model") as say:  # noqa: F821
    record = build_model(
        snakemake.params.model,  # noqa: F821
        Path(snakemake.output.record).parent,  # noqa: F821
        cache_dir_of({"cache_dir": snakemake.params.cache_dir}),  # noqa: F821
        say=say,
    )
    say(
        f"model: {record['source']} revision {record['revision'][:16]}, "
        f"{len(record['files'])} files"
    )
