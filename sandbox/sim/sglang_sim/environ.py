"""SGLang's reading of its boolean environment variables (srt/environ.py EnvBool, the same in 0.5.9 and 0.5.23)."""

from __future__ import annotations

from collections.abc import Mapping

_TRUE = ("true", "1", "yes", "y")
_FALSE = ("false", "0", "no", "n")


def env_bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """Unset or unparsable (EnvField.get warns) keeps the default."""
    value = environ.get(name, "").lower()
    return True if value in _TRUE else False if value in _FALSE else default
