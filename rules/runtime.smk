rule runtime:
    input:
        lock=config["runtime"]["lock"],
    output:
        record=f"{EXP}/runtime/runtime.json",
    params:
        runtime=config["runtime"],
    log:
        f"{EXP}/logs/runtime.log",
    benchmark:
        f"{EXP}/benchmarks/runtime.tsv"
    script:
        "../scripts/make_runtime.py"
