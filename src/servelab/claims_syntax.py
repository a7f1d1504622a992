"""The syntax of claims (checked when the config is validated, before anything runs)."""

from __future__ import annotations

import re

from servelab.errors import ServelabError

_SEL = r"\[([^\]]*)\]"
_NUM = r"(\d+(?:\.\d+)?)"
CMP = re.compile(rf"^\s*(\w+)\s*{_SEL}\s*(>|<)\s*(?:(\d+(?:\.\d+)?)\s*\*\s*)?(\w+)\s*{_SEL}\s*$")
# a metric at one point against a number, e.g. p99_ttft_ms[config=a,rate=4] < 500
BOUND = re.compile(rf"^\s*(\w+)\s*{_SEL}\s*(>|<)\s*(\d+(?:\.\d+)?)\s*$")
# the SLO capacity search's answer against a rate, e.g. slo_capacity(config=a) > 2.5
CAPACITY = re.compile(rf"^\s*slo_capacity\s*\(([^)]*)\)\s*(>|<)\s*{_NUM}\s*$")
FUNC = re.compile(
    rf"^\s*(dominated|serialized|knee|past_knee)\s*\(([^)]*)\)\s*(?:==\s*{_NUM})?\s*$"
)


def parse_claim(claim: str) -> None:
    """Syntax check only (config validation); raises ServelabError for a malformed claim."""
    if not (CMP.match(claim) or BOUND.match(claim) or FUNC.match(claim) or CAPACITY.match(claim)):
        raise ServelabError(
            f"{claim!r} is not a claim; write e.g. "
            "'throughput[c=128] > throughput[c=256]', 'p99_ttft_ms[c=8] < 500', "
            "'dominated(c=256)', 'slo_capacity(config=NAME) > 2.5', "
            "'serialized(config=NAME)' or 'knee(config=NAME) == 8' (a sweep over request "
            "rates: rate=R in place of c=N, e.g. 'p99_ttft_ms[rate=4] < 500'"
        )
