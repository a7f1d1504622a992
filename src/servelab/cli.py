"""The `servelab` command. Expected errors print one line, without a traceback, and exit 2."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from servelab import __version__
from servelab.errors import ServelabError


def _cmd_check_config(args: argparse.Namespace) -> int:
    from servelab.config import load

    cfg = load(Path(args.config))
    names = ", ".join(cfg.server.names)
    levels, plan = len(cfg.sweep.concurrency), cfg.sweep.rounds
    points = (
        f"{levels * plan.min} to {levels * plan.max} points each (rounds {plan.min} to "
        f"{plan.max}, until the claims are decided)"
        if plan is not None
        else f"{levels * cfg.sweep.most_repeats} points each"
    )
    print(f"{args.config}: valid; experiment {cfg.name}, server configs: {names}; {points}")
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    from servelab.summary import render_summary

    exp = Path(args.experiment_dir)
    if not (exp / "raw").is_dir():
        raise ServelabError(f"{exp}: no raw/ folder; pass results/<experiment>")
    print(render_summary(exp), end="")
    return 0


def _cmd_lock(args: argparse.Namespace) -> int:
    from servelab.jsonio import read_json
    from servelab.runtime import lock_from_pip_report

    report = read_json(Path(args.report))
    header = (
        f"servelab runtime lock: {args.title}\n"
        "Every distribution pinned with its sha256; installed with\n"
        f"  pip install --no-deps --require-hashes -r {args.out}\n"
        f"Left out: {', '.join(args.exclude)}. See envs/README.md to regenerate."
    )
    text = lock_from_pip_report(report, header, args.exclude)
    Path(args.out).write_text(text, encoding="utf-8")
    print(f"{args.out}: {text.count('--hash=')} pinned distributions")
    return 0


def _cmd_build_model(args: argparse.Namespace) -> int:
    from servelab.config import load
    from servelab.model import build_model
    from servelab.runtime import cache_dir_of

    exp = load(Path(args.config))
    record = build_model(exp.model, Path(args.out), cache_dir_of(exp.runtime))
    print(json.dumps({"revision": record["revision"], "files": len(record["files"])}))
    return 0


def _cmd_analyze(args: argparse.Namespace) -> int:
    from servelab.analysis.diagnoses import diagnosis_line
    from servelab.analysis.pipeline import analyze
    from servelab.config import default_section, load
    from servelab.experiment import AnalysisSection

    opts = (
        load(Path(args.config)).analysis
        if args.config
        else default_section(AnalysisSection, "analysis")
    )
    results = analyze(
        Path(args.root),
        Path(args.out),
        opts,
        name=args.name,
        figures=not args.no_figures,
        skip_damaged=args.skip_damaged,
    )
    print(
        f"{args.out}: {len(results['points'])} points, {len(results['diagnoses'])} diagnoses, "
        f"{len(results['claims'])} claims"
    )
    skipped = results.get("skipped") or []
    if skipped:
        print(
            f"  skipped {len(skipped)} damaged point(s) or file(s) (listed in report.md; "
            f"paths relative to {args.root}):"
        )
    for sk in skipped:
        print(f"  skipped {sk.get('point') or sk['file']}: {sk['reason']}")
    for d in results["diagnoses"]:
        print(f"  {diagnosis_line(d)}")
    for c in results["claims"]:
        print(f"  claim {c['verdict']}: {c['claim']}")
    return 0


def _cmd_bundle(args: argparse.Namespace) -> int:
    from servelab.config import REPO_ROOT, load
    from servelab.evidence.bundle import build_bundle
    from servelab.paths import ExperimentPaths

    exp = load(Path(args.config))
    paths = ExperimentPaths(Path(args.experiment_dir))
    manifest = build_bundle(exp, paths, Path(args.out), REPO_ROOT)
    print(f"{args.out}: {len(manifest['files'])} files, schema-validated")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from servelab.evidence.verify import verify

    failures = verify(Path(args.path), do_rebuild=args.rebuild)
    for line in failures:
        print(f"FAIL {line}")
    if failures:
        return 1
    what = "checksums, manifest, schemas" + (", rebuilt tables and figures" if args.rebuild else "")
    print(f"{args.path}: OK ({what})")
    return 0


EXIT_BY_VERDICT = {"REPRODUCED": 0, "NOT REPRODUCED": 1, "NOT COMPARABLE": 3}


def _cmd_compare(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from servelab.config import default_section, load
    from servelab.experiment import ReproductionSection
    from servelab.reproduce import compare, verdict_lines

    section = (
        load(Path(args.config)).reproduction
        if args.config
        else default_section(ReproductionSection, "reproduction")
    )
    if args.claim:
        section = replace(section, claims=(*section.claims, *args.claim))
    if args.tolerance_pct is not None:
        section = replace(section, tolerance_pct=args.tolerance_pct)
    if args.metric:
        section = replace(section, metrics=tuple(args.metric))
    if args.sign_only:
        section = replace(section, require_significance=False)
    out = Path(args.out) if args.out else None
    result = compare(Path(args.reference), Path(args.fresh), section, out)
    for line in verdict_lines(result):
        print(line)
    if out is not None:
        print(f"{out}/reproduction.json, {out}/report.md")
    return EXIT_BY_VERDICT[result["verdict"]]


def _cmd_release(args: argparse.Namespace) -> int:
    from servelab.evidence.release import release

    dest = release(Path(args.bundle), args.tag, Path(args.evidence), args.allow_unpinned)
    print(f"released {dest}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from servelab.runtime import LOCK_EXCLUDE

    p = argparse.ArgumentParser(prog="servelab", description=__doc__)
    p.add_argument("--version", action="version", version=f"servelab {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("check-config", help="validate an experiment config against the schema")
    c.add_argument("config")
    c.set_defaults(func=_cmd_check_config)

    s = sub.add_parser("summary", help="print the summary table of results/<experiment>")
    s.add_argument("experiment_dir")
    s.set_defaults(func=_cmd_summary)

    a = sub.add_parser("analyze", help="tables, verdicts, figures and report.md from raw data")
    a.add_argument(
        "root", help="results/<experiment>, or a vllm-bench tree (rep_NN/concurrency_CCC)"
    )
    a.add_argument("--out", required=True, help="output folder")
    a.add_argument("--config", help="experiment config whose analysis: section to use")
    a.add_argument("--name", help="server config name for a vllm-bench tree (default: folder name)")
    a.add_argument("--no-figures", action="store_true", help="skip the figures")
    a.add_argument(
        "--skip-damaged",
        action="store_true",
        help="leave out points whose raw data cannot be read (and go without a configuration's "
        "capacity or host facts whose file cannot be read), listing them in the report",
    )
    a.set_defaults(func=_cmd_analyze)

    m = sub.add_parser("build-model", help="materialize the config's model into a folder")
    m.add_argument("config")
    m.add_argument("--out", required=True)
    m.set_defaults(func=_cmd_build_model)

    lk = sub.add_parser("lock", help="write a hashed runtime lock from a pip --report file")
    lk.add_argument("--report", required=True, help="output of pip install --dry-run --report")
    lk.add_argument("--out", required=True)
    lk.add_argument("--title", required=True, help="one line: what the lock is for")
    lk.add_argument("--exclude", nargs="*", default=list(LOCK_EXCLUDE))
    lk.set_defaults(func=_cmd_lock)

    b = sub.add_parser("bundle", help="assemble the evidence bundle of results/<experiment>")
    b.add_argument("experiment_dir")
    b.add_argument("--config", required=True, help="the experiment's config file")
    b.add_argument("--out", required=True)
    b.set_defaults(func=_cmd_bundle)

    v = sub.add_parser(
        "verify", help="check a bundle folder or release tarball; exit 0 only if it holds"
    )
    v.add_argument("path")
    v.add_argument(
        "--rebuild",
        action="store_true",
        help="also re-render tables and figures from the raw data and compare bytes",
    )
    v.set_defaults(func=_cmd_verify)

    r = sub.add_parser("release", help="freeze a bundle into evidence/<experiment>/<tag>/")
    r.add_argument("bundle")
    r.add_argument("--tag", required=True)
    r.add_argument("--evidence", default="evidence", help="folder of releases (default: evidence)")
    r.add_argument(
        "--allow-unpinned",
        action="store_true",
        help="release even with unpinned inputs (the release records why)",
    )
    r.set_defaults(func=_cmd_release)

    cp = sub.add_parser(
        "compare",
        help="compare a fresh run with a reference; exit 0 only when it is REPRODUCED",
    )
    cp.add_argument(
        "reference", help="release folder, .tar.gz, bundle, results/<exp> or vllm-bench tree"
    )
    cp.add_argument("fresh", help="the same kinds as the reference")
    cp.add_argument("--out", help="write reproduction.json and report.md here")
    cp.add_argument("--config", help="take the reproduction: section of this experiment config")
    cp.add_argument(
        "--claim", action="append", help="a claim to check besides the reference's (repeatable)"
    )
    cp.add_argument(
        "--metric", action="append", help="judge orderings of this metric only (repeatable)"
    )
    cp.add_argument(
        "--tolerance-pct", type=float, help="also judge throughput means: at most this change"
    )
    cp.add_argument(
        "--sign-only",
        action="store_true",
        help="an ordering holds when its sign does, even if not significant in the fresh run",
    )
    cp.set_defaults(func=_cmd_compare)

    from servelab.telemetry.report import add_subcommand as add_telemetry

    add_telemetry(sub)

    from servelab.profile.cli import add_parser as add_profile

    add_profile(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ServelabError as exc:
        print(f"servelab: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
