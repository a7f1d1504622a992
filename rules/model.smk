# tiny: built in {EXP}/model/. hf: downloaded at the pinned commit into a shared folder
# (model.local_dir or the cache); the record says where (docs/config.md). endpoint (a running
# server, runtime.kind endpoint): nothing built; the record says what the server serves.
rule model:
    localrule: True
    output:
        record=f"{EXP}/model/servelab-model.json",
    params:
        exp=experiment_dir,
        model=model_params(),
        cache_dir=config["runtime"]["cache_dir"],
    log:
        f"{EXP}/logs/model.log",
    benchmark:
        f"{EXP}/benchmarks/model.tsv"
    script:
        "../scripts/model.py"
