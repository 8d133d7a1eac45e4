"""Reading a config file's sections: `${VAR}` expansion, typed keys with their limits, and errors that name
the key (`models[1].context_window: must be …`), so that `proxy.config` only says what the keys are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


class ConfigError(Exception):
    """A configuration problem, phrased for the person who wrote the file."""


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def expand(value: Any, environ: Mapping[str, str]) -> Any:
    """Expand `${VAR}` and `${VAR:-default}` in every string; an unset variable without default is empty.

    Empty rather than an error so that the example config starts on a machine without provider keys.
    """
    if isinstance(value, str):
        return _ENV_REF.sub(lambda m: environ.get(m.group(1), m.group(2) or ""), value)
    if isinstance(value, list):
        return [expand(item, environ) for item in value]
    if isinstance(value, dict):
        return {key: expand(item, environ) for key, item in value.items()}
    return value


class Section:
    """Typed access to one mapping of the file, so every error can name its full key."""

    def __init__(self, data: Any, where: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{where or 'config'}: must be a mapping of keys to values")
        self.data: dict[str, Any] = data
        self.where = where

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def section(self, name: str) -> Section:
        return Section(self.data.get(name), self.key(name))

    def reject_unknown(self, known: set[str]) -> None:
        for name in self.data:
            if name not in known:
                raise ConfigError(f"{self.key(str(name))}: unknown key (known: {', '.join(sorted(known))})")

    def _present(self, name: str) -> Any:
        value = self.data.get(name)
        return None if value == "" else value

    def string(self, name: str, default: str) -> str:
        value = self.optional_string(name)
        return default if value is None else value

    def optional_string(self, name: str) -> str | None:
        value = self._present(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ConfigError(f"{self.key(name)}: must be a string")
        return str(value)

    def required_string(self, name: str) -> str:
        value = self.optional_string(name)
        if value is None:
            raise ConfigError(f"{self.key(name)}: required")
        return value

    def optional_integer(self, name: str, minimum: int | None = None, maximum: int | None = None) -> int | None:
        value = self._present(name)
        if value is None:
            return None
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{self.key(name)}: must be a whole number, got {value!r}")
        if minimum is not None and value < minimum:
            raise ConfigError(f"{self.key(name)}: must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise ConfigError(f"{self.key(name)}: must be at most {maximum}, got {value}")
        return value

    def integer(self, name: str, default: int, minimum: int | None = None, maximum: int | None = None) -> int:
        value = self.optional_integer(name, minimum, maximum)
        return default if value is None else value

    def number(self, name: str, default: float, low: float, high: float) -> float:
        value = self._present(name)
        if value is None:
            return default
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{self.key(name)}: must be a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{self.key(name)}: must be a number, got {value!r}")
        if not low <= value <= high:
            raise ConfigError(f"{self.key(name)}: must be between {low} and {high}, got {value}")
        return float(value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self._present(name)
        if value is None:
            return default
        if isinstance(value, str) and value.lower() in {"true", "false"}:
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise ConfigError(f"{self.key(name)}: must be true or false, got {value!r}")
        return value

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.string(name, default).upper()
        if value not in choices:
            raise ConfigError(f"{self.key(name)}: must be one of {', '.join(choices)}, got {value!r}")
        return value

    def duration(self, name: str, default: float | None) -> float | None:
        """Seconds from `90`, `30m`, `24h`, `7d`; `forever` keeps for ever."""
        value = self._present(name)
        if value is None:
            return default
        if isinstance(value, str) and value.strip().lower() == "forever":
            return None
        match = _DURATION.match(str(value)) if not isinstance(value, bool) else None
        if match is None:
            raise ConfigError(f"{self.key(name)}: must be a duration like 0, 90s, 30m, 24h, 7d or 'forever'")
        return float(match.group(1)) * _DURATION_UNITS[match.group(2)]

    def string_list(self, name: str) -> tuple[str, ...]:
        value = self.data.get(name)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ConfigError(f"{self.key(name)}: must be a list of strings")
        return tuple(item for item in value if item)
