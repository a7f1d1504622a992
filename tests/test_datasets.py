"""Dataset workloads (servelab.workload.datasets): pinning the file (a path by its sha256, a hub file by
its commit, through huggingface_hub against a local stand-in for the hub), reading ShareGPT and
JSON-lines pairs, and the seeded, filtered sample. Token counts here are whitespace words."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fake_hf_dataset_hub import (
    COMMIT,
    JSONL,
    REPO_ID,
    SHAREGPT,
    FakeDatasetHub,
    fixture_files,
    recorded_paths_info,
)

from servelab import config
from servelab.client.prompt import Prompt
from servelab.errors import ServelabError
from servelab.experiment import DatasetFilter, DatasetSection, HubDataset
from servelab.store.jsonio import dumps
from servelab.workload.datasets import (
    REASONS,
    DatasetFile,
    HfDatasetHub,
    Pair,
    applied_filter,
    prompts_digest,
    read_pairs,
    resolve_dataset,
    same_dataset,
    sample_dataset,
)

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "datasets" / "sharegpt-sample.json"
TOKEN = "hf_servelabDATASETtoken0123456789"


def spec(
    *,
    output_tokens: int | None = None,
    fmt: str = "sharegpt",
    path: str | None = None,
    sha256: str | None = None,
    hub: HubDataset | None = None,
    **bounds: int | None,
) -> DatasetSection:
    flt: dict[str, Any] = {
        "min_input_tokens": 4,
        "max_input_tokens": None,
        "min_output_tokens": 4,
        "max_output_tokens": None,
        **bounds,
    }
    return DatasetSection(path, hub, sha256, fmt, DatasetFilter(**flt), output_tokens)


class Words:
    """A tokenizer that counts whitespace-separated words and remembers what it was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, text: str) -> int:
        self.asked.append(text)
        return len(text.split())


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def pairs_of(lengths: list[tuple[int, int]]) -> list[Pair]:
    """A ShareGPT-like pair per (prompt words, reply words), each prompt distinct."""
    return [
        Pair(words(a, f"p{k}_"), words(b, "r"), None, f"$[{k}]") for k, (a, b) in enumerate(lengths)
    ]


def write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def turn(who: str, value: object) -> dict[str, object]:
    return {"from": who, "value": value}


# --- reading --------------------------------------------------------------------------


def test_sharegpt_pairs_are_read_as_vllm_bench_reads_them(tmp_path: Path) -> None:
    data = [
        {"id": "a", "conversations": [turn("human", "first prompt"), turn("gpt", "its reply")]},
        {"id": "b", "conversations": [turn("human", "only a question")]},  # no reply: skipped
        {"id": "c"},  # no conversations: skipped
        {
            "id": "d",
            "conversations": [
                turn("human", "second prompt"),
                turn("gpt", "second reply"),
                turn("human", "a later turn, not read"),
                turn("gpt", "not read either"),
            ],
        },
        {"id": "e", "conversations": [turn("gpt", "starts with the model"), turn("human", "ok")]},
        {"id": "f", "conversations": []},
    ]
    pairs = read_pairs(write(tmp_path / "d.json", data), "sharegpt")
    assert pairs == [
        Pair("first prompt", "its reply", None, "$[0]"),
        Pair("second prompt", "second reply", None, "$[3]"),
        Pair("starts with the model", "ok", None, "$[4]"),  # roles are not looked at
    ]


@pytest.mark.parametrize(
    "content,where,what",
    [
        (b"[{", "$", "not valid JSON"),
        (b'{"conversations": []}\n{"conversations": []}\n', "$", "format jsonl"),
        (b'{"conversations": []}', "$", "a JSON dict, not the list of conversations"),
        (b'["text"]', "$[0]", "a str, not an object"),
        (b'[{"conversations": "hi"}]', "$[0].conversations", "not a list of turns"),
        (
            b'[{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt"}]}]',
            "$[0].conversations[1]",
            "not a turn",
        ),
        (b'[{"conversations": [{"value": 3}, {"value": "r"}]}]', "$[0].conversations[0]", "turn"),
        (b'[{"conversations": [{"value": "q"}]}]', "$", "no conversation of two turns or more"),
        (b"\xff\xfe[]", "$", "not UTF-8"),
    ],
)
def test_malformed_sharegpt_is_one_line_naming_file_and_place(
    tmp_path: Path, content: bytes, where: str, what: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ServelabError) as err:
        read_pairs(path, "sharegpt")
    msg = str(err.value)
    assert msg.startswith(f"{path}: {where}: ") and what in msg and "\n" not in msg


def test_jsonl_pairs(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"prompt": "one two three four", "output_tokens": 8, "id": 1}\n'
        "\n"
        '{"prompt": "no output length given"}\n'
        '{"prompt": "null is not given either", "output_tokens": null}\n',
        encoding="utf-8",
    )
    assert read_pairs(path, "jsonl") == [
        Pair("one two three four", None, 8, "line 1"),
        Pair("no output length given", None, None, "line 3"),
        Pair("null is not given either", None, None, "line 4"),
    ]


@pytest.mark.parametrize(
    "line,what",
    [
        ("[1, 2]", "not a JSON object"),
        ("{oops", "not valid JSON"),
        ('{"text": "no prompt key"}', "prompt: missing or not a string"),
        ('{"prompt": 5}', "prompt: missing or not a string"),
        ('{"prompt": "p", "output_tokens": 0}', "output_tokens: 0 is not an integer >= 1"),
        ('{"prompt": "p", "output_tokens": "5"}', "output_tokens: '5' is not an integer"),
        ('{"prompt": "p", "output_tokens": true}', "output_tokens: True is not an integer"),
    ],
)
def test_malformed_jsonl_names_the_line(tmp_path: Path, line: str, what: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "fine", "output_tokens": 3}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ServelabError) as err:
        read_pairs(path, "jsonl")
    msg = str(err.value)
    assert msg.startswith(f"{path}: line 3: ") and what in msg and "\n" not in msg


def test_empty_jsonl_and_unknown_format_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ServelabError, match=r"empty.jsonl: \$: no line to sample"):
        read_pairs(path, "jsonl")
    with pytest.raises(ServelabError, match="workload.dataset.format: 'csv'"):
        read_pairs(path, "csv")
    with pytest.raises(ServelabError, match="missing.json: file not found"):
        read_pairs(tmp_path / "missing.json", "sharegpt")


# --- sampling -------------------------------------------------------------------------


def test_same_seed_same_sample_other_seed_other_order() -> None:
    pairs = pairs_of([(5 + k, 6 + k % 7) for k in range(40)])
    a = sample_dataset(pairs, 20, seed=3, spec=spec(), model_len=None, count_tokens=Words())
    b = sample_dataset(pairs, 20, seed=3, spec=spec(), model_len=None, count_tokens=Words())
    assert a == b and dumps(a.record) == dumps(b.record)
    c = sample_dataset(pairs, 20, seed=4, spec=spec(), model_len=None, count_tokens=Words())
    assert [p.text for p in c.prompts] != [p.text for p in a.prompts]
    assert c.record["prompts_sha256"] != a.record["prompts_sha256"]
    assert c.record["seed"] == 4 and a.record["seed"] == 3
    # a smaller count samples the first prompts of a larger one
    small = sample_dataset(pairs, 5, seed=3, spec=spec(), model_len=None, count_tokens=Words())
    assert small.prompts == a.prompts[:5]
    # each prompt carries its lengths, as counted
    for p in a.prompts:
        assert p.input_tokens == len(p.text.split())
        i = next(k for k, q in enumerate(pairs) if q.prompt == p.text)
        assert p.max_tokens == len(pairs[i].reply.split())  # type: ignore[union-attr]


def test_each_bound_rejects_what_it_should_and_is_counted() -> None:
    lengths = (
        [(2, 10)] * 3  # input below 4
        + [(50, 10)] * 4  # input above 40
        + [(10, 1)] * 5  # output below 4
        + [(10, 90)] * 6  # output above 60
        + [(40, 60)] * 2  # 100 tokens: over max-model-len 90
        + [(10, 10)] * 7  # kept
    )
    pairs = pairs_of(lengths)
    s = spec(max_input_tokens=40, max_output_tokens=60)
    tok = Words()
    got = sample_dataset(pairs, 100, seed=0, spec=s, model_len=90, count_tokens=tok)
    rec = got.record
    assert rec["rejected"] == {
        "input_below_min": 3,
        "input_above_max": 4,
        "output_below_min": 5,
        "output_above_max": 6,
        "over_model_len": 2,
    }
    assert list(rec["rejected"]) == list(REASONS)
    assert rec["walked"] == rec["pairs"] == len(pairs) and rec["distinct"] == 7
    assert rec["filter"] == {
        "min_input_tokens": 4,
        "max_input_tokens": 40,
        "min_output_tokens": 4,
        "max_output_tokens": 60,
        "max_model_len": 90,
    }
    assert {(p.input_tokens, p.max_tokens) for p in got.prompts} == {(10, 10)}
    # a reply is counted only for a prompt that passed the input bounds
    replies_asked = [t for t in tok.asked if t.startswith("r0")]
    assert len(replies_asked) == len(pairs) - 3 - 4


def test_the_walk_counts_only_the_candidates_it_needs() -> None:
    pairs = pairs_of([(8, 8)] * 50)
    tok = Words()
    got = sample_dataset(pairs, 3, seed=1, spec=spec(), model_len=None, count_tokens=tok)
    assert len(tok.asked) == 6  # three prompts and their three replies
    assert got.record["walked"] == 3 and got.record["passes"] == 1
    assert got.record["indices"] is not None and len(got.record["indices"]) == 3


def test_fixed_output_tokens_counts_no_reply_and_skips_the_output_bounds() -> None:
    pairs = pairs_of([(10, 1), (10, 500), (12, 9)])
    tok = Words()
    s = spec(output_tokens=2, max_output_tokens=50)
    got = sample_dataset(pairs, 3, seed=0, spec=s, model_len=None, count_tokens=tok)
    assert all(t.startswith("p") for t in tok.asked)  # no reply counted
    assert [p.max_tokens for p in got.prompts] == [2, 2, 2]
    assert got.record["output_tokens"] == 2 and got.record["distinct"] == 3
    assert got.record["filter"]["min_output_tokens"] is None
    assert got.record["filter"]["max_output_tokens"] is None
    assert applied_filter(s, 64)["max_model_len"] == 64
    # max-model-len still bounds input + the fixed output
    short = sample_dataset(pairs, 3, seed=0, spec=s, model_len=13, count_tokens=Words())
    assert short.record["rejected"]["over_model_len"] == 1 and short.record["distinct"] == 2


def test_too_few_eligible_pairs_go_round_again_in_the_same_order() -> None:
    pairs = pairs_of([(10, 10), (1, 10), (11, 10), (2, 2), (12, 10)])
    got = sample_dataset(pairs, 7, seed=5, spec=spec(), model_len=None, count_tokens=Words())
    rec = got.record
    assert rec["distinct"] == 3 and rec["passes"] == 3 and rec["count"] == 7
    texts = [p.text for p in got.prompts]
    assert len(texts) == 7 and len(set(texts)) == 3
    assert texts[3:6] == texts[:3] and texts[6] == texts[0]
    assert sorted(rec["indices"]) == [0, 2, 4]
    assert [pairs[i].prompt for i in rec["indices"]] == texts[:3]


def test_no_eligible_pair_is_one_line_naming_the_filter() -> None:
    pairs = pairs_of([(2, 10), (3, 10), (50, 10)])
    with pytest.raises(ServelabError) as err:
        sample_dataset(
            pairs, 4, seed=0, spec=spec(max_input_tokens=40), model_len=512, count_tokens=Words()
        )
    msg = str(err.value)
    assert msg.startswith("workload.dataset: none of the dataset's 3 prompts passes the filter")
    assert "min_input_tokens 4, max_input_tokens 40" in msg and "max-model-len 512" in msg
    assert "input_below_min 2, input_above_max 1" in msg and "widen workload.dataset.filter" in msg
    assert "\n" not in msg


def test_jsonl_output_lengths_come_from_the_line_or_the_config() -> None:
    pairs = [
        Pair(words(6), None, 12, "line 1"),
        Pair(words(7), None, None, "line 2"),
        Pair(words(8), None, 3, "line 3"),
    ]
    with pytest.raises(ServelabError) as err:
        sample_dataset(
            pairs, 2, seed=0, spec=spec(fmt="jsonl"), model_len=None, count_tokens=Words()
        )
    msg = str(err.value)
    assert "1 of 3 prompts give no output length (the first at line 2)" in msg
    assert "workload.dataset.output_tokens" in msg and "\n" not in msg
    got = sample_dataset(
        pairs[::2], 2, seed=0, spec=spec(fmt="jsonl"), model_len=None, count_tokens=Words()
    )
    assert [p.max_tokens for p in got.prompts] == [12, 12]  # one pair passes, sent twice
    assert got.record["distinct"] == 1 and got.record["passes"] == 2
    assert got.record["rejected"]["output_below_min"] == 1
    s = spec(fmt="jsonl", output_tokens=5)
    fixed = sample_dataset(pairs, 3, seed=0, spec=s, model_len=None, count_tokens=Words())
    assert {p.max_tokens for p in fixed.prompts} == {5} and fixed.record["distinct"] == 3


def test_the_record_is_json_and_describes_the_sample() -> None:
    pairs = pairs_of([(4 + k % 30, 4 + k % 17) for k in range(200)])
    got = sample_dataset(pairs, 100, seed=9, spec=spec(), model_len=2048, count_tokens=Words())
    rec = json.loads(dumps(got.record))
    assert rec["format_version"] == 1 and rec["format"] == "sharegpt"
    assert rec["pairs"] == 200 and rec["count"] == 100 and rec["distinct"] == 100
    assert rec["indices"] is None  # over 64 distinct pairs: only their digest
    assert len(rec["indices_sha256"]) == 64
    ins = [p.input_tokens or 0 for p in got.prompts]
    assert rec["lengths"]["input_tokens"]["min"] == min(ins)
    assert rec["lengths"]["input_tokens"]["max"] == max(ins)
    assert rec["lengths"]["input_tokens"]["p50"] == sorted(ins)[49]
    assert rec["lengths"]["input_tokens"]["mean"] == pytest.approx(sum(ins) / 100)
    assert rec["prompts_sha256"] == prompts_digest(got.prompts)
    # the digest covers the lengths asked, not only the texts
    first = got.prompts[0]
    changed = (Prompt(first.text, (first.max_tokens or 0) + 1, first.input_tokens),)
    assert prompts_digest(changed + got.prompts[1:]) != rec["prompts_sha256"]


# --- comparing records ----------------------------------------------------------------


def test_same_dataset_names_the_first_difference() -> None:
    pairs = pairs_of([(8, 8)] * 10)
    rec = sample_dataset(pairs, 4, seed=1, spec=spec(), model_len=1024, count_tokens=Words())
    file = DatasetFile("path", Path("d.json"), "a" * 64, 10).to_json()
    a = {"file": file, **rec.record}
    assert same_dataset(a, json.loads(dumps(a))) is None
    assert same_dataset(a, {**a, "count": 40, "prompts_sha256": "x"}) is None
    hub_file = DatasetFile("hub", Path("/cache/x"), "a" * 64, 10, "o/n", "d.json", "c" * 40)
    assert same_dataset(a, {**a, "file": hub_file.to_json()}) is None
    assert same_dataset(a, {**a, "file": {**file, "sha256": "b" * 64}}) == (
        "dataset sha256 aaaaaaaaaaaa vs bbbbbbbbbbbb"
    )
    assert same_dataset(a, {**a, "seed": 2}) == "seed differs: 1 vs 2"
    assert same_dataset(a, {**a, "output_tokens": 64}) == "output_tokens differs: none vs 64"
    other = {**a, "filter": {**a["filter"], "max_model_len": 2048}}
    assert same_dataset(a, other) == "filter differs: max_model_len 1024 vs 2048"
    assert same_dataset(a, {**a, "format": "jsonl"}) == "format differs: sharegpt vs jsonl"


# --- the file: a path -----------------------------------------------------------------


def test_a_path_is_pinned_by_its_sha256(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    body = b'[{"conversations": [{"value": "a b c d"}, {"value": "e f g h"}]}]\n'
    (tmp_path / "data" / "d.json").write_bytes(body)
    digest = hashlib.sha256(body).hexdigest()
    found = resolve_dataset(spec(path="data/d.json", sha256=digest))
    assert found.to_json() == {
        "source": "path",
        "path": "data/d.json",
        "sha256": digest,
        "bytes": len(body),
    }
    assert read_pairs(found.path, "sharegpt") == [Pair("a b c d", "e f g h", None, "$[0]")]
    pinned = "0" * 64
    with pytest.raises(ServelabError) as err:
        resolve_dataset(spec(path="data/d.json", sha256=pinned))
    assert str(err.value) == (
        f"workload.dataset.path data/d.json: sha256 is {digest}, the config pins {pinned}; "
        f"restore the pinned file, or pin this one (workload.dataset.sha256: {digest})"
    )
    with pytest.raises(ServelabError) as err:
        resolve_dataset(spec(path="data/d.json"))
    assert str(err.value) == (
        f"workload.dataset.sha256: required with path: pin data/d.json with sha256: {digest}"
    )
    with pytest.raises(ServelabError) as err:
        resolve_dataset(spec(path="data/gone.json", sha256=pinned))
    msg = str(err.value)
    assert msg.startswith("workload.dataset.path: data/gone.json: no such file")
    assert str(tmp_path) in msg and "\n" not in msg


def test_the_typed_config_resolves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """workload.dataset as config.validate gives it, with the schema's filter defaults."""
    monkeypatch.chdir(REPO)
    digest = hashlib.sha256(SAMPLE.read_bytes()).hexdigest()
    raw = {
        "experiment": "t",
        "model": {"source": "tiny"},
        "runtime": {"kind": "venv"},
        "server": {"configs": [{"name": "a"}]},
        "sweep": {"concurrency": [1]},
        "workload": {"dataset": {"path": "datasets/sharegpt-sample.json", "sha256": digest}},
    }
    ds = config.validate(raw).workload.dataset
    assert ds is not None and ds.format == "sharegpt" and ds.output_tokens is None
    assert applied_filter(ds, None) == {
        "min_input_tokens": 4,
        "max_input_tokens": None,
        "min_output_tokens": 4,
        "max_output_tokens": None,
        "max_model_len": None,
    }
    found = resolve_dataset(ds)
    assert found.sha256 == digest and found.to_json()["path"] == "datasets/sharegpt-sample.json"


# --- the file: on the hub -------------------------------------------------------------


def hub_spec(filename: str = SHAREGPT, **over: Any) -> DatasetSection:
    revision = over.pop("revision", COMMIT)
    return spec(hub=HubDataset(REPO_ID, filename, revision), **over)


def lfs_sha256(path: str) -> str:
    entry = next(e for e in recorded_paths_info() if e["path"] == path)
    return str(entry["lfs"]["oid"])


def token_leaks(root: Path, *records: object) -> list[str]:
    found = [str(p) for p in root.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]
    return found + [dumps(r) for r in records if TOKEN in dumps(r)]


def test_hub_download_is_verified_and_the_record_is_host_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with FakeDatasetHub() as hub:
        found = resolve_dataset(
            hub_spec(), cache_dir=tmp_path / "cache", hub=HfDatasetHub.from_env(hub.url)
        )
        plain = resolve_dataset(
            hub_spec(JSONL), cache_dir=tmp_path / "cache", hub=HfDatasetHub.from_env(hub.url)
        )
    body = fixture_files()[SHAREGPT]
    assert found.sha256 == hashlib.sha256(body).hexdigest() == lfs_sha256(SHAREGPT)
    assert found.path.is_file() and (tmp_path / "cache" / "datasets") in found.path.parents
    assert found.to_json() == {
        "source": "hub",
        "repo_id": REPO_ID,
        "filename": SHAREGPT,
        "revision": COMMIT,
        "sha256": found.sha256,
        "bytes": len(body),
    }
    assert str(tmp_path) not in dumps(found.to_json())
    assert any(p.endswith(f"/paths-info/{COMMIT}") for p in hub.paths)  # asked for its hashes
    assert plain.sha256 == hashlib.sha256(fixture_files()[JSONL]).hexdigest()
    pairs = read_pairs(found.path, "sharegpt")
    assert [p.where for p in pairs] == ["$[0]", "$[1]", "$[3]"]
    sampled = sample_dataset(
        pairs, 3, seed=0, spec=hub_spec(), model_len=None, count_tokens=Words()
    )
    # the token went to the hub, from HF_TOKEN, and nowhere else
    assert hub.auth and set(hub.auth) == {f"Bearer {TOKEN}"}
    assert token_leaks(tmp_path, found.to_json(), plain.to_json(), sampled.record) == []


def test_a_pinned_hub_file_in_the_cache_needs_no_hub(tmp_path: Path) -> None:
    pinned = hub_spec(sha256=lfs_sha256(SHAREGPT))
    with FakeDatasetHub() as hub:
        first = resolve_dataset(pinned, cache_dir=tmp_path, hub=HfDatasetHub(None, hub.url))
    assert hub.paths and set(hub.auth) == {None}
    with FakeDatasetHub() as hub:  # a hub that is asked nothing
        again = resolve_dataset(pinned, cache_dir=tmp_path, hub=HfDatasetHub(None, hub.url))
    assert hub.paths == [] and again == first


def test_token_only_from_hf_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token file from `hf auth login` is not used: HF_TOKEN or no token."""
    home = tmp_path / "hf-home"
    home.mkdir()
    (home / "token").write_text("hf_fromTHEtokenFILE000000000")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with FakeDatasetHub() as hub:
        resolve_dataset(hub_spec(), cache_dir=tmp_path / "c", hub=HfDatasetHub.from_env(hub.url))
    assert hub.auth and set(hub.auth) == {None}


@pytest.mark.parametrize(
    "path,what",
    [
        (SHAREGPT, "the download's sha256 .* differs from the hub's LFS sha256"),
        (JSONL, "the download's git blob sha1 .* differs from the hub's"),
    ],
)
def test_a_tampered_download_is_refused(tmp_path: Path, path: str, what: str) -> None:
    files = fixture_files()
    files[path] = files[path].replace(b"e", b"E")  # same size, other content
    with FakeDatasetHub(files) as hub, pytest.raises(ServelabError) as err:
        resolve_dataset(hub_spec(path), cache_dir=tmp_path, hub=HfDatasetHub(None, hub.url))
    msg = str(err.value)
    assert msg.startswith(f"workload.dataset.hub: {REPO_ID}/{path}@{COMMIT}: ")
    assert re.search(what, msg) and "delete" in msg and "\n" not in msg


def test_a_hub_file_other_than_the_pin_is_refused(tmp_path: Path) -> None:
    pinned = "1" * 64
    with FakeDatasetHub() as hub, pytest.raises(ServelabError) as err:
        resolve_dataset(
            hub_spec(sha256=pinned), cache_dir=tmp_path, hub=HfDatasetHub(None, hub.url)
        )
    assert str(err.value) == (
        f"workload.dataset.sha256: {REPO_ID}/{SHAREGPT}@{COMMIT} is sha256 "
        f"{lfs_sha256(SHAREGPT)} on the hub, the config pins {pinned}; pin this file's digest "
        "or name the file the pin is for"
    )


class NoHub:
    def file_info(self, *a: object) -> Any:
        raise AssertionError("the hub was asked")

    def download(self, *a: object) -> Any:
        raise AssertionError("the hub was asked")


@pytest.mark.parametrize("revision", ["main", "v1.0", COMMIT[:12], COMMIT.upper()])
def test_a_branch_or_tag_as_revision_is_refused(revision: str) -> None:
    with pytest.raises(ServelabError) as err:
        resolve_dataset(hub_spec(revision=revision), hub=NoHub())
    msg = str(err.value)
    assert msg.startswith(f"workload.dataset.hub.revision: {revision!r} is not a commit")
    assert "40-hex" in msg and "\n" not in msg


@pytest.mark.parametrize(
    "filename,revision,what",
    [
        (SHAREGPT, "f" * 40, "this commit is not in the repository"),
        ("absent.json", COMMIT, "no such file at this commit"),
    ],
)
def test_hub_failures_are_one_line(tmp_path: Path, filename: str, revision: str, what: str) -> None:
    with FakeDatasetHub() as hub, pytest.raises(ServelabError) as err:
        resolve_dataset(
            hub_spec(filename, revision=revision),
            cache_dir=tmp_path,
            hub=HfDatasetHub(None, hub.url),
        )
    msg = str(err.value)
    assert msg.startswith(f"workload.dataset.hub: {REPO_ID}/{filename}@{revision}: ")
    assert what in msg and "\n" not in msg


# --- the sample dataset ---------------------------------------------------------------


def load_script() -> ModuleType:
    script = REPO / "scripts" / "make_sharegpt_sample.py"
    mod_spec = importlib.util.spec_from_file_location("make_sharegpt_sample", script)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def test_the_script_remakes_the_committed_sample_byte_for_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main: Callable[[list[str]], int] = load_script().main
    out = tmp_path / "sample.json"
    assert main(["--out", str(out)]) == 0
    assert out.read_bytes() == SAMPLE.read_bytes()
    digest = hashlib.sha256(SAMPLE.read_bytes()).hexdigest()
    assert f"sha256 {digest}" in capsys.readouterr().out
    assert digest in (REPO / "datasets" / "README.md").read_text(encoding="utf-8")
    assert main(["--out", str(tmp_path / "other.json"), "--seed", "1"]) == 0
    assert (tmp_path / "other.json").read_bytes() != SAMPLE.read_bytes()


def test_the_sample_reads_and_gives_the_filters_work() -> None:
    data = json.loads(SAMPLE.read_text(encoding="utf-8"))
    pairs = read_pairs(SAMPLE, "sharegpt")
    assert 280 <= len(data) <= 320 and len(pairs) < len(data)  # some have no reply
    assert sum(len(e["conversations"]) > 2 for e in data) >= 30
    prompt_words = sorted(len(p.prompt.split()) for p in pairs)
    reply_words = sorted(len(p.reply.split()) for p in pairs)  # type: ignore[union-attr]
    assert sum(n < 4 for n in prompt_words) >= 3 and sum(n < 4 for n in reply_words) >= 1
    assert prompt_words[len(pairs) // 2] < 60 < prompt_words[-1] <= 400  # right-skewed
    assert reply_words[len(pairs) // 2] < 60 < reply_words[-1] <= 300
    s = spec(max_input_tokens=150)
    got = sample_dataset(pairs, 500, seed=0, spec=s, model_len=1024, count_tokens=Words())
    rec = got.record
    assert rec["rejected"]["input_below_min"] >= 3 and rec["rejected"]["input_above_max"] >= 10
    assert rec["passes"] == 2 and rec["distinct"] == len(pairs) - sum(rec["rejected"].values())
