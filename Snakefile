# servelab: one experiment, end to end. See README.md and docs/config.md.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/model.smk"
include: "rules/runtime.smk"
include: "rules/sweep.smk"
include: "rules/profile.smk"
include: "rules/analysis.smk"
include: "rules/summary.smk"
include: "rules/bundle.smk"
include: "rules/reproduce.smk"


rule all:
    localrule: True
    input:
        summary=f"{EXP}/summary.txt",
        report=f"{EXP}/analysis/report.md",
        profile=PROFILE_OUTPUTS,
        bundle=f"{EXP}/bundle/manifest.json",
        reproduction=REPRODUCTION,
    default_target: True
