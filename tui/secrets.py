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


def _read_key_file(path: Path) -> str:
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
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretError(f"API key file {path} is not UTF-8 text") from None
    for line in text.splitlines():
        # Same file format as llama-server's --api-key-file (one key a line, # comments), but stripped,
        # so a CRLF file still works.
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
