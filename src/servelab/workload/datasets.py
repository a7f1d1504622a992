"""Prompts and output lengths sampled from a dataset file (workload.dataset): pinning the file,
reading its prompt/reply pairs, and the seeded, filtered sample a launch sends.

The file is pinned before anything is read (`resolve_dataset`). One named by path must have
the sha256 the config gives. One on the Hugging Face hub is a file of a dataset repository at a
40-hex commit, downloaded with `huggingface_hub.hf_hub_download` into the servelab cache
(`<cache>/datasets`, huggingface_hub's own layout) and checked against what the hub says the
file is (the LFS sha256 of a large file, the git blob sha1 of the others) and against the
config's sha256 when given; a cached file whose sha256 equals the pin is used without asking
the hub (so a pinned hub dataset works offline once downloaded). The token comes from the
HF_TOKEN environment variable only and is never written anywhere.

Two formats (`read_pairs`): ShareGPT, read as `vllm bench serve --dataset-name sharegpt` reads
it (the first turn of a conversation is the prompt, the second the reply whose token length
is the output length), and JSON lines of `{"prompt", "output_tokens"}`.

`sample_dataset` walks the pairs in an order shuffled by the seed, counts each candidate's
tokens with the server's tokenizer and keeps those that pass the filter, until it has as many
as asked; fewer eligible pairs are sent again in the same order, and the record says so. Its
record (with `DatasetFile.to_json()` as `file`) is raw/<config>/dataset.json; `same_dataset`
says whether two such records sampled the same dataset the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from servelab.client.prompt import Prompt
from servelab.documents.declared import DatasetFileJson
from servelab.env.model import HubFile, HubKeys, hub_errors
from servelab.errors import ServelabError
from servelab.experiment import DatasetFilter, DatasetSection
from servelab.store.hashing import git_blob_sha1, sha256_file
from servelab.store.jsonio import DamagedFile, json_object_line
from servelab.store.paths import default_cache_dir

FORMAT_VERSION = 1
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# the rejection reasons of the sample record, in the order a candidate is checked
REASONS = (
    "input_below_min",
    "input_above_max",
    "output_below_min",
    "output_above_max",
    "over_model_len",
)
# the sampled pairs' indices are listed in the record up to this many distinct pairs
LIST_INDICES = 64

CountTokens = Callable[[str], int]


# --- the file --------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetFile:
    """A pinned dataset file. `path`: the local file read (for source "path" the config's own
    path, relative to the working directory or absolute; for "hub" the file in the cache);
    `sha256` and `bytes`: its content. `repo_id`, `filename`, `revision`: the hub file (None
    for a path)."""

    source: str  # path | hub
    path: Path
    sha256: str
    bytes: int
    repo_id: str | None = None
    filename: str | None = None
    revision: str | None = None

    def to_json(self) -> DatasetFileJson:
        """The file's identity, the same on every host: the config's path, or the hub's
        repository, file and commit (never the local cache path), and the content's sha256
        and size."""
        if self.source == "hub":
            if self.repo_id is None or self.filename is None or self.revision is None:
                raise ServelabError("workload.dataset.hub: give repo_id, filename and revision")
            return {
                "source": "hub",
                "repo_id": self.repo_id,
                "filename": self.filename,
                "revision": self.revision,
                "sha256": self.sha256,
                "bytes": self.bytes,
            }
        return {
            "source": "path",
            "path": self.path.as_posix(),
            "sha256": self.sha256,
            "bytes": self.bytes,
        }


class DatasetHub(Protocol):
    """What resolving a hub dataset needs of the hub (HfDatasetHub; a fake in tests)."""

    def file_info(self, repo_id: str, filename: str, revision: str) -> HubFile: ...

    def download(self, repo_id: str, filename: str, revision: str, cache_dir: Path) -> Path: ...


class HfDatasetHub:
    """Dataset files on the Hugging Face hub through huggingface_hub. The token is HF_TOKEN's
    value or none (never the token file a `hf auth login` leaves), and it is never logged."""

    def __init__(self, token: str | None = None, endpoint: str | None = None) -> None:
        self._token: str | bool = token or False
        self.endpoint = endpoint

    @staticmethod
    def from_env(endpoint: str | None = None) -> HfDatasetHub:
        return HfDatasetHub(os.environ.get("HF_TOKEN") or None, endpoint)

    def file_info(self, repo_id: str, filename: str, revision: str) -> HubFile:
        """The file as the hub lists it at the commit (`POST /api/datasets/<repo>/paths-info/
        <revision>`): size, git blob sha1 and, for an LFS file, its sha256."""
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile

        api = HfApi(endpoint=self.endpoint, token=self._token)
        with _hub_errors(repo_id, filename, revision):
            entries = api.get_paths_info(
                repo_id, [filename], revision=revision, repo_type="dataset"
            )
        for e in entries:
            if e.path == filename and isinstance(e, RepoFile):
                lfs = e.lfs.sha256 if e.lfs is not None else None
                return HubFile(path=e.path, size=e.size, blob_id=e.blob_id, lfs_sha256=lfs)
        what = "a folder" if entries else "not in the repository at this commit"
        raise ServelabError(
            f"workload.dataset.hub: {_hub_name(repo_id, filename, revision)}: {filename} is "
            f"{what}; check workload.dataset.hub.filename"
        )

    def download(self, repo_id: str, filename: str, revision: str, cache_dir: Path) -> Path:
        """The file in huggingface_hub's cache under cache_dir (downloaded unless it is there
        already: a commit's files do not change)."""
        from huggingface_hub import hf_hub_download

        with _hub_errors(repo_id, filename, revision):
            local = hf_hub_download(
                repo_id,
                filename,
                revision=revision,
                repo_type="dataset",
                cache_dir=str(cache_dir),
                token=self._token,
                endpoint=self.endpoint,
            )
        return Path(str(local))


def _hub_name(repo_id: str, filename: str, revision: str) -> str:
    return f"{repo_id}/{filename}@{revision}"


def _hub_errors(repo_id: str, filename: str, revision: str) -> AbstractContextManager[None]:
    """Hub failures as one line naming the dataset file and the key to check."""
    keys = HubKeys(
        f"workload.dataset.hub: {_hub_name(repo_id, filename, revision)}",
        "workload.dataset.hub.repo_id",
        "workload.dataset.hub.revision",
        "workload.dataset.hub.filename",
        missing="the file is not in the cache",
        kind="dataset repository",
    )
    return hub_errors(keys)


def check_local_pin(spec: DatasetSection | None) -> DatasetFile | None:
    """A dataset named by path, checked against its pin now (for the workflow's start and
    `servelab check-config`: a wrong file stops the run before anything is built); None for
    no dataset or one on the hub, which is downloaded and checked by the sweep."""
    if spec is None or spec.hub is not None or spec.path is None:
        return None
    return _resolve_path(spec.path, spec.sha256)


def resolve_dataset(
    spec: DatasetSection, *, cache_dir: Path | None = None, hub: DatasetHub | None = None
) -> DatasetFile:
    """The pinned file workload.dataset names, checked: a path's sha256 against the pin; a hub
    file (downloaded into `<cache_dir or the servelab cache>/datasets`) against the pin when
    it matches, else against the hub's own hashes (and then the pin)."""
    if spec.hub is None:
        if spec.path is None:  # config.validate requires path or hub
            raise ServelabError("workload.dataset: give path (with its sha256) or hub")
        return _resolve_path(spec.path, spec.sha256)
    repo_id, filename, revision = spec.hub.repo_id, spec.hub.filename, spec.hub.revision
    name = _hub_name(repo_id, filename, revision)
    if not COMMIT.match(revision):
        raise ServelabError(
            f"workload.dataset.hub.revision: {revision!r} is not a commit (a branch or tag name "
            f"moves); pin the commit: set it to the full 40-hex commit sha of {repo_id} "
            f"(listed at huggingface.co/datasets/{repo_id}/commits/main)"
        )
    hub = hub or HfDatasetHub.from_env()
    local = hub.download(
        repo_id, filename, revision, (cache_dir or default_cache_dir()) / "datasets"
    )
    if not local.is_file():
        raise ServelabError(
            f"workload.dataset.hub: {name}: {filename} is a folder, not a file; check "
            "workload.dataset.hub.filename"
        )
    digest = sha256_file(local)
    size = local.stat().st_size
    found = DatasetFile("hub", local, digest, size, repo_id, filename, revision)
    if spec.sha256 is not None and digest == spec.sha256:
        return found  # the pinned content, whatever the hub lists now
    listed = hub.file_info(repo_id, filename, revision)
    _check_against_hub(local, listed, name)
    if spec.sha256 is not None:
        raise ServelabError(
            f"workload.dataset.sha256: {name} is sha256 {digest} on the hub, the config pins "
            f"{spec.sha256}; pin this file's digest or name the file the pin is for"
        )
    return found


def _resolve_path(given: str, pinned: str | None) -> DatasetFile:
    path = Path(given)
    if not path.is_file():
        raise ServelabError(
            f"workload.dataset.path: {given}: no such file (a relative path is read from the "
            f"working directory, {Path.cwd()}); give the dataset file's path"
        )
    digest = sha256_file(path)
    if pinned is None:  # config.validate requires it with path
        raise ServelabError(
            f"workload.dataset.sha256: required with path: pin {given} with sha256: {digest}"
        )
    if digest != pinned:
        raise ServelabError(
            f"workload.dataset.path {given}: sha256 is {digest}, the config pins {pinned}; "
            f"restore the pinned file, or pin this one (workload.dataset.sha256: {digest})"
        )
    return DatasetFile("path", path, digest, path.stat().st_size)


def _check_against_hub(local: Path, listed: HubFile, name: str) -> None:
    """The downloaded file is what the hub lists: its size, and its LFS sha256 (a large file)
    or git blob sha1 (the others)."""
    fix = f"delete {local} (huggingface_hub's cache) and run again"
    size = local.stat().st_size
    if listed.size is not None and size != listed.size:
        raise ServelabError(
            f"workload.dataset.hub: {name}: the download is {size} bytes, the hub lists "
            f"{listed.size}; {fix}"
        )
    if listed.lfs_sha256 is not None:
        digest = sha256_file(local)
        if digest != listed.lfs_sha256:
            raise ServelabError(
                f"workload.dataset.hub: {name}: the download's sha256 {digest} differs from "
                f"the hub's LFS sha256 {listed.lfs_sha256}; {fix}"
            )
    elif listed.blob_id is not None:
        blob = git_blob_sha1(local)
        if blob != listed.blob_id:
            raise ServelabError(
                f"workload.dataset.hub: {name}: the download's git blob sha1 {blob} differs "
                f"from the hub's {listed.blob_id}; {fix}"
            )
    else:
        raise ServelabError(
            f"workload.dataset.hub: {name}: the hub lists no hash for the file, so the download "
            "cannot be checked; pin its sha256 in workload.dataset.sha256"
        )


# --- the pairs -------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    """One prompt of a dataset: `reply`, the text whose token length is the output length (a
    ShareGPT reply; None in JSON lines); `output_tokens`, the output length a JSON line gives
    (None: not given); `where`, where it is in the file, for messages (`$[12]`, `line 13`)."""

    prompt: str
    reply: str | None
    output_tokens: int | None
    where: str = ""


def read_pairs(path: Path, fmt: str) -> list[Pair]:
    """The prompt/reply pairs of a dataset file, in file order.

    sharegpt: a JSON list of objects whose `conversations` is a list of turns `{"from",
    "value"}`; as `vllm bench serve` reads it, the first turn's value is the prompt and the
    second's the reply, whoever the turns are from, and later turns are not read. An entry
    without `conversations` or with fewer than two turns is skipped. jsonl: one JSON object
    per line with `prompt` (a string) and optionally `output_tokens` (an integer >= 1); other
    keys are ignored, blank lines skipped.

    A file that is not UTF-8, not JSON, not of the format, or holds no pair: a one-line
    ServelabError naming the file and where (DamagedFile)."""
    if fmt == "sharegpt":
        pairs = _sharegpt_pairs(path)
    elif fmt == "jsonl":
        pairs = _jsonl_pairs(path)
    else:
        raise ServelabError(f"workload.dataset.format: {fmt!r}: give sharegpt or jsonl")
    if not pairs:
        what = "conversation of two turns or more" if fmt == "sharegpt" else "line"
        raise DamagedFile(path, "$", f"no {what} to sample (workload.dataset.format {fmt})")
    return pairs


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ServelabError(f"{path}: file not found") from None
    except UnicodeDecodeError as exc:
        raise DamagedFile(path, "$", f"not UTF-8 text ({exc.reason})") from None


def _sharegpt_pairs(path: Path) -> list[Pair]:
    text = _text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = (
            "; one JSON object per line is workload.dataset.format jsonl"
            if exc.msg == "Extra data"
            else ""
        )
        raise DamagedFile(
            path, "$", f"not valid JSON ({exc.msg} at line {exc.lineno}){hint}"
        ) from None
    if not isinstance(data, list):
        raise DamagedFile(
            path,
            "$",
            f"a JSON {type(data).__name__}, not the list of conversations of format sharegpt",
        )
    pairs: list[Pair] = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise DamagedFile(path, f"$[{i}]", f"a {type(entry).__name__}, not an object")
        turns = entry.get("conversations")
        if turns is None:
            continue
        if not isinstance(turns, list):
            raise DamagedFile(path, f"$[{i}].conversations", "not a list of turns")
        if len(turns) < 2:
            continue
        values = []
        for t in (0, 1):
            turn = turns[t]
            value = turn.get("value") if isinstance(turn, dict) else None
            if not isinstance(value, str):
                raise DamagedFile(
                    path, f"$[{i}].conversations[{t}]", 'not a turn {"from", "value": "text"}'
                )
            values.append(value)
        pairs.append(Pair(values[0], values[1], None, f"$[{i}]"))
    return pairs


def _jsonl_pairs(path: Path) -> list[Pair]:
    pairs: list[Pair] = []
    for lineno, line in enumerate(_text(path).splitlines(), 1):
        if not line.strip():
            continue
        row = json_object_line(path, lineno, line, "format jsonl: one JSON object per line")
        prompt = row.get("prompt")
        if not isinstance(prompt, str):
            raise DamagedFile(path, f"line {lineno}", "prompt: missing or not a string")
        out = row.get("output_tokens")
        if out is not None and (isinstance(out, bool) or not isinstance(out, int) or out < 1):
            raise DamagedFile(
                path, f"line {lineno}", f"output_tokens: {out!r} is not an integer >= 1"
            )
        pairs.append(Pair(prompt, None, out, f"line {lineno}"))
    return pairs


# --- the sample ------------------------------------------------------------------------


@dataclass(frozen=True)
class Sampled:
    """A launch's prompts from a dataset, in the order sent, and the record of how they were
    sampled (raw/<config>/dataset.json without `file`)."""

    prompts: tuple[Prompt, ...]
    record: dict[str, Any]


def applied_filter(spec: DatasetSection, model_len: int | None) -> dict[str, int | None]:
    """The bounds a pair must pass, as applied: workload.dataset.filter and the server's
    max-model-len (input + output). With workload.dataset.output_tokens the replies are not
    counted and the output bounds are not applied (None), as `vllm bench serve` skips its
    minimum output length with --sharegpt-output-len."""
    f: DatasetFilter = spec.filter
    fixed = spec.output_tokens is not None
    return {
        "min_input_tokens": f.min_input_tokens,
        "max_input_tokens": f.max_input_tokens,
        "min_output_tokens": None if fixed else f.min_output_tokens,
        "max_output_tokens": None if fixed else f.max_output_tokens,
        "max_model_len": model_len,
    }


def sample_dataset(
    pairs: Sequence[Pair],
    count: int,
    *,
    seed: int,
    spec: DatasetSection,
    model_len: int | None,
    count_tokens: CountTokens,
) -> Sampled:
    """`count` prompts sampled from `pairs`, each a Prompt carrying its output length
    (`max_tokens`) and its prompt's token count (`input_tokens`).

    The pair indices are shuffled with random.Random(seed) and walked in that order. For each
    candidate the prompt's tokens are counted (`count_tokens`, the server's tokenizer), then
    its output length: workload.dataset.output_tokens when set, else the reply's token count
    (sharegpt) or the line's `output_tokens` (jsonl). A candidate is rejected for the first
    bound it fails, in the order of REASONS (a reply is counted only for a prompt that passed):
    the input bounds, the output bounds, then input + output <= model_len. The walk stops when
    `count` pairs are kept, so a smaller count samples the first prompts of a larger one.

    When fewer pairs pass than `count`, every pair has been walked and the kept ones are sent
    again in the same order (`passes`, `distinct`); when none passes, a one-line error giving
    the filter and what each bound rejected. The same pairs, seed, spec, model_len and
    tokenizer give the same prompts and the same record."""
    if count < 1:
        raise ValueError(f"sample_dataset: count {count} < 1")
    if spec.output_tokens is None:
        missing = [p for p in pairs if p.reply is None and p.output_tokens is None]
        if missing:
            raise ServelabError(
                f"workload.dataset: {len(missing)} of {len(pairs)} prompts give no output "
                f"length (the first at {missing[0].where}); give each line output_tokens, or "
                "set workload.dataset.output_tokens"
            )
    bounds = applied_filter(spec, model_len)
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    rejected = dict.fromkeys(REASONS, 0)
    kept: list[tuple[int, int, int]] = []  # (pair index, input tokens, output tokens)
    walked = 0
    for i in order:
        if len(kept) == count:
            break
        walked += 1
        why, n_in, n_out = _judge(pairs[i], spec, bounds, count_tokens)
        if why is None:
            kept.append((i, n_in, n_out))
        else:
            rejected[why] += 1
    if not kept:
        raise ServelabError(
            f"workload.dataset: none of the dataset's {len(pairs)} prompts passes the filter "
            f"({_bounds_text(bounds)}; rejected: "
            + ", ".join(f"{k} {v}" for k, v in rejected.items() if v)
            + "); widen workload.dataset.filter"
        )
    sent = [kept[j % len(kept)] for j in range(count)]
    prompts = tuple(Prompt(pairs[i].prompt, max_tokens=o, input_tokens=n) for i, n, o in sent)
    indices = [i for i, _, _ in kept]
    record: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "format": spec.format,
        "seed": seed,
        "count": count,
        "output_tokens": spec.output_tokens,
        "filter": bounds,
        "pairs": len(pairs),
        "walked": walked,
        "rejected": rejected,
        "distinct": len(kept),
        "passes": -(-count // len(kept)),
        "indices": indices if len(indices) <= LIST_INDICES else None,
        "indices_sha256": _digest(indices),
        "lengths": {
            "input_tokens": _summary([p.input_tokens or 0 for p in prompts]),
            "output_tokens": _summary([p.max_tokens or 0 for p in prompts]),
        },
        "prompts_sha256": prompts_digest(prompts),
    }
    return Sampled(prompts, record)


def _judge(
    pair: Pair, spec: DatasetSection, bounds: Mapping[str, int | None], count_tokens: CountTokens
) -> tuple[str | None, int, int]:
    """(the first bound the pair fails or None, its input tokens, its output tokens)."""
    n_in = count_tokens(pair.prompt)
    lo, hi = bounds["min_input_tokens"], bounds["max_input_tokens"]
    if lo is not None and n_in < lo:
        return "input_below_min", n_in, 0
    if hi is not None and n_in > hi:
        return "input_above_max", n_in, 0
    if spec.output_tokens is not None:
        n_out = spec.output_tokens
    elif pair.reply is not None:
        n_out = count_tokens(pair.reply)
    else:
        assert pair.output_tokens is not None  # sample_dataset checked every pair first
        n_out = pair.output_tokens
    lo, hi = bounds["min_output_tokens"], bounds["max_output_tokens"]
    if lo is not None and n_out < lo:
        return "output_below_min", n_in, n_out
    if hi is not None and n_out > hi:
        return "output_above_max", n_in, n_out
    model_len = bounds["max_model_len"]
    if model_len is not None and n_in + n_out > model_len:
        return "over_model_len", n_in, n_out
    return None, n_in, n_out


def _bounds_text(bounds: Mapping[str, int | None]) -> str:
    parts = [f"{k} {'none' if v is None else v}" for k, v in bounds.items() if k != "max_model_len"]
    if bounds["max_model_len"] is not None:
        parts.append(f"input + output <= max-model-len {bounds['max_model_len']}")
    return ", ".join(parts)


def _summary(xs: Sequence[int]) -> dict[str, int | float]:
    """min, p50 (the lower median: a length that was sampled), mean and max."""
    return {
        "min": min(xs),
        "p50": statistics.median_low(xs),
        "mean": sum(xs) / len(xs),
        "max": max(xs),
    }


def _canonical(data: object) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _digest(data: object) -> str:
    return hashlib.sha256(_canonical(data)).hexdigest()


def prompts_digest(prompts: Sequence[Prompt]) -> str:
    """sha256 of the prompts as sent, in order: the canonical JSON (sorted keys, no spaces,
    UTF-8) of the list of `{"prompt", "input_tokens", "max_tokens"}`."""
    rows = [
        {"prompt": p.text, "input_tokens": p.input_tokens, "max_tokens": p.max_tokens}
        for p in prompts
    ]
    return _digest(rows)


# --- comparing records -----------------------------------------------------------------


def _part(record: Mapping[str, object], key: str) -> Mapping[str, object]:
    """A record's object at `key` ({} where it has none)."""
    value = record.get(key)
    return value if isinstance(value, Mapping) else {}


def same_dataset(a: Mapping[str, object], b: Mapping[str, object]) -> str | None:
    """None when two dataset records (raw/<config>/dataset.json: `file` and the sample) are
    the same dataset sampled the same way: the file's sha256, the format, the seed,
    workload.dataset.output_tokens and the filter as applied (max-model-len included). Else
    the first difference, in one line. The count, and where the file came from (a path or
    the hub), do not count."""
    sa = _part(a, "file").get("sha256")
    sb = _part(b, "file").get("sha256")
    if sa != sb:
        return f"dataset sha256 {_digest_prefix(sa)} vs {_digest_prefix(sb)}"
    for key in ("format", "seed", "output_tokens"):
        if a.get(key) != b.get(key):
            return f"{key} differs: {_value(a.get(key))} vs {_value(b.get(key))}"
    fa, fb = _part(a, "filter"), _part(b, "filter")
    for key in sorted(set(fa) | set(fb)):
        if fa.get(key) != fb.get(key):
            return f"filter differs: {key} {_value(fa.get(key))} vs {_value(fb.get(key))}"
    return None


def _digest_prefix(digest: object) -> str:
    """A sha256 as its first 12 hex digits, "none" for none."""
    return "none" if digest is None else str(digest)[:12]


def _value(v: object) -> str:
    return "none" if v is None else str(v)
