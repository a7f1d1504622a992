# SLO capacity by search (search.enabled; src/servelab/measure/slo_search.py): per searched server
# configuration, after its sweep, a launch of its own measures open-loop points at the rates the
# search chooses, bracketing then bisecting, and writes raw/<sc>/search/search.json last. Its
# params are the whole experiment config: the SLO bounds (analysis.slo) and the validity
# thresholds decide which rates it measures.
rule slo_search:
    input:
        model=rules.model.output.record,
        runtime=rules.runtime.output.record,
        config_runtimes=config_runtimes,
        run=f"{EXP}/raw/{{sc}}/{_paths.RUN_FILE}",
    output:
        search=f"{EXP}/raw/{{sc}}/{_paths.SEARCH_DIR}/{_paths.SEARCH_FILE}",
    params:
        config=EXPERIMENT_CONFIG,
        exp=experiment_dir,
    resources:
        **measure_resources(),
    group:
        MEASURE_GROUP
    wildcard_constraints:
        sc=one_of(SEARCHED),
    log:
        f"{EXP}/logs/search-{{sc}}.log",
    benchmark:
        f"{EXP}/benchmarks/search-{{sc}}.tsv"
    script:
        "../scripts/search.py"
