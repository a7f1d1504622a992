# servelab: one experiment, end to end, or a campaign of several (--config campaign=FILE).
# See README.md, docs/config.md and docs/cluster.md.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


# `rule all` is written here, not in the included files: an include keeps the default target
# it was given.
if config.get("campaign"):

    include: "rules/campaign.smk"

    rule all:
        localrule: True
        input:
            rules.campaign.output,
        default_target: True

else:

    include: "rules/experiment.smk"
    include: "rules/confirm.smk"

    rule all:
        localrule: True
        input:
            summary=f"{EXP}/summary.txt",
            report=f"{EXP}/analysis/report.md",
            profile=PROFILE_OUTPUTS,
            bundle=f"{EXP}/bundle/manifest.json",
            reproduction=REPRODUCTION,
        default_target: True


include: "rules/site.smk"
