# The confirm rule (rules/confirm.smk): derive the confirmation experiment from the diagnosing
# experiment's proposals, run it with this workflow into its own folder, report the verdicts.
from pathlib import Path

from servelab.confirm import run_confirm, workflow_command
from servelab.smk import job

with job(snakemake, "confirm") as say:
    run_confirm(
        config=snakemake.config,
        diagnoses=Path(snakemake.input.diagnoses),
        bundle=Path(snakemake.input.manifest).parent,
        record=Path(snakemake.output.record),
        workflow=workflow_command(
            Path(snakemake.params.snakefile), int(snakemake.params.cores), snakemake.params.executor
        ),
        say=say,
    )
