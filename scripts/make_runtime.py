from pathlib import Path

from servelab.jsonio import write_json
from servelab.runtime import ensure_runtime
from servelab.smk import job

with job(snakemake, "runtime") as say:  # noqa: F821
    lock = getattr(snakemake.input, "lock", None)  # noqa: F821  (venv only)
    record = ensure_runtime(
        snakemake.params.runtime,  # noqa: F821
        Path(lock) if lock else None,
        say,
        snakemake.params.profile,  # noqa: F821
    )
    write_json(Path(snakemake.output.record), record)  # noqa: F821
