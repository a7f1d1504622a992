rule model:
    output:
        record=f"{EXP}/model/servelab-model.json",
    params:
        model=config["model"],
    log:
        f"{EXP}/logs/model.log",
    benchmark:
        f"{EXP}/benchmarks/model.tsv"
    script:
        "../scripts/build_model.py"
