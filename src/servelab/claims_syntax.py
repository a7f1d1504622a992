"""The syntax of claims (checked when the config is validated, before anything runs)."""

from __future__ import annotations

import re

from servelab.errors import ServelabError

_SEL = r"\[([^\]]*)\]"
CMP = re.compile(rf"^\s*(\w+)\s*{_SEL}\s*(>|<)\s*(?:(\d+(?:\.\d+)?)\s*\*\s*)?(\w+)\s*{_SEL}\s*$")
FUNC = re.compile(r"^\s*(dominated|serialized|knee|past_knee)\s*\(([^)]*)\)\s*(?:==\s*(\d+))?\s*$")


def parse_claim(claim: str) -> None:
    """Syntax check only (config validation); raises ServelabError for a malformed claim."""
    if not (CMP.match(claim) or FUNC.match(claim)):
        raise ServelabError(
            f"{claim!r} is not a claim; write e.g. "
            "'throughput[c=128] > throughput[c=256]', 'dominated(c=256)', "
            "'serialized(config=NAME)' or 'knee(config=NAME) == 8'"
        )
