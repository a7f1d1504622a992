"""Materialize the model a server will load.

`tiny`: a small Qwen2-architecture model built deterministically from a seed (random weights,
a byte-level BPE tokenizer trained on built-in text, a chat template). Its revision is the
digest of its files, so the same settings always give the same bytes and the same revision.

`hf`: a Hugging Face repository at a pinned 40-hex commit, downloaded with
`huggingface_hub.snapshot_download(revision=<commit>)` into a folder shared by every experiment
that names the same repository and commit. Every file is checked against what the hub says it
is: the LFS sha256 for large files, the git blob sha1 for the others. The token comes from the
HF_TOKEN environment variable only and is never written anywhere.

The `model` stage builds a tiny model into the shared model cache, in a folder named by its
digest (`<cache>/models/tiny/<tree sha256, 16 hex>/`): every experiment, test and fresh clone
that serves the same model serves it from the same path, and vLLM's compile cache, which is
keyed by the model's path, hits across them (`build_tiny_shared`).

Both write the same record, servelab-model.json: source, path (the model folder; "." = the
record's own folder), revision, files (sha256 of every file) and tree_sha256 (one digest over
them).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Protocol

import numpy as np

from servelab.documents.declared import ModelJson
from servelab.env import endpoint
from servelab.errors import ServelabError
from servelab.experiment import ModelSection, RuntimeSection, TinySpec
from servelab.store.hashing import git_blob_sha1, sha256_file
from servelab.store.jsonio import write_json
from servelab.store.paths import default_cache_dir

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def head_dim(spec: TinySpec) -> int:
    return spec.hidden_size // spec.heads


def check_tiny(spec: TinySpec) -> TinySpec:
    """The tiny model's shape, refused when vLLM could not load it."""
    if spec.hidden_size % spec.heads:
        raise ServelabError(
            f"model.tiny: hidden_size {spec.hidden_size} is not divisible by heads {spec.heads}"
        )
    if spec.heads % spec.kv_heads:
        raise ServelabError(f"model.tiny: heads {spec.heads} must be a multiple of kv_heads")
    if head_dim(spec) not in (32, 64, 80, 96, 112, 128, 256):
        raise ServelabError(
            f"model.tiny: head_dim {head_dim(spec)} is not supported by "
            "vLLM's CPU attention; use hidden_size/heads = 64 (e.g. hidden_size 128, heads 2)"
        )
    return spec


def corpus_text() -> str:
    return resources.files("servelab").joinpath("data/corpus.txt").read_text(encoding="utf-8")


def build_tokenizer_json(vocab_size: int) -> str:
    """Train a byte-level BPE tokenizer on the built-in corpus; returns tokenizer.json text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = corpus_text().splitlines()
    tok.train_from_iterator(lines, trainer=trainer)
    return str(tok.to_str(pretty=False))


def _weights(spec: TinySpec, vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(spec.seed)
    h, i, hd = spec.hidden_size, spec.intermediate_size, head_dim(spec)
    q, kv = spec.heads * hd, spec.kv_heads * hd

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal(vocab, h)}
    for n in range(spec.layers):
        p = f"model.layers.{n}."
        w[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
        w[p + "self_attn.q_proj.weight"] = normal(q, h)
        w[p + "self_attn.q_proj.bias"] = np.zeros(q, dtype=np.float32)
        w[p + "self_attn.k_proj.weight"] = normal(kv, h)
        w[p + "self_attn.k_proj.bias"] = np.zeros(kv, dtype=np.float32)
        w[p + "self_attn.v_proj.weight"] = normal(kv, h)
        w[p + "self_attn.v_proj.bias"] = np.zeros(kv, dtype=np.float32)
        w[p + "self_attn.o_proj.weight"] = normal(h, q)
        w[p + "mlp.gate_proj.weight"] = normal(i, h)
        w[p + "mlp.up_proj.weight"] = normal(i, h)
        w[p + "mlp.down_proj.weight"] = normal(h, i)
    w["model.norm.weight"] = np.ones(h, dtype=np.float32)
    w["lm_head.weight"] = normal(vocab, h)
    return w


def _hf_config(spec: TinySpec, vocab: int, eos_id: int) -> dict[str, object]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": head_dim(spec),
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "max_window_layers": spec.layers,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "vocab_size": vocab,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
    }


RECORD = "servelab-model.json"


def file_digests(model_dir: Path) -> dict[str, str]:
    """sha256 of every file under model_dir, keyed by relative POSIX path, sorted."""
    out: dict[str, str] = {}
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(model_dir).as_posix()
        if rel == RECORD:
            continue
        out[rel] = sha256_file(path)
    return out


def tree_digest(digests: dict[str, str]) -> str:
    """One digest for a set of files: sha256 over 'sha256  path' lines, sorted by path."""
    lines = "".join(f"{h}  {p}\n" for p, h in sorted(digests.items()))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


ModelRecord = ModelJson


def build_tiny(spec: TinySpec, out_dir: Path) -> ModelJson:
    """Write the tiny model into out_dir and return its record (written as servelab-model.json)."""
    from safetensors.numpy import save_file

    check_tiny(spec)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok_json = build_tokenizer_json(spec.vocab_size)
    vocab = len(json.loads(tok_json)["model"]["vocab"])
    tok_data = json.loads(tok_json)
    eos_id = next(t["id"] for t in tok_data["added_tokens"] if t["content"] == "<|endoftext|>")
    (out_dir / "tokenizer.json").write_text(tok_json, encoding="utf-8")
    write_json(
        out_dir / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "model_max_length": spec.max_position_embeddings,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    write_json(out_dir / "config.json", _hf_config(spec, vocab, eos_id))
    write_json(
        out_dir / "generation_config.json",
        {"bos_token_id": eos_id, "eos_token_id": eos_id, "do_sample": False},
    )
    save_file(_weights(spec, vocab), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    digests = file_digests(out_dir)
    record: ModelJson = {
        "source": "tiny",
        "path": ".",
        "spec": dataclasses.asdict(spec),
        "vocab_size": vocab,
        "revision": tree_digest(digests),
        "tree_sha256": tree_digest(digests),
        "files": digests,
    }
    write_json(out_dir / RECORD, record)
    return record


def tiny_cache_root(cache_dir: Path | None) -> Path:
    """Where the model stage keeps tiny models: <cache>/models/tiny/."""
    return (cache_dir or default_cache_dir()) / "models" / "tiny"


def build_tiny_shared(spec: TinySpec, out_dir: Path, cache_dir: Path | None = None) -> ModelJson:
    """Build the tiny model into the shared model cache, in the folder its digest names
    (tiny_cache_root/<tree sha256 [:16]>), and write its record, whose `path` is that folder,
    into out_dir. The model is built afresh each time (about a second) and compared with a
    folder of that name already there, file by file: a folder whose files differ (changed by
    hand, or cut short) is replaced, never served."""
    root = tiny_cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        record = build_tiny(spec, staging)
        revision = record["revision"]
        if revision is None:  # build_tiny names the tree by its sha256
            raise ServelabError("model: the tiny model was built without a revision")
        folder = root / revision[:16]
        if folder.is_dir() and file_digests(folder) != record["files"]:
            shutil.rmtree(folder)
        if not folder.is_dir():
            try:
                staging.rename(folder)
            except OSError:  # another job put the same model there first: keep theirs
                if file_digests(folder) != record["files"]:
                    raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    record = {**record, "path": str(folder)}
    write_json(folder / RECORD, record)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / RECORD, record)
    return record


def model_dir(record_path: Path) -> Path:
    """The folder the server loads, from the model stage's record."""
    with open(record_path, encoding="utf-8") as fh:
        path = json.load(fh).get("path")
    if path in (None, "."):
        return record_path.parent
    return Path(path)


# --- source hf --------------------------------------------------------------------------


@dataclass(frozen=True)
class HubFile:
    """One file of a repository at a commit, as the hub lists it."""

    path: str
    size: int | None
    blob_id: str | None  # git blob sha1
    lfs_sha256: str | None  # for LFS files


class Hub(Protocol):
    def list_files(self, repo: str, revision: str) -> list[HubFile]: ...

    def download(
        self, repo: str, revision: str, local_dir: Path, allow_patterns: list[str] | None
    ) -> None: ...


class HfHub:
    """The Hugging Face hub through huggingface_hub. The token is HF_TOKEN's value or none
    (never the token file a `huggingface-cli login` leaves), and it is never logged."""

    def __init__(self, token: str | None = None, endpoint: str | None = None) -> None:
        self._token: str | bool = token or False
        self.endpoint = endpoint

    @staticmethod
    def from_env(endpoint: str | None = None) -> HfHub:
        return HfHub(os.environ.get("HF_TOKEN") or None, endpoint)

    def list_files(self, repo: str, revision: str) -> list[HubFile]:
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile

        api = HfApi(endpoint=self.endpoint, token=self._token)
        with _hub_errors(repo, revision):
            entries = list(api.list_repo_tree(repo, recursive=True, revision=revision))
        return [
            HubFile(
                path=e.path,
                size=e.size,
                blob_id=e.blob_id,
                lfs_sha256=e.lfs.sha256 if e.lfs is not None else None,
            )
            for e in entries
            if isinstance(e, RepoFile)
        ]

    def download(
        self, repo: str, revision: str, local_dir: Path, allow_patterns: list[str] | None
    ) -> None:
        from huggingface_hub import snapshot_download

        with _hub_errors(repo, revision):
            snapshot_download(
                repo,
                revision=revision,
                local_dir=str(local_dir),
                allow_patterns=allow_patterns,
                token=self._token,
                endpoint=self.endpoint,
            )


@dataclass(frozen=True)
class HubKeys:
    """Where a hub download is named in the config, for the one line a hub failure becomes:
    `where` leads the line, the keys name what to check, `missing` what was not found."""

    where: str  # e.g. "model: owner/name@commit"
    repo_key: str
    revision_key: str
    file_key: str | None = None
    missing: str = "the files are not on disk"
    kind: str = "repository"


@contextmanager
def hub_errors(keys: HubKeys) -> Iterator[None]:
    """Hub failures as one line: what failed and what to do (no token, no traceback)."""
    try:
        yield
    except ServelabError:
        raise
    except Exception as exc:
        from huggingface_hub import errors

        if isinstance(exc, errors.GatedRepoError):
            msg = "the repository is gated; accept its terms on the hub and set HF_TOKEN"
        elif isinstance(exc, errors.RepositoryNotFoundError):
            msg = f"{keys.kind} not found (or private: set HF_TOKEN); check {keys.repo_key}"
        elif isinstance(exc, errors.RevisionNotFoundError):
            msg = f"this commit is not in the repository; check {keys.revision_key}"
        elif isinstance(exc, errors.LocalEntryNotFoundError | errors.OfflineModeIsEnabled):
            msg = f"the hub cannot be reached (offline?) and {keys.missing}"
        elif keys.file_key is not None and isinstance(exc, errors.EntryNotFoundError):
            msg = f"no such file at this commit; check {keys.file_key}"
        else:
            first = str(exc).strip().splitlines()[:1] or [""]
            msg = f"{type(exc).__name__}: {first[0][:200]}"
        raise ServelabError(f"{keys.where}: {msg}") from None


def _hub_errors(repo: str, revision: str) -> AbstractContextManager[None]:
    return hub_errors(HubKeys(f"model: {repo}@{revision}", "model.repo", "model.revision"))


def select_files(files: Iterable[HubFile], allow_patterns: Sequence[str] | None) -> list[HubFile]:
    """The files allow_patterns selects, as huggingface_hub selects them (fnmatch; a pattern
    ending in / means everything under that folder)."""
    if not allow_patterns:
        return sorted(files, key=lambda f: f.path)
    pats = [p + "*" if p.endswith("/") else p for p in allow_patterns]
    return sorted(
        (f for f in files if any(fnmatch.fnmatch(f.path, p) for p in pats)), key=lambda f: f.path
    )


def default_model_dir(repo: str, revision: str, cache_dir: Path | None) -> Path:
    return (cache_dir or default_cache_dir()) / "models" / repo.replace("/", "--") / revision


def _local_files(folder: Path) -> set[str]:
    """Files under folder, without huggingface_hub's .cache/ and servelab's record."""
    out = set()
    for p in folder.rglob("*"):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and not rel.startswith(".cache/") and rel != RECORD:
            out.add(rel)
    return out


def verify_against_hub(
    folder: Path, expected: list[HubFile]
) -> tuple[dict[str, str], dict[str, int]]:
    """sha256 of every expected file, each checked against the hub's hashes. Raises on a
    missing file, a size, LFS sha256 or git blob sha1 that differs, or a file the hub does not
    list (vLLM would load it)."""
    fix = f"delete {folder} and run again"
    digests: dict[str, str] = {}
    checked = {"lfs_sha256": 0, "git_blob_sha1": 0}
    for f in expected:
        path = folder / f.path
        if not path.is_file():
            raise ServelabError(f"model: {path}: missing after the download; {fix}")
        size = path.stat().st_size
        if f.size is not None and size != f.size:
            raise ServelabError(f"model: {path}: {size} bytes, the hub lists {f.size}; {fix}")
        digest = sha256_file(path)
        if f.lfs_sha256 is not None:
            if digest != f.lfs_sha256:
                raise ServelabError(
                    f"model: {path}: sha256 {digest} differs from the hub's LFS sha256 "
                    f"{f.lfs_sha256}; {fix}"
                )
            checked["lfs_sha256"] += 1
        elif f.blob_id is not None:
            blob = git_blob_sha1(path)
            if blob != f.blob_id:
                raise ServelabError(
                    f"model: {path}: git blob sha1 {blob} differs from the hub's {f.blob_id}; {fix}"
                )
            checked["git_blob_sha1"] += 1
        digests[f.path] = digest
    extra = sorted(_local_files(folder) - set(digests))
    if extra:
        raise ServelabError(
            f"model: {folder} holds files that the pinned commit does not list (within "
            f"model.allow_patterns): {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}; "
            "empty the folder or choose another model.local_dir"
        )
    return dict(sorted(digests.items())), checked


def _reusable(folder: Path, repo: str, revision: str, patterns: list[str] | None) -> bool:
    """A folder an earlier run completed, with every file still as recorded (no hub needed)."""
    try:
        rec = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if (rec.get("repo"), rec.get("revision"), rec.get("allow_patterns")) != (
        repo,
        revision,
        patterns,
    ):
        return False
    files: dict[str, str] = rec.get("files", {})
    if set(files) != _local_files(folder):
        return False
    return all(sha256_file(folder / rel) == digest for rel, digest in files.items())


def build_hf(
    model: ModelSection,
    out_dir: Path,
    cache_dir: Path | None = None,
    hub: Hub | None = None,
    say: Callable[[str], None] = print,
) -> ModelJson:
    """Download (or reuse) the pinned commit and write its record into out_dir."""
    import fcntl

    repo, revision = model.repo, model.revision
    if repo is None or revision is None:  # config.validate refuses an hf model without them
        raise ServelabError("model.source hf needs model.repo and model.revision")
    patterns = list(model.allow_patterns) if model.allow_patterns else None
    folder = (
        Path(model.local_dir).expanduser()
        if model.local_dir
        else default_model_dir(repo, revision, cache_dir)
    ).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # one download per folder, also across jobs
        if _reusable(folder, repo, revision, patterns):
            record: ModelJson = json.loads((folder / RECORD).read_text(encoding="utf-8"))
            say(f"model: reusing {repo}@{revision[:12]} in {folder} (every file re-hashed)")
        else:
            hub = hub or HfHub.from_env()
            listed = hub.list_files(repo, revision)
            expected = select_files(listed, patterns)
            if not expected:
                raise ServelabError(
                    f"model.allow_patterns: {patterns} matches no file of {repo}@{revision}"
                )
            total = sum(f.size or 0 for f in expected)
            say(
                f"model: downloading {repo}@{revision[:12]} ({len(expected)} files, "
                f"{total / 1e9:.2f} GB) into {folder}"
            )
            hub.download(repo, revision, folder, patterns)
            digests, checked = verify_against_hub(folder, expected)
            record = {
                "source": "hf",
                "repo": repo,
                "revision": revision,
                "allow_patterns": patterns,
                "path": str(folder),
                "files": digests,
                "tree_sha256": tree_digest(digests),
                "bytes": sum((folder / rel).stat().st_size for rel in digests),
                "checked": checked,
            }
            write_json(folder / RECORD, record)
            say(
                f"model: {len(digests)} files verified ({checked['lfs_sha256']} by LFS sha256, "
                f"{checked['git_blob_sha1']} by git blob sha1)"
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / RECORD, record)
    return record.copy()


# --- source endpoint: the model a running server serves ----------------------------------

WORD = re.compile(r"[A-Za-z]{2,}")
MIN_WORDS = 50  # fewer word tokens than this: every token of the corpus instead


def word_ids(tokenize: Callable[[str], list[int]]) -> list[int]:
    """Token ids a synthetic prompt draws from, found with a tokenizer alone: every word of
    the built-in corpus that is one token with its leading space (" word", else "word"), as
    workload.vocab_ids picks whole words from a tokenizer.json; with fewer than MIN_WORDS,
    every token of the corpus."""
    ids: set[int] = set()
    for word in sorted(set(WORD.findall(corpus_text()))):
        for text in (" " + word, word):
            got = tokenize(text)
            if len(got) == 1:
                ids.add(int(got[0]))
                break
    if len(ids) >= MIN_WORDS:
        return sorted(ids)
    return sorted(set(tokenize(corpus_text())))


def build_endpoint_model(
    runtime: RuntimeSection, out_dir: Path, say: Callable[[str], None] = print
) -> ModelJson:
    """source endpoint: nothing is built or downloaded. The record says what the server at
    runtime.url serves as runtime.served_model (its /v1/models entry: id, root,
    max_model_len) and the token ids synthetic prompts draw from (`vocab_ids`, by the
    server's /tokenize: there is no tokenizer.json here); no revision and no files, since a
    model servelab did not load is not pinned."""
    if runtime.url is None or runtime.served_model is None:  # config.validate requires both
        raise ServelabError("model.source endpoint needs runtime.url and runtime.served_model")
    base, served = endpoint.parse_url(runtime.url).base, runtime.served_model
    entry = endpoint.served_entry(base, served, endpoint.list_models(base))
    vocab = word_ids(lambda text: endpoint.token_ids(base, served, text))
    record: ModelJson = {
        "source": "endpoint",  # endpoint.KIND
        "path": ".",
        "url": base,
        "served_model": served,
        "model": entry,
        "revision": None,
        "files": {},
        "tree_sha256": None,
        "vocab_ids": vocab,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / RECORD, record)
    say(
        f"model: {served} as served at {base} ({endpoint.NOT_LAUNCHED}: nothing built, nothing "
        f"pinned; root {entry.get('root')}, max_model_len {entry.get('max_model_len')}), "
        f"{len(vocab)} token ids for prompts"
    )
    return record


def build_model(
    model: ModelSection,
    out_dir: Path,
    cache_dir: Path | None = None,
    hub: Hub | None = None,
    say: Callable[[str], None] = print,
    runtime: RuntimeSection | None = None,
) -> ModelRecord:
    """Materialize the configured model (the `model` stage); the record goes into out_dir.
    source endpoint (runtime.kind endpoint, `runtime`) builds nothing: it records the model
    the server serves."""
    if model.source == "tiny":
        return build_tiny_shared(model.tiny, out_dir, cache_dir)
    if model.source == "hf":
        return build_hf(model, out_dir, cache_dir, hub, say)
    if model.source == endpoint.KIND and runtime is not None:
        return build_endpoint_model(runtime, out_dir, say)
    raise ServelabError(f"model.source: {model.source!r} is not supported")
