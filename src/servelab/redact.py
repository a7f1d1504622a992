"""Keep secrets out of everything servelab records (logs, provenance, bundles)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

REDACTED = "<redacted>"
_SECRET_NAME = re.compile(r"(TOKEN|_KEY|^KEY$|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.I)
_URL_PASSWORD = re.compile(
    r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]+):(?P<pw>[^@\s]+)@", re.I
)
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]+", re.I)
_FLAG_SECRET = re.compile(r"^--?(api-key|token|hf-token|password|secret)(=.*)?$", re.I)


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def redact_text(text: str) -> str:
    text = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", text)
    return _BEARER.sub(lambda m: f"{m.group(1)}{REDACTED}", text)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) else redact_text(v)) for k, v in sorted(env.items())}


def redact_argv(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        m = _FLAG_SECRET.match(arg)
        if m:
            if m.group(2):
                out.append(arg.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg))
    return out
