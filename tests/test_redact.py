from __future__ import annotations

from servelab.redact import REDACTED, redact_argv, redact_env, redact_text


def test_env_secrets_by_name() -> None:
    env = redact_env(
        {
            "HF_TOKEN": "hf_abc",
            "MY_API_KEY": "k",
            "AWS_SECRET_ACCESS_KEY": "s",
            "DB_PASSWORD": "p",
            "VLLM_CPU_KVCACHE_SPACE": "1",
        }
    )
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert {k for k, v in env.items() if v == REDACTED} == {
        "HF_TOKEN",
        "MY_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
    }


def test_urls_and_bearer() -> None:
    s = redact_text("fetch https://user:hunter2@host/x with Authorization: Bearer abc.def")
    assert "hunter2" not in s and "abc.def" not in s and "https://user:" in s


def test_argv_flags() -> None:
    argv = redact_argv(["vllm", "--api-key", "sk-1", "--token=tok", "--max-num-seqs", "8"])
    assert argv == ["vllm", "--api-key", REDACTED, f"--token={REDACTED}", "--max-num-seqs", "8"]
