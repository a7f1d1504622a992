"""Compare a fresh run with a reference (a frozen release, a bundle, or a vllm-bench tree).

Both sides are re-analysed from their raw data with the same options (the reference's), so
the comparison never trusts a table it could recompute. What decides the verdict:

- orderings: every paired difference the reference called real (for the judged metrics and at
  least `min_effect_pct`): the fresh run must show it in the same direction, and, by default,
  call it real too;
- claims: every claim of the reference, re-evaluated on the fresh data, must come out as it did
  in the reference;
- absolute values only when a tolerance is set (they move between hosts);
- provenance: a different model revision, runtime, vLLM version, GPU model or measured
  configuration makes the comparison NOT COMPARABLE whatever the numbers say;
- the host never decides the verdict, but every host-fact difference is classified as
  performance-relevant or not (`hostfacts.compare_hosts`) and the verdict text says which host
  it was reached on: one that differs (naming how), an equivalent one, or one not known to be
  equivalent;
- the host's speed (each side's canary, analysis.hostspeed): every point's change is tested
  under Benjamini-Hochberg and set against the host-speed ratio, and a failure on an
  equivalent host is called a regression only where the host's speed is recorded on both
  sides and explains none of it ("not attributed to the code" otherwise, with why).

Modules: `sides` opens and verifies the two sides; `provenance_diff` compares what they
record; `checks` analyses both and checks orderings, claims and points; `comparison` reaches
the verdict and writes reproduction.json (typed in `records`) and report.md; `markdown`
renders report.md; `verdict` gives the lines the CLI and the workflow print.
"""

from servelab.reproduce.checks import NOT_COMPARABLE, NOT_REPRODUCED, REPRODUCED
from servelab.reproduce.comparison import (
    check_reference,
    compare,
    compare_sides,
    reference_orderings,
    reproduce_experiment,
)
from servelab.reproduce.markdown import report_markdown
from servelab.reproduce.provenance_diff import provenance_diff
from servelab.reproduce.sides import Side, open_side
from servelab.reproduce.verdict import verdict_lines

__all__ = [
    "NOT_COMPARABLE",
    "NOT_REPRODUCED",
    "REPRODUCED",
    "Side",
    "check_reference",
    "compare",
    "compare_sides",
    "open_side",
    "provenance_diff",
    "reference_orderings",
    "report_markdown",
    "reproduce_experiment",
    "verdict_lines",
]
