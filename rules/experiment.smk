# One experiment, end to end: the rules every run has. The Snakefile includes it for one
# experiment (and names its targets in `rule all`); rules/campaign.smk loads it once per
# experiment of a campaign, as a module.
include: "common.smk"
include: "model.smk"
include: "runtime.smk"
include: "sweep.smk"
include: "search.smk"
include: "profile.smk"
include: "analysis.smk"
include: "summary.smk"
include: "bundle.smk"
include: "reproduce.smk"

