"""The one masking function (tui.engines.argv.mask_argv), as a table over each engine's real option list:
every spelling of every secret option its parser accepts, every value of a many-valued one, a flag given
without its value, options it does not know, other programs' credentials and the target's own key."""

from __future__ import annotations

import pytest

from tui.engines import llamacpp, sglang, vllm
from tui.engines.argv import REDACTED, Options, mask_argv, parse, says_secret, secrets_on_argv
from tui.engines.known import ENGINES

S = "s3cr3t-VALUE-9f2"


def _secret_spellings(table: Options) -> list[str]:
    return sorted(s for s in table.nargs if table.canonical(s) in table.secret)


def _prefixes(table: Options, spelling: str) -> list[str]:
    """Every prefix of a long spelling the engine's argparse takes as that option (unambiguous)."""
    if not table.prefixes or not spelling.startswith("--"):
        return []
    return [spelling[:n] for n in range(3, len(spelling)) if table.resolve(spelling[:n]) == spelling]


def _forms(table: Options, spelling: str) -> list[list[str]]:
    forms = [[spelling, S], [f"{spelling}={S}"]]
    if spelling.startswith("--"):
        under = "--" + spelling[2:].replace("-", "_")
        forms += [[under, S], [f"{under}={S}"]]
    for prefix in _prefixes(table, spelling):
        forms += [[prefix, S], [f"{prefix}={S}"]]
    return forms


CASES = [(e.name, form) for e in ENGINES for spelling in _secret_spellings(e.options)
         for form in _forms(e.options, spelling)]


def test_each_engine_knows_its_secret_options_in_every_spelling() -> None:
    assert _secret_spellings(llamacpp.OPTIONS) == ["--api-key", "--hf-token", "-hft"]
    assert _secret_spellings(vllm.OPTIONS) == ["--api-key", "--hf-token"]
    assert _secret_spellings(sglang.OPTIONS) == ["--admin-api-key", "--api-key"]
    # vLLM's argparse takes prefixes: "--api-k" is its key, "--api" is ambiguous (--api-server-count)
    assert vllm.OPTIONS.resolve("--api-k") == "--api-key" and vllm.OPTIONS.resolve("--api") is None
    assert vllm.OPTIONS.nargs["--api-key"] == "+" and vllm.OPTIONS.nargs["--hf-token"] == "?"
    assert llamacpp.OPTIONS.resolve("--api-k") is None  # llama.cpp matches names exactly
    assert llamacpp.OPTIONS.resolve("--ctx_size") == "--ctx-size"  # and reads _ as -


@pytest.mark.parametrize(("engine", "form"), CASES, ids=[f"{e}:{' '.join(f)}" for e, f in CASES])
def test_a_secret_in_any_spelling_is_masked_and_the_rest_is_kept(engine: str, form: list[str]) -> None:
    table = next(e.options for e in ENGINES if e.name == engine)
    argv = ["/usr/bin/engine", "--port", "8000", *form, "--host", "127.0.0.1"]
    masked = mask_argv(argv, table)
    assert not any(S in a for a in masked), masked
    assert REDACTED in " ".join(masked)
    assert masked[:3] == ("/usr/bin/engine", "--port", "8000") and masked[-2:] == ("--host", "127.0.0.1")
    assert [i for i, _ in secrets_on_argv(argv, table)] == [3]


def test_every_value_of_a_many_valued_key_is_masked_and_none_after_it() -> None:
    argv = ["vllm", "serve", "m", "--api-key", "k-one", "k-two", "--port", "8000"]
    assert mask_argv(argv, vllm.OPTIONS) == ("vllm", "serve", "m", "--api-key", REDACTED, REDACTED, "--port",
                                             "8000")


def test_a_flag_given_without_its_value_masks_nothing_else() -> None:
    # vLLM's --hf-token alone means "the token `hf auth login` stored": the next option is not its value
    argv = ["vllm", "serve", "m", "--hf-token", "--port", "8000"]
    assert mask_argv(argv, vllm.OPTIONS) == tuple(argv)
    # llama.cpp takes the next argument whatever it is: a key starting with '-' is the key
    argv = ["llama-server", "--api-key", "-dashed-key", "--port", "8080"]
    assert mask_argv(argv, llamacpp.OPTIONS) == ("llama-server", "--api-key", REDACTED, "--port", "8080")


def test_an_option_the_parser_does_not_know_has_its_values_masked() -> None:
    argv = ["llama-server", "--some-future-option", "v1", "v2", "--port", "8080", "-m", "model.gguf"]
    assert mask_argv(argv, llamacpp.OPTIONS) == ("llama-server", "--some-future-option", REDACTED, REDACTED,
                                                 "--port", "8080", "-m", "model.gguf")
    masked = mask_argv(["llama-server", "--future=x"], llamacpp.OPTIONS)
    assert masked == ("llama-server", f"--future={REDACTED}")
    # SGLang's table is partial: an option it does not list is masked rather than guessed
    assert mask_argv(["python", "-m", "sglang.launch_server", "--enable-p2p-check", "x", "--port", "30000"],
                     sglang.OPTIONS)[4] == REDACTED


def test_known_options_keep_their_values_however_their_names_read() -> None:
    for table in (llamacpp.OPTIONS, vllm.OPTIONS):
        for spelling, nargs in table.nargs.items():
            if nargs != 1 or table.canonical(spelling) in table.secret or says_secret(spelling):
                continue
            assert mask_argv(["engine", spelling, "v"], table)[2] == "v", spelling
    # names with "token" or "key" in them that hold no secret
    argv = ["vllm", "serve", "--max-num-batched-tokens", "8192", "--tokenizer", "tok", "--ssl-keyfile", "/k"]
    assert mask_argv(argv, vllm.OPTIONS) == tuple(argv)


def test_other_programs_credentials_and_the_targets_own_key_are_masked() -> None:
    argv = ["ssh", "-o", "IdentityFile=/k", "-L", "8080:gpu:8080", "--password", S, "user@gpu"]
    assert S not in " ".join(mask_argv(argv))
    argv = ["docker", "run", "-e", f"HF_TOKEN={S}", "-e", f"API_KEY={S}", "-e", "PORT=8000", "image"]
    masked = mask_argv(argv)
    assert S not in " ".join(masked) and "PORT=8000" in masked and "HF_TOKEN=***" in masked
    assert mask_argv(["prog", f"--db=https://me:{S}@host/x"]) == ("prog", "--db=https://me:***@host/x")
    key = "sk-target-own-key-123"
    argv = ["vllm", "serve", "--speculative-config", f'{{"note": "{key}"}}', f"--served-model-name={key}x"]
    assert key not in " ".join(mask_argv(argv, vllm.OPTIONS, [key]))


def test_parse_reads_the_command_line_as_the_engine_does() -> None:
    read = parse(["llama-server", "-c", "8192", "-np", "4", "-no-kvu", "--spec-draft-model", "d.gguf",
                  "--ctx_size", "16384"], llamacpp.OPTIONS)
    assert read.options["--ctx-size"] == "16384"  # the last one wins, _ read as -
    assert read.options["--parallel"] == "4" and "--no-kv-unified" in read.options
    read = parse(["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--max-num-se", "8",
                  "--no-enable-prefix-caching", "--model", "m"], vllm.OPTIONS)
    assert read.options["--max-num-seqs"] == "8" and "--no-enable-prefix-caching" in read.options
    assert read.positionals == ()


def test_what_a_review_found_passing_in_clear_is_masked() -> None:
    from tui.engines.knowledge import program_name

    # `python -mMODULE`: the program is the module, never the next argument (here a secret)
    argv = ["python3", "-mvllm.entrypoints.openai.api_server", "--hf-token", S, "--port", "8000"]
    assert program_name(argv) == "vllm.entrypoints.openai.api_server"
    assert S not in " ".join(mask_argv(argv, vllm.OPTIONS))
    assert program_name(["python", "-X", "dev", "-W", "ignore", "-m", "sglang.launch_server"]) == \
        "sglang.launch_server"
    # a process that rewrote its title (setproctitle): its whole command line in one string, key and all
    for title in (f"/opt/venv/bin/python -m vllm.entrypoints.openai.api_server --api-key {S}",
                  f"llama-server --api-key {S} --port 8080", f"my-server --api-key={S}"):
        assert S not in program_name([title]), title
    assert program_name([f"llama-server --api-key {S}"]) == "llama-server"
    assert program_name([f"llama-server --api-key {S} --port 8080", "", "", ""]) == "llama-server"  # NULs
    assert program_name([f"/usr/bin/python3 -m vllm.entrypoints.openai.api_server --api-key {S}"]) == \
        "vllm.entrypoints.openai.api_server"
    # a secret member of a JSON value (vLLM's tensorizer S3 keys), refused on a profile's argv too
    argv = ["vllm", "serve", "m", "--model-loader-extra-config",
            f'{{"tensorizer_uri": "s3://b/m", "s3_secret_access_key": "{S}"}}']
    masked = mask_argv(argv, vllm.OPTIONS)
    assert S not in " ".join(masked) and "s3://b/m" in masked[-1]
    assert [i for i, _ in secrets_on_argv(argv, vllm.OPTIONS)] == [4]
    # names run together or in camelCase, a variable after an option's `=`, a command in one string
    for name in ("--accessToken", "--authToken", "--clientSecret", "--secretKey", "--hftoken"):
        assert mask_argv(["prog", name, S]) == ("prog", name, REDACTED), name
    assert mask_argv(["prog", f"--env=OPENAI_API_KEY={S}"]) == ("prog", "--env=OPENAI_API_KEY=***")
    assert S not in " ".join(mask_argv(["sh", "-c", f"vllm serve m --api-key {S} --port 8000"]))
    # llama.cpp's short spelling with its value joined: llama-server refuses it, and it is masked all the same
    assert mask_argv(["llama-server", f"-hft{S}"], llamacpp.OPTIONS) == ("llama-server", "-hft***")
    # ...and names that only look alike keep their values
    argv = ["vllm", "serve", "--max-num-batched-tokens", "8192", "--tokenizer", "t", "--max-tokens", "5"]
    assert mask_argv(argv) == tuple(argv)


def test_a_switch_and_its_negation_the_last_one_wins_and_the_environment_counts() -> None:
    from tui.sources.config import llama_config

    props = {"default_generation_settings": {"n_ctx": 1024}, "total_slots": 4}
    split = llama_config(props, None, (["llama-server", "-c", "4096", "-kvu", "-np", "4", "-no-kvu"], {}), [])
    assert split.kv_unified is False and split.summary().endswith("4 slots × 1,024 split")
    on = llama_config(props, None, (["llama-server", "--no-cache-prompt", "--cache-prompt"], {}), [])
    assert on.prefix_caching is True and "prefix_caching" not in on.defaults
    env = {"LLAMA_ARG_SPEC_TYPE": "ngram-mod", "LLAMA_ARG_CACHE_PROMPT": "0", "LLAMA_API_KEY": S}
    read = llama_config(props, None, (["llama-server", "-c", "4096"], env), [])
    assert read.prefix_caching is False and read.spec_type == "ngram-mod"
    # an n-gram type drafts up to its own option's length: not assumed to be --spec-draft-n-max's 3
    assert read.spec_n_max is None and "spec_n_max" not in read.defaults
    assert S not in repr(read)  # the key in the environment is never read


def test_a_message_about_a_port_holder_never_quotes_its_command_line() -> None:
    import subprocess
    import sys

    import psutil

    from tui.base.process import describe_process

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--api-key", S])
    try:
        said = describe_process(psutil.Process(proc.pid))
        assert said.startswith(f"PID {proc.pid} (python") and S not in said
    finally:
        proc.kill()
        proc.wait()


def test_the_reports_configuration_table_says_a_default_is_one() -> None:
    from tui.html.config import config_table
    from tui.sources.config import config_json, llama_config

    props = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 4}
    config = llama_config(props, None, (["llama-server", "-c", "16384"], {}), [])
    html = config_table([("a", config_json(config))])
    assert "f16 <span class=\"muted\">(default)</span>" in html


def test_the_facts_line_names_what_the_engine_answers_to_shortly() -> None:
    from tui.model.config import EngineConfig

    one = EngineConfig(engine="vLLM", read_wall=0.0, version="0.11.0", dtype="bfloat16",
                       served_names=("/models/Qwen3-8B",))
    assert one.facts() == "bfloat16 · served as Qwen3-8B · vLLM 0.11.0"
    many = EngineConfig(engine="vLLM", read_wall=0.0, served_names=("a", "b", "c", "d"))
    assert many.facts() == "served as a, b +2"
    assert EngineConfig(engine="llama.cpp", read_wall=0.0).facts() == ""
