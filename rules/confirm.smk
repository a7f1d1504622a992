# From diagnosis to measured fix (docs/analysis.md, "Proposals and confirmation"):
#   snakemake --cores all [--configfile EXPERIMENT] confirm
# derives results/<experiment>-confirm/config.yaml from the proposals in diagnoses.json (the
# diagnosed configuration and each proposed one, side by side) and runs it with this workflow
# into results/<experiment>-confirm/, model and runtime reused; confirm.json there has the plan
# and a verdict per proposal. The measuring slot is held throughout: nothing else is measured
# beside the confirmation.

CONFIRM_DIR = f"{config['results_dir']}/{config['experiment']}-confirm"


rule confirm:
    localrule: True
    input:
        manifest=f"{EXP}/bundle/manifest.json",
        diagnoses=f"{EXP}/analysis/diagnoses.json",
    output:
        record=f"{CONFIRM_DIR}/confirm.json",
    params:
        snakefile=workflow.main_snakefile,
        cores=confirm_cores,
        # local, or a cluster executor's name: the confirmation is not measured nested there
        executor=lambda wildcards: workflow.executor_plugin.name,
    resources:
        measure=1,
    log:
        f"{CONFIRM_DIR}/logs/confirm.log",
    script:
        "../scripts/confirm.py"
