"""The workload's sections of the typed experiment (servelab.experiment): what is sent, its
lengths, a dataset, shared prefixes, multi-turn chat, the warm-up."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from fractions import Fraction
from typing import TypedDict

from servelab.errors import ServelabError


@dataclass(frozen=True)
class WarmupSection:
    requests: int
    concurrency: int


class LengthValuesJson(TypedDict):
    values: list[int]


class LengthRangeJson(TypedDict):
    min: int | None
    max: int | None


@dataclass(frozen=True)
class Lengths:
    """A length drawn per request (workload.input_tokens / output_tokens as a mapping): uniform
    over [min, max], or one of `values`, each equally likely. The config gives min and max, or
    values; the other keys are None."""

    ABSENT_AS_NONE: typing.ClassVar[tuple[str, ...]] = ("min", "max", "values")

    min: int | None
    max: int | None
    values: tuple[int, ...] | None

    @property
    def largest(self) -> int:
        if self.values is not None:
            return max(self.values)
        assert self.max is not None  # the schema requires min and max, or values
        return self.max

    def to_json(self) -> LengthValuesJson | LengthRangeJson:
        if self.values is not None:
            return {"values": list(self.values)}
        return {"min": self.min, "max": self.max}


@dataclass(frozen=True)
class HubDataset:
    """workload.dataset.hub: a file of a Hugging Face dataset repository at a pinned commit."""

    repo_id: str
    filename: str
    revision: str


@dataclass(frozen=True)
class DatasetFilter:
    """workload.dataset.filter: pairs outside these token lengths are not sampled (None: no
    bound); the server's max-model-len bounds input + output as well."""

    min_input_tokens: int
    max_input_tokens: int | None
    min_output_tokens: int
    max_output_tokens: int | None


@dataclass(frozen=True)
class DatasetSection:
    """workload.dataset: prompts (and output lengths) sampled from a dataset file, named by
    path (pinned by sha256) or on the hub (pinned by revision; its sha256 checked when given)."""

    ABSENT_AS_NONE: typing.ClassVar[tuple[str, ...]] = ("path", "hub", "sha256")

    path: str | None
    hub: HubDataset | None
    sha256: str | None
    format: str  # sharegpt | jsonl
    filter: DatasetFilter
    output_tokens: int | None  # every request's output length; None: the dataset's own


@dataclass(frozen=True)
class TraceSection:
    """workload.trace: a timed request trace replayed (servelab.workload.trace), pinned as a
    dataset is; its window `start_s` + `duration_s` (None: to the trace's end), or the busiest
    `busiest` seconds; fitted to the server by `length_scale` (input, output and block_tokens
    together), `max_output_tokens` and `over_limit` (drop or truncate what still exceeds
    max-model-len), keeping at least `min_kept` of the window's requests."""

    ABSENT_AS_NONE: typing.ClassVar[tuple[str, ...]] = (
        "path",
        "hub",
        "sha256",
        "duration_s",
        "busiest",
        "max_output_tokens",
    )

    path: str | None
    hub: HubDataset | None
    sha256: str | None
    block_tokens: int
    start_s: float
    duration_s: float | None
    busiest: float | None = None
    length_scale: float = 1.0
    max_output_tokens: int | None = None
    over_limit: str = "drop"  # drop | truncate
    min_kept: float = 0.95
    # the file's format, servelab.workload.trace_formats: auto (told from its content) |
    # mooncake | azure | burstgpt
    format: str = "auto"


@dataclass(frozen=True)
class SharedPrefixSection:
    """workload.shared_prefix: `prefixes` system prompts of `prefix_tokens` tokens; request i
    starts with prefix i mod prefixes, then its own prompt."""

    prefixes: int
    prefix_tokens: int


@dataclass(frozen=True)
class ChatSection:
    """workload.chat: conversations of `turns` turns over the chat completions endpoint, the
    history re-sent each turn, `think_time_s` between a reply's end and the next turn."""

    turns: int
    think_time_s: float


@dataclass(frozen=True)
class WorkloadSection:
    ABSENT_AS_NONE: typing.ClassVar[tuple[str, ...]] = (
        "dataset",
        "trace",
        "shared_prefix",
        "chat",
        "input_tokens",
        "output_tokens",
    )

    seed: int
    # None with a dataset (it gives the lengths): the resolved config leaves both out
    input_tokens: int | Lengths | None
    output_tokens: int | Lengths | None
    ignore_eos: bool
    waves: int
    unique_prompts: bool
    request_timeout_s: float
    client_workers: int
    # ask the server for each request's generated token ids (requests.jsonl.gz output_ids)
    record_output_ids: bool
    warmup: WarmupSection
    dataset: DatasetSection | None
    shared_prefix: SharedPrefixSection | None
    chat: ChatSection | None
    trace: TraceSection | None = None

    @property
    def fixed_lengths(self) -> bool:
        """Every request asks the same exact input and output length (the synthetic default:
        no distribution, no dataset, no shared prefix, no chat)."""
        return (
            isinstance(self.input_tokens, int)
            and isinstance(self.output_tokens, int)
            and self.dataset is None
            and self.trace is None
            and self.shared_prefix is None
            and self.chat is None
        )


# --- a trace's length scale -------------------------------------------------------------


def scale_fraction(scale: float) -> Fraction:
    """A length scale as the exact fraction it names (0.03125 -> 1/32), for whole-token
    arithmetic."""
    return Fraction(scale).limit_denominator(1_000_000)


def scaled_block_tokens(block_tokens: int, scale: float) -> int:
    """The replayed block size: block_tokens x length_scale, which must be a whole number of
    tokens (at least 1) so that every block stays one block; else a one-line error."""
    n = Fraction(block_tokens) * scale_fraction(scale)
    if n.denominator != 1 or n < 1:
        raise ServelabError(
            f"workload.trace.length_scale: {scale:g} x block_tokens {block_tokens} = {float(n):g} "
            "is not a whole number of tokens; choose a scale that keeps blocks whole "
            f"(e.g. 1/{_whole_divisor(block_tokens, scale)} = "
            f"{1 / _whole_divisor(block_tokens, scale):g})"
        )
    return int(n)


def block_divisors(block_tokens: int) -> list[int]:
    """The divisors of block_tokens, smallest first: each d gives a length scale 1/d that keeps
    every block whole (workload.trace.length_scale), the largest scale first."""
    return [d for d in range(1, block_tokens + 1) if block_tokens % d == 0]


def _whole_divisor(block_tokens: int, scale: float) -> int:
    """The divisor d of block_tokens nearest 1/scale at or above it (a scale of 1/d keeps
    blocks whole and scales no less)."""
    want = 1 / scale if scale > 0 else block_tokens
    fits = [d for d in block_divisors(block_tokens) if d >= want]
    return fits[0] if fits else block_tokens
