from pathlib import Path

from servelab.jsonio import write_json
from servelab.runtime import ensure_runtime
from servelab.smk import job

with job(snakemake, "runtime") as say:  # noqa: F821
    record = ensure_runtime(snakemake.params.runtime, Path(snakemake.input.lock), say)  # noqa: F821
    write_json(Path(snakemake.output.record), record)  # noqa: F821
