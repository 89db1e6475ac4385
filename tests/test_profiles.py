"""Profile loading and validation: one test per kind of mistake, each pointing at file, line and field."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tui.lifecycle import profile_resolve as prof
from tui.lifecycle.profile_files import load_profiles, parse_profile, repo_profiles_dir
from tui.lifecycle.profile_resolve import resolve
from tui.lifecycle.profiles import ProfileError

GOOD = """\
name = "good"
engine = "llama.cpp"
argv = ["/bin/true", "--port", "${PORT}"]
port = 8123
"""


def write(directory: Path, filename: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / filename
    path.write_text(text, encoding="utf-8")
    return path


def only_issue(text: str, tmp_path: Path, environ: dict[str, str] | None = None):
    path = write(tmp_path, "p.toml", text)
    profile, issues = parse_profile(text, path, environ or {})
    errors = [i for i in issues if i.severity == "error"]
    assert len(errors) == 1, issues
    return profile, errors[0]


def test_unknown_key_names_file_line_and_key(tmp_path: Path) -> None:
    profile, issue = only_issue(GOOD + "\nprot = 9000\n", tmp_path)
    assert profile is None
    assert (issue.path.name, issue.line, issue.field) == ("p.toml", 6, "prot")
    assert "unknown key" in issue.message
    assert str(issue).startswith(f"{tmp_path / 'p.toml'}:6: error: prot: unknown key")


def test_argv_given_as_a_string_is_rejected(tmp_path: Path) -> None:
    text = GOOD.replace('argv = ["/bin/true", "--port", "${PORT}"]', 'argv = "llama-server --port 8080"')
    profile, issue = only_issue(text, tmp_path)
    assert profile is None
    assert (issue.line, issue.field) == (3, "argv")
    assert "list of strings" in issue.message and "not a single string" in issue.message


def test_missing_port(tmp_path: Path) -> None:
    profile, issue = only_issue(GOOD.replace("port = 8123\n", ""), tmp_path)
    assert profile is None
    assert issue.field == "port" and "missing required key 'port'" in issue.message


@pytest.mark.parametrize(
    ("line", "field", "words"),
    [
        ('port = "8123"', "port", "must be an integer, got a string"),
        ("port = true", "port", "must be an integer, got a boolean"),
        ('vram_threshold_gib = "4"', "vram_threshold_gib", "must be a positive number"),
        ("notes = 3", "notes", "must be a string, got an integer"),
    ],
)
def test_wrong_type(tmp_path: Path, line: str, field: str, words: str) -> None:
    text = GOOD.replace("port = 8123", line) if field == "port" else GOOD + line + "\n"
    profile, issue = only_issue(text, tmp_path)
    assert profile is None
    assert issue.field == field and words in issue.message
    assert issue.line == text.splitlines().index(line) + 1


def test_wrong_type_inside_env_table(tmp_path: Path) -> None:
    text = GOOD + "\n[env]\nOMP_NUM_THREADS = 2\n"
    profile, issue = only_issue(text, tmp_path)
    assert profile is None
    assert (issue.line, issue.field) == (7, "env.OMP_NUM_THREADS")


def test_duplicate_name_rejects_the_later_file_and_keeps_the_first(tmp_path: Path) -> None:
    first = write(tmp_path / "repo", "a.toml", GOOD)
    second = write(tmp_path / "user", "b.toml", "# mine\n" + GOOD.replace("8123", "8124"))
    loaded = load_profiles([tmp_path / "repo", tmp_path / "user"], environ={})
    assert loaded.profiles["good"].path == first and loaded.profiles["good"].port == 8123
    [issue] = loaded.issues
    assert (issue.path, issue.line, issue.field) == (second, 2, "name")
    assert "duplicate name 'good'" in issue.message and str(first) in issue.message


def test_unset_variable_is_reported_and_blocks_the_start(tmp_path: Path) -> None:
    text = GOOD.replace('"/bin/true"', '"/bin/true", "--model",\n    "${NOT_SET_MODEL}"')
    path = write(tmp_path, "p.toml", text)
    profile, issues = parse_profile(text, path, environ={})
    assert profile is not None  # listed, with the reason it cannot start
    [issue] = issues
    assert (issue.line, issue.field) == (4, "argv[2]")
    assert "${NOT_SET_MODEL} is not set" in issue.message
    with pytest.raises(ProfileError, match=r"NOT_SET_MODEL\} is not set") as exc:
        resolve(profile, environ={})
    assert exc.value.issues[0].line == 4
    assert resolve(profile, environ={"NOT_SET_MODEL": "/m.gguf"}).argv == (
        "/bin/true",
        "--model",
        "/m.gguf",
        "--port",
        "8123",
    )


def test_one_bad_file_does_not_stop_the_others(tmp_path: Path) -> None:
    write(tmp_path, "a-broken.toml", 'name = "broken"\nargv = [1,\nport = 1\n')
    write(tmp_path, "b-unknown.toml", GOOD.replace('"good"', '"other"') + "colour = 1\n")
    write(tmp_path, "c-good.toml", GOOD)
    loaded = load_profiles([tmp_path], environ={})
    assert list(loaded.profiles) == ["good"]
    by_file = {i.path.name: i for i in loaded.issues}
    assert set(by_file) == {"a-broken.toml", "b-unknown.toml"}
    assert by_file["a-broken.toml"].line == 3 and "invalid TOML" in by_file["a-broken.toml"].message
    assert by_file["b-unknown.toml"].line == 5 and by_file["b-unknown.toml"].field == "colour"


KEY_SPELLINGS = [
    '["srv", "--api-key", "s3cret"]',
    '["srv", "--api-key=s3cret"]',
    '["srv", "--api_key", "s3cret"]',  # vLLM reads _ as -
    '["srv", "--api_key=s3cret"]',
    '["srv", "--api-k", "s3cret"]',  # argparse takes an unambiguous prefix
    '["srv", "--api-ke=s3cret"]',
    '["srv", "--API-KEY", "s3cret"]',
    '["srv", " --Api_Ke=s3cret"]',
]


@pytest.mark.parametrize("argv", KEY_SPELLINGS)
def test_api_key_on_argv_is_rejected_in_every_spelling(tmp_path: Path, argv: str) -> None:
    profile, issue = only_issue(GOOD.replace('["/bin/true", "--port", "${PORT}"]', argv), tmp_path)
    assert profile is None and issue.line == 3 and issue.field == "argv[1]"
    assert "holds a secret" in issue.message and "api_key_file" in issue.message
    assert "s3cret" not in str(issue)


# A secret inside a shell's command string, read as the shell splits it with each engine's own table: the
# string is the element named (argv[2], or argv[4] behind env or shell options)
SHELL_SPELLINGS = [
    ('["sh", "-c", "exec llama-server -hft hf_s3cret --port ${PORT}"]', 2),
    ('["/bin/sh", "-c", "llama-server -hft=hf_s3cret"]', 2),
    ('["bash", "-lc", "llama-server --hf-token=hf_s3cret"]', 2),
    ('["bash", "-lc", \'exec llama-server --hf_token "hf_s3cret" --port 8080\']', 2),
    ('["sh", "-c", "cd /m && exec vllm serve m --api-key hf_s3cret"]', 2),
    ('["sh", "-c", "exec python3 -m vllm.entrypoints.openai.api_server --hf-t hf_s3cret"]', 2),  # a prefix
    ('["env", "LANG=C", "sh", "-c", "llama-server --hf-token hf_s3cret"]', 4),
    ('["bash", "-o", "pipefail", "-ec", "my-server -hft hf_s3cret 2>&1 | tee log"]', 4),
    ('["sh", "-c", "HF_TOKEN=hf_s3cret exec llama-server"]', 2),
    ('["sh", "-c", "bash -c \'llama-server -hft hf_s3cret\'"]', 2),
    ('["env", "-S", "llama-server -hft hf_s3cret"]', 2),
    ('["sh", "-c", "echo start\\nexec sglang serve --admin-api-key hf_s3cret"]', 2),
    # the words after the string are its "$@" (or $1...): the secret is one of them, named where it is
    ('["sh", "-c", "exec llama-server \\"$@\\"", "sh", "-m", "m.gguf", "--api-key", "hf_s3cret"]', 6),
    ('["bash", "-c", "exec \\"$@\\"", "bash", "llama-server", "-hft", "hf_s3cret"]', 5),
]


@pytest.mark.parametrize(("argv", "field"), SHELL_SPELLINGS)
def test_a_secret_in_a_shell_string_is_rejected_as_if_given_directly(tmp_path: Path, argv: str,
                                                                      field: int) -> None:
    profile, issue = only_issue(GOOD.replace('["/bin/true", "--port", "${PORT}"]', argv), tmp_path)
    assert profile is None and issue.line == 3 and issue.field == f"argv[{field}]"
    assert "holds a secret" in issue.message and "runs" in issue.message and "api_key_file" in issue.message
    assert "s3cret" not in str(issue)


URL_CREDENTIALS = [
    '["srv", "-mu", "https://hf_s3cret@huggingface.co/o/m/resolve/main/m.gguf"]',
    '["srv", "-mu", "https://me:s3cret@host/m.gguf"]',
    '["srv", "-mu", "https://host/m.gguf?download=1&token=s3cret"]',
    '["srv", "-mu", "https://b.s3.amazonaws.com/m.gguf?X-Amz-Date=20250101T000000Z&X-Amz-Signature=s3cret"]',
    '["srv", "--model-url=https://a.blob.core.windows.net/c/m.gguf?sv=2022-11-02&sp=r&sig=s3cret"]',
    '["sh", "-c", "exec llama-server -mu \'https://host/m.gguf?access_token=s3cret\'"]',
]


@pytest.mark.parametrize("argv", URL_CREDENTIALS)
def test_a_url_that_carries_a_credential_is_rejected(tmp_path: Path, argv: str) -> None:
    profile, issue = only_issue(GOOD.replace('["/bin/true", "--port", "${PORT}"]', argv), tmp_path)
    assert profile is None and issue.field in ("argv[1]", "argv[2]") and "holds a secret" in issue.message
    assert "s3cret" not in str(issue)


NOT_KEY_FLAGS = ["--api-key-file", "--api-key-file=/k", "--api", "--api-", "--api-server-count",
                 # vLLM's options named for tokens that hold numbers or names, never a secret
                 "--long-prefill-token-threshold", "--long-prefill-token-threshold=512",
                 "--dbo-decode-token-threshold", "--dbo-prefill-token-threshold", "--max-num-batched-tokens",
                 "--tokenizer", "--tokenizer-mode", "--return-tokens-as-token-ids"]


@pytest.mark.parametrize("arg", NOT_KEY_FLAGS)
def test_flags_that_are_not_the_key_pass(tmp_path: Path, arg: str) -> None:
    text = GOOD.replace('"--port"', f'"{arg}", "x", "--port"')
    assert parse_profile(text, write(tmp_path, "p.toml", text), environ={})[1] == []


def test_key_flag_or_key_from_a_variable_is_rejected_when_resolved(tmp_path: Path) -> None:
    """${VAR} can expand to a key flag or to the key itself: caught after substitution, where every start
    passes, naming the element and never the value."""
    key_file = write(tmp_path, "key", "sk-from-file-123\n")
    text = GOOD.replace('"--port"', '"${EXTRA}", "--port"') + f'api_key_file = "{key_file}"\n'
    path = write(tmp_path, "p.toml", text)
    for extra in ("--api-key=sk-other-456", "--API_K", "prefix-sk-from-file-123"):
        profile, issues = parse_profile(text, path, environ={"EXTRA": extra})
        assert profile is not None and issues == []  # the text as written is clean
        with pytest.raises(ProfileError) as err:
            resolve(profile, environ={"EXTRA": extra})
        [issue] = err.value.issues
        assert issue.field == "argv[1]" and issue.line == 3 and "command line" in issue.message
        assert "sk-" not in str(err.value)


def test_options_named_for_tokens_in_a_shell_string_pass(tmp_path: Path) -> None:
    argv = ('["sh", "-c", "exec vllm serve m --long-prefill-token-threshold 512 '
            '--max-num-batched-tokens 8192 --tokenizer t --port ${PORT}"]')
    text = GOOD.replace('["/bin/true", "--port", "${PORT}"]', argv)
    assert parse_profile(text, write(tmp_path, "p.toml", text), environ={})[1] == []


def test_a_secret_a_variable_puts_into_a_shell_string_is_rejected_when_resolved(tmp_path: Path) -> None:
    text = GOOD.replace('["/bin/true", "--port", "${PORT}"]', '["sh", "-c", "exec llama-server ${EXTRA}"]')
    path = write(tmp_path, "p.toml", text)
    profile, issues = parse_profile(text, path, environ={"EXTRA": "-hft hf_s3cret"})
    assert profile is not None and issues == []  # the text as written is clean
    with pytest.raises(ProfileError) as err:
        resolve(profile, environ={"EXTRA": "-hft hf_s3cret"})
    [issue] = err.value.issues
    assert issue.field == "argv[2]" and "'-hft' holds a secret" in issue.message
    assert "s3cret" not in str(err.value)


def test_sweep_arm_that_sets_the_key_flag_cannot_start(tmp_path: Path) -> None:
    """A sweep derives profiles with dataclasses.replace (no parse_profile): resolve() still refuses."""
    from tui.compare.sweep_param import parse_param_spec, sweep_profiles

    profile, _ = parse_profile(GOOD, write(tmp_path, "p.toml", GOOD), environ={})
    arms = sweep_profiles(profile, parse_param_spec("api_key=sk-a,sk-b"))
    for _, arm in arms:
        assert "--api_key" in arm.argv
        with pytest.raises(ProfileError, match=r"argv\[3\]: '--api_key' holds a secret"):
            resolve(arm, environ={})


def test_api_key_in_env_is_rejected(tmp_path: Path) -> None:
    profile, issue = only_issue(GOOD + '[env]\nVLLM_API_KEY = "s3cret"\n', tmp_path)
    assert profile is None and (issue.line, issue.field) == (6, "env.VLLM_API_KEY")


def test_non_loopback_host_without_key_is_warned(tmp_path: Path) -> None:
    path = write(tmp_path, "p.toml", GOOD + 'host = "0.0.0.0"\n')
    profile, issues = parse_profile(path.read_text(), path, environ={})
    assert profile is not None  # 0.0.0.0 is reachable from other machines
    [warning] = issues
    assert warning.severity == "warning" and warning.field == "host" and warning.line == 5
    keyed = GOOD + 'host = "192.168.1.5"\napi_key_file = "/k"\n'
    assert parse_profile(keyed, path, environ={})[1] == []


def test_api_key_file_reaches_the_engine_but_never_argv_or_repr(tmp_path: Path) -> None:
    key_file = write(tmp_path, "key", "# comment\n\nsk-very-secret\n")
    llama = GOOD + f'api_key_file = "{key_file}"\n'
    profile, _ = parse_profile(llama, tmp_path / "l.toml", environ={})
    resolved = resolve(profile, environ={})
    assert resolved.api_key == "sk-very-secret"
    # llama-server gets the same stripped key enginetop sends, in its environment (a file handed over
    # as it is would give it "key\r" when the file has CRLF line ends)
    assert resolved.env["LLAMA_API_KEY"] == "sk-very-secret"
    assert resolved.argv == ("/bin/true", "--port", "8123")
    assert "sk-very-secret" not in repr(resolved) and "sk-very-secret" not in shlex.join(resolved.argv)
    vllm = llama.replace('"llama.cpp"', '"vllm"')
    resolved = resolve(parse_profile(vllm, tmp_path / "v.toml", environ={})[0], environ={})
    assert resolved.env["VLLM_API_KEY"] == "sk-very-secret" and "--api-key-file" not in resolved.argv
    assert "sk-very-secret" not in repr(resolved)
    empty = write(tmp_path, "empty", "# nothing\n")
    profile, _ = parse_profile(GOOD + f'api_key_file = "{empty}"\n', tmp_path / "e.toml", environ={})
    with pytest.raises(ProfileError, match="has no key"):
        resolve(profile, environ={})


def test_builtin_variables_resolve_lazily(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(prof, "_builtin_value", lambda name: calls.append(name) or f"/builtin/{name}")
    text = GOOD.replace('"/bin/true"', '"${ENGINETOP_LLAMA_SERVER}", "-m", "${ENGINETOP_DEMO_MODEL}"')
    write(tmp_path, "p.toml", text)
    loaded = load_profiles([tmp_path], environ={})
    assert loaded.issues == [] and calls == []  # listing profiles never touches the demo engine
    resolved = resolve(loaded.get("good"), environ={"PORT": "1"})  # the profile's port wins over $PORT
    assert resolved.argv == (
        "/builtin/ENGINETOP_LLAMA_SERVER",
        "-m",
        "/builtin/ENGINETOP_DEMO_MODEL",
        "--port",
        "8123",
    )
    overridden = resolve(loaded.get("good"), environ={"ENGINETOP_LLAMA_SERVER": "/opt/llama-server"})
    assert overridden.argv[0] == "/opt/llama-server"


def test_unknown_profile_name_lists_the_known_ones(tmp_path: Path) -> None:
    write(tmp_path, "p.toml", GOOD)
    with pytest.raises(ProfileError, match=r"no profile named 'nope' \(known: good\)"):
        load_profiles([tmp_path], environ={}).get("nope")


def test_user_config_dir_is_searched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    write(tmp_path / "enginetop" / "profiles", "mine.toml", GOOD.replace('"good"', '"mine-only"'))
    assert "mine-only" in load_profiles(environ={}).profiles


# ---------------------------------------------------------------- shipped profiles


def shipped():
    return load_profiles([repo_profiles_dir()], environ={})


def test_shipped_profiles_load_and_only_miss_user_variables() -> None:
    loaded = shipped()
    assert {
        "demo-cpu-threads1",
        "demo-cpu-threads2",
        "llamacpp-qwen27b-mtp",
        "llamacpp-qwen27b",
        "vllm-qwen27b",
        "sglang-example",
    } <= set(loaded.profiles)
    for issue in loaded.issues:
        assert "is not set in the environment" in issue.message, str(issue)
    assert loaded.issues_for("demo-cpu-threads1") == [] and loaded.issues_for("demo-cpu-threads2") == []


def test_shipped_seed_configs_match_the_report() -> None:
    loaded = shipped()
    mtp = loaded.get("llamacpp-qwen27b-mtp")
    joined = " ".join(mtp.argv)
    assert (
        "--ctx-size 262144 --flash-attn on --cache-type-k q8_0 --cache-type-v q8_0 --n-gpu-layers 999 "
        "--spec-type draft-mtp --spec-draft-n-max 2 --spec-draft-p-min 0.75"
    ) in joined
    assert "--parallel" not in joined and "--metrics" in mtp.argv and mtp.host == "127.0.0.1"
    plain = loaded.get("llamacpp-qwen27b")
    assert "--spec-type" not in plain.argv and "--parallel" not in plain.argv
    vllm = loaded.get("vllm-qwen27b")
    assert (
        "--max-model-len 32768 --gpu-memory-utilization 0.88 --max-num-seqs 32 "
        '--limit-mm-per-prompt {"image":0,"video":0}'
    ) in " ".join(vllm.argv)
    a, b = loaded.get("demo-cpu-threads1"), loaded.get("demo-cpu-threads2")
    differ = [(x, y) for x, y in zip(a.argv, b.argv, strict=True) if x != y]
    assert differ == [("1", "2")] and a.argv[a.argv.index("1") - 1] == "--threads"


def test_users_own_api_key_file_is_read_the_way_llama_server_reads_it(tmp_path: Path) -> None:
    """argv's --api-key-file: llama-server keeps "\\r" (CRLF) and spaces, which no client can send: refused,
    by file, never quoting the key. A clean file gives enginetop the engine's first key."""
    def resolved_with(content: bytes, flag_style: str = "split") -> prof.ResolvedProfile:
        key_file = tmp_path / "engine.key"
        key_file.write_bytes(content)
        flag = f'"--api-key-file={key_file}"' if flag_style == "eq" else f'"--api-key-file", "{key_file}"'
        text = GOOD.replace('"--port"', f'{flag}, "--port"')
        profile, issues = parse_profile(text, write(tmp_path, "p.toml", text), environ={})
        assert profile is not None and issues == []
        return resolve(profile, environ={})

    assert resolved_with(b"# comment\nsk-engine-1\nsk-engine-2\n").api_key == "sk-engine-1"
    assert resolved_with(b"sk-engine-1\n", "eq").api_key == "sk-engine-1"
    for bad, words in ((b"sk-engine-1\r\n", r"Windows line endings \(CRLF\)"), (b" sk-engine-1\n", "spaces")):
        with pytest.raises(ProfileError, match=words) as err:
            resolved_with(bad)
        assert "sk-engine-1" not in str(err.value) and "engine.key" in str(err.value)


def test_llama_key_with_a_comma_is_refused(tmp_path: Path) -> None:
    key_file = write(tmp_path, "key", "sk-a,b\n")  # LLAMA_API_KEY would split it into two keys
    profile, _ = parse_profile(GOOD + f'api_key_file = "{key_file}"\n', tmp_path / "l.toml", environ={})
    with pytest.raises(ProfileError, match="contains a comma"):
        resolve(profile, environ={})


@pytest.mark.parametrize(("extra", "field", "words"), [
    ('router_model = ""', "router_model", "must not be empty"),
    ('swap_profile = "fast"', "swap_profile", "needs router_model"),
])
def test_router_model_and_swap_profile_are_checked(tmp_path: Path, extra: str, field: str,
                                                   words: str) -> None:
    profile, issue = only_issue(GOOD + extra + "\n", tmp_path)
    assert profile is None and issue.field == field and words in issue.message and issue.line == 5


def test_router_model_needs_a_llama_cpp_engine(tmp_path: Path) -> None:
    profile, issue = only_issue(GOOD.replace('"llama.cpp"', '"vllm"') + 'router_model = "a"\n', tmp_path)
    assert profile is None and issue.field == "router_model" and "llama-server router" in issue.message


def test_profiles_of_one_router_switch_models_and_keep_it(tmp_path: Path) -> None:
    a = parse_profile(GOOD + 'router_model = "a"\n', write(tmp_path, "a.toml", GOOD), environ={})[0]
    b_text = GOOD.replace('"good"', '"b"') + 'router_model = "b"\n'
    b = parse_profile(b_text, tmp_path / "b.toml", environ={})[0]
    plain = parse_profile(GOOD, tmp_path / "c.toml", environ={})[0]
    assert a.same_router(b) and not a.same_router(plain) and not plain.same_router(plain)
