"""report.md: the tables a write-up needs, the diagnoses in plain words, and the figures."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping

from servelab.analysis.clients import clients_section
from servelab.analysis.confirmation import confirmation_section
from servelab.analysis.diagnosis_records import level_of
from servelab.analysis.groups import Groups, PairedRow
from servelab.analysis.knee import DominanceRow, knee_level
from servelab.analysis.outputs import ComparedOutputs, claim_note, outputs_section
from servelab.analysis.proposals import proposal_line
from servelab.analysis.replay_report import replay_section
from servelab.analysis.result import Analysis, HostPart
from servelab.analysis.rounds import rounds_section
from servelab.analysis.runtimes import runtimes_section
from servelab.analysis.samehost import same_host_section
from servelab.analysis.stats import describe
from servelab.analysis.turns import turns_section
from servelab.analysis.validity import (
    AFFECTS_WORDS,
    BY_NAME,
    FAILED,
    NOT_CHECKED,
    NOTED,
    PASSED,
    SECTION,
    checks_for,
    counts,
)
from servelab.documents.declared import (
    ClaimVerdict,
    CpuFacts,
    Diagnosis,
    Knee,
    SearchJson,
    SloJson,
    StartRecord,
    StepJson,
)
from servelab.env.endpoint import report_line
from servelab.hostfacts import ISA_FLAGS
from servelab.launch.serverlog import PHASE_NAMES
from servelab.metrics import samples_needed
from servelab.render import md_table, num
from servelab.store.paths import TELEMETRY_FIGURE


def _ms(x: float | None) -> str:
    """A latency in ms, or in s from one second on."""
    if x is None:
        return num(x)
    return f"{x / 1000:.2f} s" if x >= 1000 else f"{x:.1f} ms"


THROUGHPUT_HEADER = (
    "Concurrency",
    "Repeats",
    "Mean output throughput",
    "CV",
    "Mean TTFT",
    "p99 TTFT, repeats pooled [95% CI]",
    "Mean TPOT",
)
TELEMETRY_HEADER = (
    "Config",
    "Concurrency",
    "Output tok/s",
    "Utilization",
    "Server CPU",
    "Peak running",
    "Peak waiting",
    "Waiting fraction",
    "Peak KV usage",
    "Preemptions",
)


def _lat(g: Groups, sc: str, c: int | float, metric: str) -> str:
    """A latency mean; 'invalid' when validity left out every repeat, '(k of n)' when some."""
    kept = len(g.values(sc, c, metric))
    lost = len({p.repeat for p, _ in g.left_out(sc, c, metric)})
    if lost and not kept:
        return "invalid"
    text = _ms(g.mean(sc, c, metric))
    return f"{text} ({kept} of {kept + lost})" if lost else text


def _pooled(g: Groups, sc: str, c: int | float, lat: str, p: int) -> str:
    """A percentile of a latency over every counted repeat's requests, with its interval and
    n, or 'insufficient (...)'; 'invalid' when validity left out every repeat."""
    if not g.values(sc, c, f"mean_{lat}_ms") and g.left_out(sc, c, f"mean_{lat}_ms"):
        return "invalid"
    return g.pooled(sc, c, lat).text(p)


def cpu_line(f: CpuFacts) -> str:
    quota = f.get("cgroup_cpu_quota")
    return (
        f"{f.get('model_name')} ({f.get('vendor')} family {f.get('family')} model "
        f"{f.get('model')} stepping {f.get('stepping')}), {f.get('logical_cpus')} logical CPUs "
        f"({f.get('sockets')} socket(s), {f.get('cores_per_socket')} cores each, "
        f"{f.get('threads_per_core')} thread(s) per core, {f.get('numa_nodes')} NUMA node(s)), "
        f"affinity {f.get('affinity')}, "
        + (f"cgroup CPU quota {quota:g} CPUs" if quota is not None else "no cgroup CPU quota")
        + (", under a hypervisor" if f.get("hypervisor") else "")
    )


def _host_section(host: HostPart, nodes: dict[str, str] | None = None) -> list[str]:
    """The measuring host's CPU and instruction sets, and what the server runtime computes
    with: what explains a difference from another host (docs/reproduce.md); `nodes`
    (Analysis.hosts_differ): the host of each server config, when they were several."""
    hosts: Mapping[str, CpuFacts] = host.get("hosts") or {}
    isa, endpoints = host.get("runtime_isa"), host.get("endpoints") or {}
    if not hosts and not isa and not nodes and not endpoints:
        return []
    lines = ["## Host", ""] + [f"- Server ({sc}): {report_line(e)}." for sc, e in endpoints.items()]
    if nodes:
        lines.append(
            "- Server configurations were measured on different hosts: "
            + ", ".join(f"{sc} on {name}" for sc, name in sorted(nodes.items()))
            + "."
        )
    distinct = {json.dumps(f, sort_keys=True) for f in hosts.values()}
    for label, f in (
        [("every server config", next(iter(hosts.values())))]
        if len(distinct) == 1
        else sorted(hosts.items())
    ):
        flags = f.get("flags") or {}
        order = [k for k in ISA_FLAGS if k in flags] + sorted(set(flags) - set(ISA_FLAGS))
        have = [k for k in order if flags[k]]
        lack = [k for k in order if not flags[k]]
        lines += [
            f"- CPU ({label}): {cpu_line(f)}.",
            f"- Instruction sets: class `{f.get('isa_class')}`; present: "
            f"{', '.join(have) or 'none of those checked'}; absent: {', '.join(lack) or 'none'}.",
        ]
    if isa:
        caps = isa.get("env") or {}
        lines.append(
            f"- The server runtime computes with: PyTorch {isa.get('cpu_capability')}, oneDNN "
            f"{isa.get('onednn_isa')}"
            + (
                "; capped by " + ", ".join(f"{k}={v}" for k, v in sorted(caps.items()))
                if caps
                else " (no ISA cap set)"
            )
            + (f"; probe error: {isa['error']}" if isa.get("error") else "")
            + "."
        )
    return lines + [""]


def _starts_section(starts: dict[str, StartRecord]) -> list[str]:
    """Where each server start went: seconds per phase (docs/raw-data.md, launch.json `start`),
    the compile cache's outcome; no section when no launch recorded its start."""
    if not starts:
        return []
    rows = []
    reasons = []
    for launch, start in sorted(starts.items()):
        durations = {p.get("phase"): p.get("duration_s") for p in start.get("phases") or []}
        cache = start.get("compile_cache")
        rows.append(
            [launch, num(start.get("ready_t_s"), ".1f")]
            + [num(durations.get(name), ".1f") for name in PHASE_NAMES]
            + [str(cache).replace("_", " ") if cache else "-"]
        )
        if start.get("compile_cache_reason"):
            reasons.append(
                f"- {launch}: the compile cache failed to load: {start['compile_cache_reason']}"
            )
    lines = [
        "## Server starts",
        "",
        "Seconds from the server process's start until /health answered (Ready), and per "
        "phase of the start, as servelab saw the server log while it polled /health "
        "(to within 0.5 s); `-`: the phase's line was not in the log, its time counts in the "
        "phase before. The latest launch of each configuration.",
        "",
    ]
    lines += md_table(
        ["Launch", "Ready", *PHASE_NAMES, "Compile cache"],
        rows,
        align="l" + "r" * (len(PHASE_NAMES) + 1) + "l",
    )
    return lines + ([""] + reasons if reasons else []) + [""]


def _skipped_section(skipped: list[dict[str, str]]) -> list[str]:
    """Points and per-configuration files left out by --skip-damaged (paths relative to the
    experiment folder); no section at all when none was."""
    if not skipped:
        return []
    points = [s for s in skipped if "point" in s]
    files = [s for s in skipped if "file" in s]
    lines = ["## Skipped damaged raw data", ""]
    if points:
        lines += [
            f"{len(points)} point(s) could not be read and were left out of every table below "
            "(`--skip-damaged`); re-run their sweep to include them.",
            "",
            *[f"- `{s['point']}`: {s['reason']}" for s in points],
            "",
        ]
    if files:
        lines += [
            f"{len(files)} file(s) of a server configuration could not be read "
            "(`--skip-damaged`); the points are kept and what the analysis reads from the file "
            "is unknown below; re-run the configuration's sweep to include it.",
            "",
            *[f"- `{s['file']}` ({s['left_out']} left out): {s['reason']}" for s in files],
            "",
        ]
    return lines


def render_report(g: Groups, result: Analysis, layout: str, figures: list[str]) -> str:
    """report.md: one function per section, in the order the report reads."""
    lines = [
        "# servelab analysis",
        "",
        f"Source layout: {layout}. Every number below is computed from the raw requests.",
        "",
    ]
    lines += _host_section(result.host, result.hosts_differ)
    lines += _starts_section(result.starts or {})
    lines += _skipped_section(result.skipped or [])
    lines += _validity_section(g)
    lines += replay_section(g)
    lines += _throughput_section(g)
    lines += turns_section(result.turns or {}, g.axis)
    if any("utilization_pct" in p.metrics for pts in g.by.values() for p in pts.values()):
        lines += _telemetry_section(g)
    lines += _paired_section(g, result.paired)
    lines += _knee_section(result.knee, g.axis)
    lines += _dominance_section(result.dominance, g.axis)
    lines += _slo_section(result.slo, g.axis)
    lines += _search_section(result.search or {})
    lines += _diagnoses_section(result.diagnoses, g.axis)
    lines += _claims_section(result.claims, result.same_outputs)
    names = {c: g.level_name(c) for (_, c) in g.by}
    lines += runtimes_section(result.runtimes, names)
    lines += same_host_section(result.same_host, names)
    lines += outputs_section(result.same_outputs)
    for run in result.clients or []:
        lines += ["", *clients_section(g, run.config, run.tools, run.validity)]
    if result.confirmation is not None:
        lines += confirmation_section(result.confirmation)
    if result.rounds is not None:
        lines += ["", *rounds_section(result.rounds)]
    lines += _figures_section(figures)
    return "\n".join(lines) + "\n"


# what a level is called in the report's words, by the sweep's axis (Groups.axis)
AXIS_WORDS = {"concurrency": "concurrency", "rate": "request rate"}


def _throughput_section(g: Groups) -> list[str]:
    """Per config and level: repeats, mean throughput with its CV, and the latencies."""
    lines = [f"## Throughput by {AXIS_WORDS[g.axis]}", ""]
    header = THROUGHPUT_HEADER if not g.open_loop else ("Rate (req/s)", *THROUGHPUT_HEADER[1:])
    for sc in g.configs:
        rows = []
        for c in g.levels(sc):
            d = describe(list(g.values(sc, c, "output_throughput").values()))
            cv = "n/a (1 repeat)" if d.n == 1 else f"{num(d.cv_pct, '.2f')}%"
            rows.append(
                [c, d.n, f"{num(d.mean)} tok/s", cv]
                + [_lat(g, sc, c, "mean_ttft_ms"), _pooled(g, sc, c, "ttft", 99)]
                + [_lat(g, sc, c, "mean_tpot_ms")]
            )
        lines += [f"### {sc}", ""]
        lines += md_table(header, rows, align="rrrrrrr")
        lines.append("")
    return lines


def _paired_section(g: Groups, paired: list[PairedRow]) -> list[str]:
    """The paired comparisons (paired.json), one table per pair of adjacent levels."""
    lines = [
        f"## Paired comparisons of adjacent {AXIS_WORDS[g.axis]} levels",
        "",
        "Difference = mean over repeats of a/b - 1; agree = repeats where a > b; the verdict "
        "needs both the paired t-test on log ratios and the practical threshold. A percentile "
        f"is tested only where every repeat's requests can bound it (p99 needs "
        f"{samples_needed(99)} per point); otherwise the verdict says insufficient.",
        "",
    ]
    for sc, a, b in sorted({(r["server_config"], r["a"], r["b"]) for r in paired}):
        cells = []
        for r in paired:
            if (r["server_config"], r["a"], r["b"]) != (sc, a, b):
                continue
            ma, mb = g.mean(sc, a, r["metric"]), g.mean(sc, b, r["metric"])
            change = num(100.0 * (mb / ma - 1), "+.2f") + "%" if ma and mb is not None else "-"
            cells.append(
                [r["metric"], num(ma), num(mb), change, r["agree"]]
                + [num(r["p_value"], ".3g"), r["verdict"]]
            )
        la, lb = (f"R{a:g}", f"R{b:g}") if g.open_loop else (f"C{a}", f"C{b}")
        header = ["Metric", la, lb, "Change (b vs a)", "Agree (a > b)", "p", "Verdict"]
        lines += [f"### {sc}: {la} vs {lb}", ""]
        lines += md_table(header, cells, align="lrrrrrl")
        lines.append("")
    return lines


def _knee_section(knees: list[Knee], axis: str) -> list[str]:
    """Each config's knee (knee.json) with its reason and evidence level."""
    lines = ["## Knee", ""]
    for k in knees:
        at = knee_level(k, axis)
        where = f"{AXIS_WORDS[axis]} {at}" if at is not None else "none"
        lines.append(
            f"- **{k['server_config']}**: {where}. {k['reason']} "
            f"(*{k['evidence_level']['label']}*)."
        )
    return lines


def _dominance_section(dominance: list[DominanceRow], axis: str) -> list[str]:
    """The dominated operating points (dominance.csv), each against the point dominating it."""
    lines = ["", "## Dominated operating points", ""]
    for d in dominance:
        lines.append(
            f"- {d['server_config']} at {AXIS_WORDS[axis]} {d[axis]} is dominated by "
            f"{d['dominated_by']} "
            f"(throughput {num(d['output_throughput_delta_pct'], '+.1f')}%, "
            f"mean TTFT {num(d['mean_ttft_ms_delta_pct'], '+.1f')}%, "
            f"mean TPOT {num(d['mean_tpot_ms_delta_pct'], '+.1f')}% relative to it)"
        )
    return lines if dominance else [*lines, "- none"]


def _slo_section(s: SloJson | None, axis: str) -> list[str]:
    """The SLO and each config's capacity under it (slo.json); no section without an SLO."""
    if not s:
        return []
    allowed = f"{100 * s['allowed_over']:g}%"
    lines = [
        "",
        "## SLO capacity",
        "",
        "SLO: " + ", ".join(f"{k} <= {v:g}" for k, v in sorted(s["slo"].items())),
        "",
        f"A level meets the SLO when, over the requests of its counted repeats pooled, the "
        f"one-sided {100 * s['confidence']:g}% upper bound (Clopper-Pearson) on the share over "
        f"a limit (a failed request counts as over) is at most {allowed}; it fails when the "
        f"lower bound is above {allowed}, and is undecided otherwise. A p99 SLO needs at least "
        f"{s['min_requests']} requests per level, all within the limits, to be met; an "
        "undecided level is never the capacity.",
        "",
    ]
    for sc, cap in sorted(s["capacity"].items()):
        if cap[axis] is None:
            lines.append(f"- {sc}: {cap['reason']}")
        else:
            lines.append(
                f"- {sc}: {AXIS_WORDS[axis]} {cap[axis]}, {num(cap['output_throughput'])} tok/s"
            )
    rows = [
        [p["server_config"], p[axis], p["decision_text"], num(p["goodput_req_s"], ".2f")]
        for p in s["points"]
    ]
    header = ["Config", AXIS_WORDS[axis].capitalize(), "Decision", "Goodput (req/s)"]
    return [*lines, "", *md_table(header, rows)]


def _search_verdict(step: StepJson) -> str:
    """The step's early-stop decision in one line; a rate without a valid repeat says so (the
    SLO itself may have held)."""
    text = step["decision_text"]
    if not any(r["valid"] for r in step["repeats"]):
        return f"{text}: no valid repeat"
    return text


def _search_section(searches: dict[str, SearchJson]) -> list[str]:
    """Each configuration's SLO capacity search (raw/<sc>/search/search.json): its answer and
    the rates it measured; no section without one."""
    if not searches:
        return []
    lines = ["", "## SLO capacity by search", ""]
    for sc, s in sorted(searches.items()):
        spec, answer = s["spec"], s["answer"]
        bounds = ", ".join(f"{k} <= {v:g}" for k, v in spec["bounds"].items() if v is not None)
        met, failed = answer["met_rate"], answer["failed_rate"]
        said = (
            f"between {met:g} and {failed:g} req/s"
            if met is not None and failed is not None
            else str(answer["reason"])
        )
        allowed = f"{100 * (1 - spec['target']):.6g}%"
        undecided = ", ".join(f"{r:g}" for r in answer["undecided_rates"])
        lines += [
            f"### {sc}: {said}",
            "",
            f"{100 * spec['target']:g}% of the requests within {bounds} "
            f"(stopped: {answer['stopped']}). A rate meets the SLO when, over the requests of "
            f"its valid repeats pooled, the one-sided {100 * spec['confidence']:g}% upper bound "
            f"on the share that misses it is at most {allowed}, and fails when the lower bound "
            f"is above; otherwise it is undecided and measured again, up to "
            f"{spec['max_rounds']} rounds of the repeats. A rate still undecided counts as not "
            "meeting, never as a pass; a repeat that failed a validity check (#validity) "
            "counts for nothing.",
            "",
        ]
        if undecided:
            lines += [f"Undecided after {spec['max_rounds']} rounds: {undecided} req/s.", ""]
        rows = [
            [
                step["order"],
                step["phase"],
                f"{step['rate']:g}",
                step["rounds"],
                ", ".join(
                    "-"
                    if r["attainment"] is None
                    else f"{100 * r['attainment']:.1f}%" + ("" if r["valid"] else " (invalid)")
                    for r in step["repeats"]
                ),
                _search_verdict(step),
            ]
            for step in s["path"]
        ]
        header = ["Step", "Phase", "Rate (req/s)", "Rounds", "Within the SLO", "Decision"]
        lines += md_table(header, rows)
        lines.append("")
    return lines


def _diagnoses_section(diags: list[Diagnosis], axis: str) -> list[str]:
    """The diagnoses (diagnoses.json) in plain words, each with its evidence level."""
    lines = [
        "",
        "## Diagnoses",
        "",
        "Each names its evidence level: the fewest repeats it rests on and whether the paired "
        "t-test called it real. On one repeat nothing can be tested; what the data show is "
        "reported as `1 repeat: not tested`. Each proposes the change it suggests, with the "
        "effect it should have, or says why it has none; `snakemake --cores all confirm` "
        "measures the proposals a confirmation can run.",
        "",
    ]
    for d in diags:
        at = level_of(d, axis)
        where = f" ({AXIS_WORDS[axis]} {at})" if at is not None else ""
        lines.append(
            f"- **{d['kind']}**, {d['server_config']}{where}, "
            f"*{d['evidence_level']['label']}*: {d['suggestion']}."
        )
        line = proposal_line(d)
        if line is not None:
            lines.append(f"  {line[0].upper()}{line[1:]}.")
    return lines if diags else [*lines, "- none"]


def _claims_section(
    claims: list[ClaimVerdict], outputs: list[ComparedOutputs] | None = None
) -> list[str]:
    """The claims (claims.json) with their verdicts, a comparison of two configurations whose
    completions differ saying so (`outputs`: the "Same outputs" pairs); no section without a
    claim."""
    if not claims:
        return []
    return ["", "## Claims", ""] + md_table(
        ["Claim", "Verdict"],
        [[f"`{c['claim']}`", _claim_text(c) + claim_note(c, outputs)] for c in claims],
    )


def _figures_section(figures: list[str]) -> list[str]:
    """The analysis figures (the telemetry figure is in its own section)."""
    lines = ["", "## Figures", ""]
    for name in figures:
        if name.endswith(".svg") and not name.startswith(TELEMETRY_FIGURE):
            lines.append(f"![{name.removesuffix('.svg')}](figures/{name})")
    return lines


def _claim_text(c: ClaimVerdict) -> str:
    """The verdict, or the reason of one not decided (invalid, not comparable, inconclusive
    for want of requests); a comparison across hosts that stands says so beside it."""
    text = str(c.get("reason") or c["verdict"])
    if c["verdict"] == "inconclusive" and c.get("reason"):
        text = f"inconclusive ({text})"
    h = c.get("hosts")
    if h and not c.get("reason"):
        text += f"; measured on different hosts: {h['a']}, {h['b']} ({h['class']})"
    return text


def _telemetry_section(g: Groups) -> list[str]:
    """Utilization next to tokens/s, and the server's own queue, per point (mean of repeats)."""
    lines = [
        "## Telemetry per point",
        "",
        "Utilization is the GPU's (NVML) where GPUs were sampled, else the server's CPU as a "
        "share of all the host's cores; server CPU is in % of one core. Running, waiting "
        "and KV usage come from the server's /metrics (peaks over the point).",
        "",
    ]
    rows = []
    for sc in g.configs:
        for c in g.levels(sc):
            kv = g.mean(sc, c, "kv_usage_max")
            wf = g.mean(sc, c, "waiting_fraction")
            rows.append(
                [
                    sc,
                    c,
                    num(g.mean(sc, c, "output_throughput")),
                    f"{num(g.mean(sc, c, 'utilization_pct'), '.1f')}%",
                    f"{num(g.mean(sc, c, 'cpu_server_util_pct_mean'), '.1f')}%",
                    num(g.mean(sc, c, "running_max"), ".1f"),
                    num(g.mean(sc, c, "waiting_max"), ".1f"),
                    f"{num(None if wf is None else 100 * wf, '.0f')}%",
                    f"{num(None if kv is None else 100 * kv, '.1f')}%",
                    num(g.mean(sc, c, "preemptions"), ".1f"),
                ]
            )
    lines += md_table(TELEMETRY_HEADER, rows, align="lrrrrrrrrr")
    lines += ["", f"![utilization vs tokens/s](figures/{TELEMETRY_FIGURE}.svg)", ""]
    return lines


def _validity_section(g: Groups) -> list[str]:
    """The checks with their thresholds, how many points passed each, and every flagged point."""
    points = g.point_flags()
    c = counts(points)
    lines = [
        "## Validity",
        "",
        "Every point is checked (docs/analysis.md#validity). A point that fails a check keeps its "
        "raw data (points.csv lists it with `valid` false and the reason); the metrics the check "
        "affects are left out of every mean, paired test, knee, dominance, SLO, diagnosis and "
        "claim, which then read `invalid: ...`. A note is recorded and never excludes. The "
        "checks from `chunk_tokens` on catch the measurement mistakes other serving benchmarks "
        "are known for (docs/pitfalls.md).",
        "",
    ]
    rows = []
    for k in checks_for(g.axis, trace="trace_reuse" in c):
        t = k.threshold(g.thresholds)
        limit = (
            f"`{SECTION}.{k.threshold_key}` = {t:g}" if k.threshold_key and t is not None else "-"
        )
        n = c[k.name]
        rows.append(
            [k.name, limit, AFFECTS_WORDS[k.affects]]
            + [n[PASSED], n[FAILED], n[NOTED], n[NOT_CHECKED]]
        )
    header = ["Check", "Threshold", "A failure removes", "Passed", "Failed", "Noted"]
    lines += md_table([*header, "Not checked"], rows, align="lllrrrr")
    lines.append("")
    flagged = [
        (sc, r, conc, f) for sc, r, conc, flags in points for f in flags if f.status == FAILED
    ]
    if not points:
        lines += ["No measured point.", ""]
    elif not flagged:
        lines += [f"All {len(points)} points passed every check.", ""]
    else:
        n_flagged = len({(sc, r, conc) for sc, r, conc, _ in flagged})
        lines += [f"{n_flagged} of {len(points)} points flagged:", ""]
        lines += md_table(
            ["Config", "Repeat", "Rate" if g.open_loop else "Concurrency", "Check"]
            + ["Removes", "Reason"],
            [
                [sc, r, conc, f.check, AFFECTS_WORDS[BY_NAME[f.check].affects], f.reason]
                for sc, r, conc, f in flagged
            ],
            align="lrrlll",
        )
        lines.append("")
    noted = [(sc, r, conc, f) for sc, r, conc, flags in points for f in flags if f.status == NOTED]
    if noted:
        lines += ["Notes (not excluded):", ""]
        lines += [
            f"- {sc} rep {r} {g.level_name(conc)}, {f.check}: {f.reason}"
            for sc, r, conc, f in noted
        ]
        lines.append("")
    unchecked = Counter(
        (f.check, f.reason) for *_, flags in points for f in flags if f.status == NOT_CHECKED
    )
    if unchecked:
        lines += ["Not checked:", ""]
        lines += [
            f"- {name}: {why} ({k} point{'s' if k != 1 else ''})"
            for (name, why), k in sorted(unchecked.items())
        ]
        lines.append("")
    return lines
