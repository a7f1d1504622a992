# A campaign (docs/cluster.md): every experiment of a campaign file in one invocation,
#   snakemake --cores all --config campaign=config/campaigns/NAME.yaml
# Each experiment is rules/experiment.smk loaded as a module with its own config, so its
# results, analysis and bundle are those of a run of that experiment alone; the campaign adds
# one table over all of them.
import re
import sys
from pathlib import Path

from servelab.campaign import load_campaign
from servelab.errors import ServelabError

try:
    CAMPAIGN = load_campaign(Path(config["campaign"]))
except ServelabError as _exc:
    sys.exit(f"campaign error: {_exc}")
print(CAMPAIGN.describe(), file=sys.stderr)


for _e in CAMPAIGN.experiments:
    # a rule-name prefix per experiment: its name with what a Python name cannot hold replaced
    _word = re.sub(r"\W", "_", _e.experiment)
    _name = f"exp_{_word}_"

    module:
        name:
            _name
        snakefile:
            "experiment.smk"
        config:
            _e.config

    use rule * from _name exclude all as _name*


rule campaign:
    localrule: True
    input:
        [t for e in CAMPAIGN.experiments for t in e.targets()],
    output:
        table=f"{CAMPAIGN.out_dir}/campaign.csv",
        summary=f"{CAMPAIGN.out_dir}/summary.md",
    params:
        name=CAMPAIGN.name,
        experiments=[(e.experiment, str(e.exp_dir)) for e in CAMPAIGN.experiments],
    log:
        f"{CAMPAIGN.out_dir}/campaign.log",
    script:
        "../scripts/campaign.py"
