"""The prompts one server launch sends, whatever the workload: synthetic prompts of one exact
length (the default), of drawn lengths, with shared prefixes, multi-turn conversations, or
prompts sampled from a dataset; and how they are kept in the raw data.

`PromptSource.of(exp, model_dir, say)` is made once per job: it pins the dataset (the file at
workload.dataset.path checked against its sha256, or the hub file downloaded and verified) and
reads its pairs, before any server starts. `PromptSource.build(session, count)` makes a
launch's prompts with that server's tokenizer (servelab.workload.synthetic for synthetic ones,
servelab.workload.datasets for a dataset's), and `write_prompts` keeps them in
raw/<sc>/prompts.jsonl.gz: one row per item, `{"index", "prompt"}` as always for a plain
prompt, with `max_tokens`, `input_tokens` and `prefix` when the prompt carries them, and
`{"index", "turns": [{"prompt", "max_tokens"}, ..], "system"?, "prefix"?}` for a conversation.
A dataset's record (its identity, the filter, what was sampled) goes to raw/<sc>/dataset.json.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from servelab.client.prompt import Conversation, Prompt, PromptLike
from servelab.documents.declared import IntendedReuse, TraceJson
from servelab.errors import ServelabError
from servelab.experiment import Experiment, Lengths, WorkloadSection
from servelab.job import Say
from servelab.launch.session import Session
from servelab.store.jsonio import write_json, write_jsonl_gz
from servelab.store.paths import TRACE_FILE
from servelab.workload import datasets, synthetic as workload, trace

Item = PromptLike | Conversation


@dataclass(frozen=True)
class PromptSet:
    """A launch's prompts (or conversations) and, for a dataset, the sampling record."""

    items: list[Item]
    dataset: dict[str, object] | None = None  # dataset.json: `file`, then the sample's record
    source: str | None = None  # the dataset, in words (None: synthetic)
    trace: TraceJson | None = None  # a trace's record (raw/<sc>/trace.json)

    def describe(self, wl: WorkloadSection) -> str:
        """What the prompts are, for the run's progress line."""
        n = len(self.items)
        if wl.chat is not None:
            what = f"{n} conversations of {wl.chat.turns} turns"
        elif self.trace is not None:
            win = self.trace["window"]
            copies = (n - wl.warmup.requests) // max(1, win["requests"])
            what = (
                f"{copies} replay{'s' if copies != 1 else ''} of {win['requests']} requests "
                f"of trace {self.source} ({trace.window_text(win)})"
            )
        elif self.source is not None:
            what = f"{n} prompts sampled from {self.source}"
        elif isinstance(wl.input_tokens, int):
            what = f"{n} prompts of {wl.input_tokens} tokens"
        else:
            what = f"{n} prompts of {_lengths_text(wl.input_tokens)} tokens"
        if wl.shared_prefix is not None:
            sp = wl.shared_prefix
            what += f", {sp.prefixes} shared prefixes of {sp.prefix_tokens} tokens"
        return what


def _lengths_text(lengths: int | Lengths | None) -> str:
    if lengths is None:
        return "dataset"
    if isinstance(lengths, int):
        return str(lengths)
    if lengths.values is not None:
        return "{" + ", ".join(str(v) for v in lengths.values) + "}"
    return f"{lengths.min}-{lengths.max}"


@dataclass(frozen=True)
class PromptSource:
    """Where a job's prompts come from: the workload, the model (its vocabulary for synthetic
    prompts) and, for a dataset workload, the pinned file (`dataset`) and its pairs; for a
    trace workload, the pinned trace file (`dataset`) and its requests (`trace_rows`)."""

    wl: WorkloadSection
    model_dir: Path
    dataset: datasets.DatasetFile | None = None
    pairs: tuple[datasets.Pair, ...] = ()
    trace_rows: tuple[trace.TraceRow, ...] = ()

    @staticmethod
    def of(exp: Experiment, model_dir: Path, say: Say) -> PromptSource:
        """The job's prompt source; a dataset or trace is pinned (and downloaded) here, once."""
        tr = exp.workload.trace
        if tr is not None:
            file = trace.resolve_trace(tr)
            rows = trace.read_trace(file.path, tr.format)
            say(f"trace {label(file)}: {len(rows)} requests, sha256 {file.sha256[:12]}")
            return PromptSource(exp.workload, model_dir, file, trace_rows=tuple(rows))
        spec = exp.workload.dataset
        if spec is None:
            return PromptSource(exp.workload, model_dir)
        file = datasets.resolve_dataset(spec)
        pairs = datasets.read_pairs(file.path, spec.format)
        say(f"dataset {label(file)}: {len(pairs)} pairs, sha256 {file.sha256[:12]}")
        return PromptSource(exp.workload, model_dir, file, tuple(pairs))

    def build(self, session: Session, count: int) -> PromptSet:
        """`count` items for this launch, built or measured with its server's tokenizer."""
        wl = self.wl
        server, model = session.server, session.launch.served_name
        if self.dataset is None:  # the default's plain strings too, the same bytes as always
            vocab = workload.vocab_ids(self.model_dir)
            return PromptSet(workload.build_workload(server, model, wl, count, vocab))
        if wl.trace is not None:
            return self.build_trace(session, count)
        assert wl.dataset is not None
        # a dataset's prompts are counted as the server counts a prompt: special tokens too
        as_prompt, _ = workload.server_tokenizer(server, model, special=True)
        sampled = datasets.sample_dataset(
            list(self.pairs),
            count,
            seed=wl.seed,
            spec=wl.dataset,
            model_len=session.max_model_len(),
            count_tokens=lambda text: len(as_prompt(text)),
        )
        prompts: list[Item] = list(sampled.prompts)
        if wl.shared_prefix is not None:
            vocab = workload.vocab_ids(self.model_dir)
            tokenize, detokenize = workload.server_tokenizer(server, model)
            prefixes = workload.shared_prefixes(
                wl.shared_prefix, wl.seed, vocab, tokenize=tokenize, detokenize=detokenize
            )
            prompts = list(workload.with_prefixes(sampled.prompts, prefixes,
                                                  wl.shared_prefix.prefix_tokens,
                                                  tokenize=as_prompt))  # fmt: skip
        record = {"file": self.dataset.to_json(), **sampled.record}
        return PromptSet(prompts, record, label(self.dataset))

    def trace_window(self, session: Session) -> trace.Window:
        """The window of the trace this launch replays, filtered to its max-model-len (the
        tokens its server adds to a prompt counted)."""
        assert self.wl.trace is not None
        return trace.window(self.trace_rows, self.wl.trace, session.max_model_len(),
                            _special(session))  # fmt: skip

    def build_trace(self, session: Session, count: int) -> PromptSet:
        """A trace's items: the warm-up's first (the window's first lengths, each prompt its
        own tokens, so the warm-up leaves none of the trace's blocks in the cache), then one
        copy of the window per point, each with blocks of its own (`count` - warm-up items
        in all)."""
        wl, tr = self.wl, self.wl.trace
        assert tr is not None and self.dataset is not None
        server, model = session.server, session.launch.served_name
        win = self.trace_window(session)
        tokenize, detokenize = workload.server_tokenizer(server, model)
        vocab = workload.vocab_ids(self.model_dir)
        b = trace.TraceBuilder(
            vocab, wl.seed, win.block_tokens, tokenize, detokenize, _special(session)
        )
        warm = wl.warmup.requests
        rows = [win.rows[i % len(win.rows)] for i in range(warm)]
        items: list[Item] = [
            b.prompt(replace(r, hash_ids=None), i, "warmup") for i, r in enumerate(rows)
        ]
        copies, left = divmod(count - warm, len(win.rows))
        if left:
            raise ValueError(f"build_trace: {count - warm} items are not copies of the window")
        for k in range(copies):
            items += b.replay(win, f"p{k}")
        record: TraceJson = {
            "format_version": trace.FORMAT_VERSION,
            "file": self.dataset.to_json(),
            "seed": wl.seed,
            "block_tokens": tr.block_tokens,
            "window": win.record(),
            "rows": len(self.trace_rows),
        }
        return PromptSet(items, None, label(self.dataset), record)


def _special(session: Session) -> int:
    """The tokens the server adds to a prompt (a BOS token): counted in a trace's lengths."""
    server, model = session.server, session.launch.served_name
    with_special, _ = workload.server_tokenizer(server, model, special=True)
    plain, _ = workload.server_tokenizer(server, model)
    return len(with_special(" a")) - len(plain(" a"))


def label(file: datasets.DatasetFile) -> str:
    """A dataset file in words: its path, or repo_id/filename@revision on the hub."""
    if file.source == "hub":
        return f"{file.repo_id}/{file.filename}@{str(file.revision)[:12]}"
    return str(file.path)


def rows(items: Sequence[Item]) -> Iterator[dict[str, object]]:
    """The rows of prompts.jsonl.gz (a plain prompt's row is as it always was)."""
    for i, item in enumerate(items):
        if isinstance(item, str):
            yield {"index": i, "prompt": item}
        elif isinstance(item, Prompt):
            yield {"index": i, "prompt": item.text, **_asked(item)}
        else:
            row: dict[str, object] = {"index": i}
            if item.system is not None:
                row["system"] = item.system
            if item.prefix is not None:
                row["prefix"] = item.prefix
            row["turns"] = [{"prompt": t.text, **_asked(t)} for t in item.turns]
            yield row


def _asked(p: Prompt) -> dict[str, int]:
    out: dict[str, int] = {}
    for key in ("max_tokens", "input_tokens", "prefix"):
        v = getattr(p, key)
        if v is not None:
            out[key] = v
    return out


def write_prompts(prompts_path: Path, dataset_path: Path, pset: PromptSet) -> None:
    """prompts.jsonl.gz, and beside it dataset.json for a dataset workload. A dataset.json
    written before with another dataset identity stops the run: points measured on one
    dataset are not mixed with points of another in one results folder."""
    if pset.dataset is not None:
        from servelab.store.jsonio import read_json

        if dataset_path.exists():
            kept = read_json(dataset_path)
            why = datasets.same_dataset(kept, pset.dataset)
            if why is not None:
                raise ServelabError(
                    f"{dataset_path}: the points here were measured on another dataset "
                    f"({why}); measure into a fresh results_dir, or restore the dataset"
                )
        write_json(dataset_path, pset.dataset)
    if pset.trace is not None:
        _write_trace(dataset_path.with_name(TRACE_FILE), pset.trace)
    write_jsonl_gz(prompts_path, rows(pset.items))


def _write_trace(path: Path, record: TraceJson) -> None:
    """raw/<sc>/trace.json; one written before with another trace, window or seed stops the
    run (`trace.same_trace`)."""
    from servelab.store.jsonio import read_json

    if path.exists():
        why = trace.same_trace(read_json(path), record)
        if why is not None:
            raise ServelabError(
                f"{path}: the points here replayed another trace ({why}); measure into a fresh "
                "results_dir, or restore the trace"
            )
    write_json(path, record)


def slice_reuse(items: Sequence[Item], wl: WorkloadSection) -> IntendedReuse | None:
    """point.json's `shared_prefix`: what the point's own prompts mean the prefix cache to
    serve (servelab.workload.synthetic.intended_reuse); None without shared prefixes."""
    if wl.shared_prefix is None:
        return None
    return workload.intended_reuse(items, wl.shared_prefix.prefix_tokens).copy()
