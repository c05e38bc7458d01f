"""Reading an operator's TOML file (the config, a sensor map): one path with one set of limits and messages.

A config path can be anything the operator or a typo names: /dev/zero (read until memory runs out), a FIFO (blocks
start-up and SIGHUP forever, SIGTERM included), a 5,000-digit integer or arrays nested thousands deep (tomllib
raises ValueError or RecursionError). Each is a TomlFileError whose message says what is wrong; callers turn it
into their own configuration error (exit 78). Links are followed (a Kubernetes ConfigMap is a link), the target
must be a regular file of at most MAX_TOML_BYTES.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from gpuwatch.files.safefile import UnsafeFileError, read_regular_file

MAX_TOML_BYTES = 1 << 20  # the shipped config and sensor maps are a few KiB; a MiB is far beyond any real one


class TomlFileError(Exception):
    """The file cannot be used; str() is the problem, without the path (the caller names it)."""


def load_toml_file(path: Path) -> dict[str, Any]:
    """The parsed document; FileNotFoundError when it is missing (callers say what to do), else TomlFileError."""
    try:
        raw = read_regular_file(path, max_bytes=MAX_TOML_BYTES, follow_links=True)
    except FileNotFoundError:
        raise
    except UnsafeFileError as exc:
        raise TomlFileError(f"{exc}; give a regular file of at most {MAX_TOML_BYTES:,} bytes") from None
    except OSError as exc:
        raise TomlFileError(f"cannot read the file: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TomlFileError(f"cannot read the file: it is not UTF-8 ({exc})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TomlFileError(f"not valid TOML: {exc}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # a 4300+ digit integer, arrays nested thousands deep
        raise TomlFileError(f"not a usable TOML document: {type(exc).__name__}: {str(exc)[:200]}") from None
