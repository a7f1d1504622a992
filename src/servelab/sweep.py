"""One sweep job: one server configuration, every (repeat, concurrency) point, in a balanced order.

Layout written (DESIGN.md "Raw data contract"):
  server/<sc>/server.log  launch.json  capacity.json
  raw/<sc>/prompts.jsonl.gz  warmup/{requests.jsonl.gz,point.json}
  raw/<sc>/rep<RR>/c<CCCC>/{requests.jsonl.gz,point.json}
  raw/<sc>/run.json                  written last: the job's output, status "complete"

Nothing measured is lost on failure: a point is measured into `c<CCCC>.partial/` and renamed
when it completes; a point cut short is kept as `c<CCCC>.incomplete[.N]/` with status
"incomplete" and never read as data. A rerun keeps the completed points, skips them, and
measures the rest on a fresh server launch (recorded in each point as `launch`).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from servelab import config as cfgmod
from servelab import hostfacts
from servelab.client import PointRun, Workload, run_point
from servelab.container import container_run_for
from servelab.errors import ServelabError
from servelab.experiment import TelemetrySection, section_from_dict
from servelab.jsonio import read_json, write_json, write_jsonl_gz
from servelab.metrics import point_metrics
from servelab.redact import redact_argv, redact_env
from servelab.schedule import Slot, plan
from servelab.server import (
    Server,
    ServerLaunch,
    choose_port,
    make_server,
    parse_capacity,
    raise_on_signals,
)
from servelab.telemetry import PointTelemetry
from servelab.workload import make_prompts

FORMAT_VERSION = 1
_WORD = re.compile("^(\u0120|\u2581)[A-Za-z]{2,}$")
Say = Callable[[str], None]


def point_dir(raw: Path, repeat: int, concurrency: int) -> Path:
    return raw / f"rep{repeat:02d}" / f"c{concurrency:04d}"


def is_complete(pdir: Path) -> bool:
    pj = pdir / "point.json"
    if not pj.exists():
        return False
    try:
        return bool(json.loads(pj.read_text(encoding="utf-8")).get("status") == "complete")
    except json.JSONDecodeError:
        return False


def _keep_incomplete(partial: Path) -> Path:
    base = partial.with_name(partial.name.removesuffix(".partial") + ".incomplete")
    dest, n = base, 1
    while dest.exists():
        n += 1
        dest = base.with_name(f"{base.name}.{n}")
    partial.rename(dest)
    return dest


def _write_point(pdir: Path, run: PointRun, info: dict[str, Any]) -> dict[str, Any]:
    point = {
        "format_version": FORMAT_VERSION,
        **info,
        "started_epoch_ns": run.started_epoch_ns,
        "finished_epoch_ns": run.finished_epoch_ns,
        "client_cpu_s": round(run.client_cpu_s, 6),
        **point_metrics(run.records),
    }
    write_jsonl_gz(pdir / "requests.jsonl.gz", (r.to_json() for r in run.records))
    write_json(pdir / "point.json", point)
    return point


def vocab_ids(model_dir: Path) -> list[int]:
    """Token ids that are whole words with a leading space ("Ġword" / "▁word").

    Text made of such tokens re-tokenizes to the same ids, so exact-length prompts converge
    at once; the /tokenize check still decides.
    """
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ServelabError(
            f"{path}: missing; prompts are built from the model's tokenizer.json (choose a "
            "model that has one, or add it to model.allow_patterns)"
        )
    tok = json.loads(path.read_text(encoding="utf-8"))
    special = {t["id"] for t in tok.get("added_tokens", [])}
    vocab: dict[str, int] = tok["model"]["vocab"]
    words = sorted(i for s, i in vocab.items() if _WORD.match(s) and i not in special)
    if len(words) >= 50:
        return words
    return sorted(i for i in vocab.values() if i not in special)


def build_prompts(
    server: Server, model: str, wl: dict[str, Any], count: int, vocab: list[int]
) -> list[str]:
    def tokenize(text: str) -> list[int]:
        body = server.post_json(
            "/tokenize", {"model": model, "prompt": text, "add_special_tokens": False}
        )
        return list(body["tokens"])

    def detokenize(ids: list[int]) -> str:
        return str(server.post_json("/detokenize", {"model": model, "tokens": ids})["prompt"])

    return make_prompts(wl["seed"], count, wl["input_tokens"], vocab, tokenize, detokenize)


class PromptPlan(NamedTuple):
    """Which prompts of raw/<sc>/prompts.jsonl.gz the warm-up and every point send."""

    total: int  # prompts to build
    offsets: dict[tuple[int, int], int]  # (repeat, concurrency) -> index of its first prompt
    warmup_offset: int


def prompt_plan(slots: list[Slot], waves: int, warmup_requests: int, unique: bool) -> PromptPlan:
    """Unique: the warm-up takes prompts [0, warmup_requests) and each slot of the full plan,
    in plan order, its own concurrency x waves prompts after them, so no prompt is sent twice
    and a resumed run gives every point the prompts a fresh run would. Not unique: every
    point starts at prompt 0, as does the warm-up."""
    if not unique:
        total = max([warmup_requests, *(s.concurrency * waves for s in slots)])
        return PromptPlan(total, {(s.repeat, s.concurrency): 0 for s in slots}, 0)
    offsets: dict[tuple[int, int], int] = {}
    at = warmup_requests
    for s in slots:
        offsets[(s.repeat, s.concurrency)] = at
        at += s.concurrency * waves
    return PromptPlan(at, offsets, 0)


def _summary_line(point: dict[str, Any]) -> str:
    tput = point.get("output_throughput")
    ttft = point.get("mean_ttft_ms")
    return (
        f"{tput:8.1f} tok/s, mean TTFT {ttft:8.1f} ms"
        if tput is not None and ttft is not None
        else "no successful request"
    ) + f", {point['failed']} failed"


def run_sweep(
    cfg: dict[str, Any],
    server_config: str,
    model_dir: Path,
    runtime: dict[str, Any],
    exp_dir: Path,
    say: Say = print,
) -> dict[str, Any]:
    raise_on_signals()
    t_job = time.monotonic()
    sc = server_config
    args = cfgmod.server_args(cfg, sc)
    srv_dir = exp_dir / "server" / sc
    raw = exp_dir / "raw" / sc
    raw.mkdir(parents=True, exist_ok=True)
    sweep = cfg["sweep"]
    slots = plan(sweep["concurrency"], sweep["repeats"], sweep["order"], sweep["order_seed"])
    todo = [s for s in slots if not is_complete(point_dir(raw, s.repeat, s.concurrency))]
    for stale in raw.glob("rep*/c*.partial"):
        _keep_incomplete(stale)
    launch_index = _next_launch_index(srv_dir)
    if not todo:
        say(f"[{sc}] all {len(slots)} points already complete")
    else:
        if len(todo) < len(slots):
            say(
                f"[{sc}] resuming: {len(slots) - len(todo)} of {len(slots)} points already complete"
            )
        _measure(cfg, sc, args, model_dir, runtime, srv_dir, raw, slots, todo, launch_index, say)
    record = {
        "format_version": FORMAT_VERSION,
        "server_config": sc,
        "status": "complete",
        "points": len(slots),
        "launches": _next_launch_index(srv_dir) - 1,
        "order": sweep["order"],
        "plan": [s.__dict__ for s in slots],
        "incomplete_kept": sorted(
            p.relative_to(raw).as_posix() for p in raw.glob("rep*/c*.incomplete*")
        ),
        "job_wall_s": round(time.monotonic() - t_job, 3),
    }
    write_json(raw / "run.json", record)
    return record


def exp_dir_of(raw: Path) -> Path:
    return raw.parents[1]  # <exp>/raw/<sc>


def _next_launch_index(srv_dir: Path) -> int:
    lj = srv_dir / "launch.json"
    if not lj.exists():
        return 1
    return int(read_json(lj).get("launch", 0)) + 1


def _measure(
    cfg: dict[str, Any],
    sc: str,
    args: dict[str, Any],
    model_dir: Path,
    runtime: dict[str, Any],
    srv_dir: Path,
    raw: Path,
    slots: list[Slot],
    todo: list[Slot],
    launch_index: int,
    say: Say,
) -> None:
    scfg = cfg["server"]
    wl = cfg["workload"]
    host = scfg["host"]
    say_sc: Say = lambda msg: say(f"[{sc}] {msg}")  # noqa: E731
    port = choose_port(host, scfg["port"], say_sc)
    launch = ServerLaunch(
        python=runtime["python"],
        model_path=str(model_dir.resolve()),
        served_name=cfg["model"]["served_name"],
        host=host,
        port=port,
        args=cfgmod.args_to_cli(args),
        # The model is always local: the server must never reach for a hub.
        env={"HF_HUB_OFFLINE": "1", **cfg["runtime"]["env"]},
        container=container_run_for(
            cfg,
            runtime,
            str(model_dir.resolve()),
            sc,
            "sweep",
            str(exp_dir_of(raw).resolve()),
            cuda_visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
        ),
    )
    log_path = srv_dir / "server.log"
    log_offset = log_path.stat().st_size if log_path.exists() else 0
    server = make_server(launch, log_path, scfg["shutdown_timeout_s"])
    t0 = time.monotonic()
    say(
        f"[{sc}] starting vLLM on {launch.base_url} (launch {launch_index}): "
        f"{' '.join(launch.args)}"
    )
    with server:
        ready_s = server.wait_ready(scfg["startup_timeout_s"], say_sc)
        say(f"[{sc}] server ready in {ready_s:.1f} s")
        placement = server.lower_engine_priority(scfg["engine_nice"], say_sc)
        log_text = log_path.read_bytes()[log_offset:].decode("utf-8", errors="replace")
        capacity = parse_capacity(log_text)
        capacity["version_endpoint"] = server.get_json("/version").get("version")
        capacity["max_num_seqs"] = args.get("max-num-seqs")
        capacity["server_config"] = sc
        write_json(srv_dir / "capacity.json", capacity)
        write_json(
            srv_dir / "launch.json",
            {
                "launch": launch_index,
                "server_config": sc,
                "command": redact_argv(launch.command()),
                "env": redact_env(launch.env),
                "args": args,
                "host": host,
                "port": port,
                "pid": server.pid,
                "started_epoch_ns": server.started_epoch_ns,
                "ready_s": round(ready_s, 3),
                "placement": placement,
                # the measuring host, beside the measurement (the report's Host section)
                "cpu_facts": hostfacts.cpu_facts(),
                "runtime_lock_sha256": runtime.get("lock_sha256"),
                "runtime_image_digest": runtime.get("image_digest"),
                "container": launch.container.name if launch.container else None,
            },
        )
        workload = Workload(
            base_url=launch.base_url,
            model=launch.served_name,
            max_tokens=wl["output_tokens"],
            ignore_eos=wl["ignore_eos"],
            request_timeout_s=wl["request_timeout_s"],
        )
        n_warmup = wl["warmup"]["requests"]
        pplan = prompt_plan(slots, wl["waves"], n_warmup, wl["unique_prompts"])
        t_p = time.monotonic()
        prompts = build_prompts(server, launch.served_name, wl, pplan.total, vocab_ids(model_dir))
        write_jsonl_gz(
            raw / "prompts.jsonl.gz", ({"index": i, "prompt": p} for i, p in enumerate(prompts))
        )
        say(
            f"[{sc}] {pplan.total} prompts of {wl['input_tokens']} tokens ready "
            f"({'unique per point' if wl['unique_prompts'] else 'shared by the points'}, "
            f"{time.monotonic() - t_p:.1f} s)"
        )
        if n_warmup:
            wu = run_point(
                workload,
                prompts[pplan.warmup_offset : pplan.warmup_offset + n_warmup],
                wl["warmup"]["concurrency"],
                f"{sc}-warmup",
            )
            wp = _write_point(
                raw / "warmup",
                wu,
                {
                    "server_config": sc,
                    "kind": "warmup",
                    "launch": launch_index,
                    "concurrency": wl["warmup"]["concurrency"],
                    "prompt_offset": pplan.warmup_offset,
                    "ignore_eos": bool(wl["ignore_eos"]),
                    "unique_prompts": bool(wl["unique_prompts"]),
                    "status": "complete",
                },
            )
            say(f"[{sc}] warm-up: {wp['num_prompts']} requests, {_summary_line(wp)}")
        orders = _orders_by_repeat(slots)
        for k, slot in enumerate(todo, 1):
            _measure_point(
                server,
                workload,
                prompts,
                pplan.offsets[(slot.repeat, slot.concurrency)],
                cfg,
                sc,
                raw,
                slot,
                orders,
                launch_index,
                f"{k}/{len(todo)}",
                say,
            )
    say(f"[{sc}] server stopped; measured {len(todo)} points in {time.monotonic() - t0:.1f} s")


def _orders_by_repeat(slots: list[Slot]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for s in slots:
        out.setdefault(s.repeat, []).append(s.concurrency)
    return out


def _measure_point(
    server: Server,
    workload: Workload,
    prompts: list[str],
    prompt_offset: int,
    cfg: dict[str, Any],
    sc: str,
    raw: Path,
    slot: Slot,
    orders: dict[int, list[int]],
    launch_index: int,
    progress: str,
    say: Say,
) -> None:
    wl = cfg["workload"]
    final = point_dir(raw, slot.repeat, slot.concurrency)
    partial = final.with_name(final.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    n = slot.concurrency * wl["waves"]
    info: dict[str, Any] = {
        "server_config": sc,
        "kind": "measured",
        "repeat": slot.repeat,
        "concurrency": slot.concurrency,
        "position": slot.position,
        "run_index": slot.run_index,
        "order": orders[slot.repeat],
        "order_kind": cfg["sweep"]["order"],
        "launch": launch_index,
        "input_tokens": wl["input_tokens"],
        "output_tokens": wl["output_tokens"],
        "prompt_offset": prompt_offset,
        "ignore_eos": bool(wl["ignore_eos"]),
        "unique_prompts": bool(wl["unique_prompts"]),
    }
    run = PointRun()
    label = f"{sc}-r{slot.repeat:02d}-c{slot.concurrency:04d}"
    # Telemetry: samplers run around the point and write telemetry.jsonl beside it, also for
    # a point cut short; their summary over the point's window goes into point.json.
    telemetry = section_from_dict(TelemetrySection, cfg["telemetry"], "telemetry")
    tel = PointTelemetry(telemetry, server.telemetry_pid(), workload.base_url)
    try:
        with tel:
            run_point(
                workload, prompts[prompt_offset : prompt_offset + n], slot.concurrency, label, run
            )
    except BaseException as exc:
        info["telemetry"] = tel.finish(partial, run.started_epoch_ns, run.finished_epoch_ns)
        _write_point(
            partial,
            run,
            {
                **info,
                "status": "incomplete",
                "error": f"interrupted: {type(exc).__name__} {exc}".strip(),
            },
        )
        kept = _keep_incomplete(partial)
        say(
            f"[{sc}] point rep{slot.repeat:02d} c={slot.concurrency} interrupted; "
            f"{len(run.records)} finished requests kept in {kept} (marked incomplete)"
        )
        raise
    info["telemetry"] = tel.finish(partial, run.started_epoch_ns, run.finished_epoch_ns)
    if not server.alive_after(run.records):
        code = server.proc.returncode if server.proc else None
        _write_point(
            partial,
            run,
            {
                **info,
                "status": "incomplete",
                "error": f"server exited with code {code} during the point",
            },
        )
        kept = _keep_incomplete(partial)
        raise ServelabError(
            f"[{sc}] the server exited during point rep{slot.repeat:02d} c={slot.concurrency}; "
            f"the point is kept as {kept} (incomplete), completed points stay in {raw}; rerun "
            f"to measure the rest. Last lines of {server.log_path}:\n{server.log_tail()}"
        )
    point = _write_point(partial, run, {**info, "status": "complete"})
    os.replace(partial, final)  # final cannot exist: only missing points are measured
    say(
        f"[{sc}] {progress} rep{slot.repeat:02d} c={slot.concurrency:<4d} "
        f"{_summary_line(point)} ({point['duration']:.1f} s)"
    )
