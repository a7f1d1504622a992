# When `reference:` is set (docs/reproduce.md): the reference was verified when the workflow
# started (rules/common.smk); after the fresh bundle is built, compare the two and give a
# verdict per claim. The rule succeeds whatever the verdict: the verdict is its output.


rule reproduce:
    localrule: True
    input:
        manifest=f"{EXP}/bundle/manifest.json",
    output:
        json=f"{EXP}/reproduction/reproduction.json",
        report=report(
            f"{EXP}/reproduction/report.md",
            caption="../docs/report-caption.rst",
            category="Reproduction",
        ),
    params:
        exp=experiment_dir,
        reference=config["reference"],
        settings=config["reproduction"],
    log:
        f"{EXP}/logs/reproduce.log",
    benchmark:
        f"{EXP}/benchmarks/reproduce.tsv"
    script:
        "../scripts/reproduce.py"
