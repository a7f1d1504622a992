from pathlib import Path

from servelab.reproduce import Settings, compare, verdict_lines
from servelab.smk import job

smk = snakemake  # noqa: F821
with job(smk, "reproduce") as say:
    out = Path(smk.output.json).parent
    result = compare(
        Path(smk.params.reference),
        Path(smk.input.manifest).parent,
        Settings.from_config(smk.params.settings),
        out,
    )
    for line in verdict_lines(result):
        say(line)
    say(f"details: {out}/report.md, {out}/reproduction.json")
