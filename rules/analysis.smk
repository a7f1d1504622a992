rule summary:
    input:
        runs=sweep_outputs(),
    output:
        summary=f"{EXP}/summary.txt",
    log:
        f"{EXP}/logs/summary.log",
    script:
        "../scripts/summary.py"
