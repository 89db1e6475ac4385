"""API keys: read from file or env, sent as Bearer, never printed (stdout, stderr, JSON, errors, reprs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sse_server import Scenario, SSEServer, running

from tui.base.secrets import (
    SecretError,
    read_api_key,
    read_llama_key_file,
    redact,
)
from tui.model.targets import EngineTarget
from tui.probe.client import ProbeClient

KEY = "sk-test-5f3a9c1e77d04b2a"
ROOT = Path(__file__).resolve().parents[1]


def test_key_file_first_real_line_stripped(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text(f"# comment\n\n   {KEY}  \r\nsecond\n")
    assert read_api_key(path) == KEY
    assert read_api_key(str(path)) == KEY


def test_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINETOP_TEST_KEY", f" {KEY}\n")
    assert read_api_key(env_var="ENGINETOP_TEST_KEY") == KEY
    assert read_api_key() is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("", "has no key"),
        ("# only a comment\n\n", "has no key"),
        ("sk key with spaces\n", "spaces or non-ASCII"),
        ("sk-ключ\n", "spaces or non-ASCII"),
    ],
)
def test_key_file_errors_are_readable_and_silent(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "key"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SecretError) as err:
        read_api_key(path)
    assert message in str(err.value) and str(path) in str(err.value)
    if content and not content.startswith("#"):
        assert content.strip() not in str(err.value) and "sk-" not in str(err.value)


def test_key_file_directory_and_not_utf8(tmp_path: Path) -> None:
    with pytest.raises(SecretError, match="is a directory"):
        read_api_key(tmp_path)
    bad = tmp_path / "bin"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SecretError, match="not UTF-8"):
        read_api_key(bad)


def test_env_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGINETOP_NO_SUCH_VAR", raising=False)
    with pytest.raises(SecretError, match="ENGINETOP_NO_SUCH_VAR is not set"):
        read_api_key(env_var="ENGINETOP_NO_SUCH_VAR")
    monkeypatch.setenv("ENGINETOP_EMPTY_VAR", "  ")
    with pytest.raises(SecretError, match="ENGINETOP_EMPTY_VAR is empty"):
        read_api_key(env_var="ENGINETOP_EMPTY_VAR")
    with pytest.raises(SecretError, match="not both"):
        read_api_key("/x", "Y")


def test_redact() -> None:
    assert redact(f"bad key Bearer {KEY}!", KEY) == "bad key Bearer ***!"
    assert redact("nothing here", KEY) == "nothing here"
    assert redact("text", None) == "text" and redact("text", "") == "text"


@pytest.fixture(scope="module")
def keyed() -> Iterator[SSEServer]:
    with running({"keyed": Scenario(require_key=KEY)}) as server:
        yield server


async def test_key_is_sent_as_bearer_and_never_in_results(keyed: SSEServer) -> None:
    good = EngineTarget(name="k", url=keyed.url_for("keyed"), api_key=KEY)
    wrong = EngineTarget(name="k", url=keyed.url_for("keyed"), api_key=KEY[::-1])
    async with ProbeClient() as client:
        ok = await client.chat(good, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        bad = await client.chat(wrong, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert ok.ok, ok.error
    assert keyed.requests[-2].headers["authorization"] == f"Bearer {KEY}"
    # The server echoes the wrong key it got; the client must not pass it on.
    assert not bad.ok and bad.status == 401
    assert bad.error == "HTTP 401: Invalid API key: Bearer ***"
    for r in (ok, bad):
        for text in (repr(r), json.dumps(r.to_json()), str(r.error)):
            assert KEY not in text and KEY[::-1] not in text
    assert KEY not in repr(good)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tui", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("how", ["file", "env"])
def test_cli_sends_key_and_prints_it_nowhere(keyed: SSEServer, tmp_path: Path, how: str) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    source = ["--api-key-file", str(key_file)] if how == "file" else ["--api-key-env", "ENGINETOP_TEST_KEY"]
    before = len(keyed.requests)
    for fmt in (["--json"], []):
        proc = _cli("probe", "--engine", keyed.url_for("keyed"), "--repeat", "2", "--max-tokens", "4",
                    *source, *fmt, env={"ENGINETOP_TEST_KEY": KEY})
        assert proc.returncode == 0, proc.stderr
        assert KEY not in proc.stdout and KEY not in proc.stderr
    sent = list(keyed.requests)[before:]
    # per run: the GET asking whether it is Ollama, then two probes; the key goes to this engine alone
    assert len(sent) == 6 and all(req.headers["authorization"] == f"Bearer {KEY}" for req in sent)


def test_cli_wrong_key_fails_without_echoing_it(keyed: SSEServer, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-wrong-0123456789\n")
    proc = _cli("probe", "--engine", keyed.url_for("keyed"), "--repeat", "1", "--api-key-file", str(key_file),
                "--json")
    assert proc.returncode == 1
    assert "sk-wrong-0123456789" not in proc.stdout + proc.stderr
    assert "HTTP 401: Invalid API key: Bearer ***" in proc.stderr


def test_cli_missing_key_file_is_bad_input(tmp_path: Path) -> None:
    proc = _cli("probe", "--engine", "http://127.0.0.1:9", "--api-key-file", str(tmp_path / "nope"), "--json")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"enginetop probe: API key file {tmp_path / 'nope'} does not exist"
    assert proc.stdout == ""


def test_llama_key_file_read_as_llama_server_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_bytes(b"# comment\n\nsk-one\nsk-two\n")
    assert read_llama_key_file(path) == ["sk-one", "sk-two"]
    path.write_bytes(b"# comment\r\nsk-one\r\n")
    with pytest.raises(SecretError, match=r"CRLF.*every request gets 401") as err:
        read_llama_key_file(path)
    assert "sk-one" not in str(err.value)
    path.write_bytes(b"sk-one \n")
    with pytest.raises(SecretError, match="spaces around the key") as err:
        read_llama_key_file(path)
    assert "sk-one" not in str(err.value) and "line 1" in str(err.value)
    path.write_bytes(b"# only\n")
    with pytest.raises(SecretError, match="has no key"):
        read_llama_key_file(path)


def test_engine_log_gets_the_argv_redacted(tmp_path: Path) -> None:
    """launch_instance writes the argv into the engine's log; a key on it (resolve() refuses one, but a
    ResolvedProfile can be built by hand) is written as ***."""
    from tui.base.process import free_port, stop_group
    from tui.lifecycle.engine import launch_instance
    from tui.lifecycle.profile_resolve import ResolvedProfile
    from tui.lifecycle.profiles import Profile

    port = free_port()
    argv = (sys.executable, "-c", "pass", "--api-key", "sk-flag-secret", f"--tag={KEY}")
    profile = Profile(name="redact", engine="other", port=port, path=tmp_path / "r.toml", argv=argv)
    resolved = ResolvedProfile(profile=profile, argv=argv, env={}, workdir=None, api_key=KEY)
    instance = launch_instance(resolved, log_dir=tmp_path)
    stop_group(instance.launched)
    text = instance.log_path.read_text()
    assert "--api-key '***' '--tag=***'" in text
    assert "sk-flag-secret" not in text and KEY not in text


HF = "hf_shell_secret_5e1d"
# A command line as a shell or a wrapper runs it: the first command exits, so nothing else starts
LOGGED = [
    ("llama.cpp", ["sh", "-c", f"exit 0; exec llama-server -hft {HF} --port 8080"], "-hft"),
    ("other", ["/bin/sh", "-c", f"exit 0; llama-server -hft={HF}"], "-hft"),
    ("llama.cpp", ["bash", "-lc", f"exit 0; llama-server --hf-token={HF}"], "--hf-token"),
    ("other", ["bash", "-lc", f"exit 0; exec llama-server --hf_token '{HF}' --port 8080"], "--hf_token"),
    ("vllm", ["env", "LANG=C", "sh", "-c", f"exit 0; exec vllm serve m --api-key {HF} k2 --port 8000"],
     "--api-key"),
    ("other", ["sh", "-c", f"exit 0\nexec python3 -m vllm.entrypoints.openai.api_server --hf-t {HF}"],
     "--hf-t"),
    ("other", ["env", f"HF_TOKEN={HF}", "sh", "-c", "exit 0"], "HF_TOKEN="),
    ("other", ["sh", "-c", f"exit 0; HF_TOKEN={HF} exec llama-server"], "HF_TOKEN="),
    ("other", ["sh", "-c", 'exit 0; exec llama-server --hf-token "$1"', "sh", HF], "--hf-token"),
    ("other", ["sh", "-c", 'exit 0; exec llama-server "$@"', "sh", "-m", "m.gguf", "--api-key", HF],
     "--api-key"),
    ("llama.cpp", ["bash", "-c", 'exit 0; exec "$@"', "bash", "llama-server", "-hft", HF], "-hft"),
    ("llama.cpp", ["sh", "-c", f"exit 0; exec llama-server -mu 'https://host/m.gguf?token={HF}'"], "?token="),
    ("other", ["true", f"--model-url=https://{HF}@huggingface.co/o/m"], "https://"),
    ("other", ["true", f"https://b.s3.amazonaws.com/m.gguf?X-Amz-Expires=900&X-Amz-Signature={HF}"],
     "X-Amz-Expires=900"),
]


@pytest.mark.parametrize(("engine", "argv", "kept"), LOGGED, ids=[" ".join(a[:2]) + f" {i}"
                                                                  for i, (_, a, _) in enumerate(LOGGED)])
def test_engine_log_masks_a_secret_inside_a_shell_string_or_a_url(tmp_path: Path, engine: str,
                                                                  argv: list[str], kept: str) -> None:
    """A shell's command string is read with the table of the engine it runs (whatever the profile's engine
    kind says), a URL's credentials are masked, and the rest of the command line is still written."""
    from tui.base.process import free_port, stop_group
    from tui.lifecycle.engine import launch_instance
    from tui.lifecycle.profile_resolve import ResolvedProfile
    from tui.lifecycle.profiles import Profile

    profile = Profile(name="shell", engine=engine, port=free_port(), path=tmp_path / "s.toml",
                      argv=tuple(argv))
    resolved = ResolvedProfile(profile=profile, argv=tuple(argv), env={}, workdir=None, api_key=None)
    instance = launch_instance(resolved, log_dir=tmp_path)
    stop_group(instance.launched)
    text = instance.log_path.read_text()
    assert "# argv: " in text and kept in text and "***" in text
    assert HF not in text


def test_options_named_for_tokens_keep_their_numbers_in_the_engine_log(tmp_path: Path) -> None:
    from tui.base.process import free_port, stop_group
    from tui.lifecycle.engine import launch_instance
    from tui.lifecycle.profile_resolve import ResolvedProfile
    from tui.lifecycle.profiles import Profile

    argv = ("sh", "-c", "exit 0; exec vllm serve m --long-prefill-token-threshold 4711 "
            "--dbo-decode-token-threshold 4712 --max-num-batched-tokens 8192 --tokenizer-mode slow")
    profile = Profile(name="tokens", engine="vllm", port=free_port(), path=tmp_path / "t.toml", argv=argv)
    resolved = ResolvedProfile(profile=profile, argv=argv, env={}, workdir=None, api_key=None)
    instance = launch_instance(resolved, log_dir=tmp_path)
    stop_group(instance.launched)
    text = instance.log_path.read_text()
    for kept in ("--long-prefill-token-threshold 4711", "--dbo-decode-token-threshold 4712",
                 "--max-num-batched-tokens 8192", "--tokenizer-mode slow"):
        assert kept in text
    assert "***" not in text


def test_a_url_is_masked_of_its_credentials_and_keeps_the_rest() -> None:
    from tui.base.secrets import mask_urls

    cases = {
        "https://hf_x9@huggingface.co/o/m": "https://***@huggingface.co/o/m",  # the token as the user
        "https://ghp_x9:x-oauth-basic@github.com/o/r": "https://***:***@github.com/o/r",
        "https://me:pw9@host/x": "https://me:***@host/x",
        "https://host/m.gguf?download=1&token=t9&access_token=a9#frag": (
            "https://host/m.gguf?download=1&token=***&access_token=***#frag"),
        "https://host/cb#access_token=a9&state=s": "https://host/cb#access_token=***&state=s",
        "https://b.s3.amazonaws.com/m?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA9%2F20250101"
        "&X-Amz-Date=20250101T000000Z&X-Amz-Expires=900&X-Amz-Security-Token=st9&X-Amz-SignedHeaders=host"
        "&X-Amz-Signature=sg9": (
            "https://b.s3.amazonaws.com/m?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***"
            "&X-Amz-Date=20250101T000000Z&X-Amz-Expires=900&X-Amz-Security-Token=***&X-Amz-SignedHeaders=host"
            "&X-Amz-Signature=***"),
        "https://storage.googleapis.com/b/m?X-Goog-Credential=c9&X-Goog-Signature=sg9": (
            "https://storage.googleapis.com/b/m?X-Goog-Credential=***&X-Goog-Signature=***"),
        "https://b.s3.amazonaws.com/m?AWSAccessKeyId=AKIA9&Expires=1700000000&Signature=sg9": (
            "https://b.s3.amazonaws.com/m?AWSAccessKeyId=***&Expires=1700000000&Signature=***"),
        "https://a.blob.core.windows.net/c/m?sv=2022-11-02&se=2025-01-01&sp=r&sig=sg9": (
            "https://a.blob.core.windows.net/c/m?sv=2022-11-02&se=2025-01-01&sp=r&sig=***"),
        "https://generativelanguage.googleapis.com/v1/models?key=AIza9": (
            "https://generativelanguage.googleapis.com/v1/models?key=***"),
        # names that hold no credential keep their values; a path's @ is no user
        "https://host/v1?max_tokens=5&token_threshold=3&revision=main": (
            "https://host/v1?max_tokens=5&token_threshold=3&revision=main"),
        "https://host/p@x?email=a@b": "https://host/p@x?email=a@b",
    }
    for url, masked in cases.items():
        assert mask_urls(url) == masked, url
        assert mask_urls(f'{{"uri": "{url}"}}') == f'{{"uri": "{masked}"}}', url  # a URL within a JSON text


def test_names_that_say_a_number_about_tokens_are_no_secret() -> None:
    from tui.engines.argv import says_secret

    for name in ("--long-prefill-token-threshold", "--dbo-decode-token-threshold", "VLLM_TOKEN_THRESHOLD",
                 "--return-tokens-as-token-ids", "--max-token", "max_token_len", "--token-limit",
                 "--api-key-file", "tokenizer_mode", "--max-num-batched-tokens"):
        assert not says_secret(name), name
    for name in ("--hf-token", "HF_TOKEN", "--api_key", "X-Amz-Security-Token", "X-Amz-Credential",
                 "access_token", "--auth-token-value-2", "s3_secret_access_key", "hftoken"):
        assert says_secret(name), name
