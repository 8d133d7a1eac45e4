"""Reading a config file's sections: `${VAR}` expansion, typed keys with their limits, and errors that name
the key (`models[1].context_window: must be …`), so that `proxy.config.schema` only says what the keys are.

A key is declared once, as a field of a config dataclass (`setting`: its default, limits, and its name in the
file when that differs); `read_fields` reads the fields by their types, and refuses the keys no field declares.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, TypeVar, get_type_hints

from proxy.numbers import parse_integer

T = TypeVar("T")


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
        if isinstance(value, str) and (number := parse_integer(value.strip(), signed=True)) is not None:
            value = number
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


def setting(
    default: Any,
    *,
    key: str | None = None,
    section: str | None = None,
    repr: bool = True,
    **limits: Any,
) -> Any:
    """A config dataclass field read from the file: its default; `key` its name in the file when not the field's,
    `section` the file's section when the dataclass reads several; `limits` what `Section` checks: `minimum` and
    `maximum` (integers), `low` and `high` (numbers), `choices` (a string, kept in its default's case)."""
    return dataclasses.field(default=default, repr=repr, metadata={"key": key, "section": section, "limits": limits})


def file_key(field: dataclasses.Field[Any]) -> str:
    return str(field.metadata.get("key") or field.name)


def read_fields(cls: type[T], sections: Section | Mapping[str, Section], **given: Any) -> T:
    """`cls` from the file: each field not `given` read by its type with its default and limits; a key of the
    section(s) that no field declares is refused."""
    hints = get_type_hints(cls)
    values = dict(given)
    known: dict[str | None, set[str]] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        where = field.metadata.get("section")
        section = sections if isinstance(sections, Section) else sections[str(where)]
        known.setdefault(where, set()).add(file_key(field))
        if field.name not in given:
            values[field.name] = _read(section, file_key(field), hints[field.name], field)
    for where, keys in known.items():
        (sections if isinstance(sections, Section) else sections[str(where)]).reject_unknown(keys)
    return cls(**values)


def _read(section: Section, name: str, hint: Any, field: dataclasses.Field[Any]) -> Any:
    default, limits = field.default, field.metadata.get("limits", {})
    if default is dataclasses.MISSING:
        return section.required_string(name)
    if hint is bool:
        return section.boolean(name, default)
    if hint is int:
        return section.integer(name, default, limits.get("minimum"), limits.get("maximum"))
    if hint == int | None:
        return section.optional_integer(name, limits.get("minimum"), limits.get("maximum"))
    if hint is float:
        return section.number(name, default, limits["low"], limits["high"])
    if hint == float | None:  # a duration; None keeps for ever
        return section.duration(name, default)
    if hint is str and "choices" in limits:
        value = section.choice(name, default, limits["choices"])
        return value.lower() if default.islower() else value
    if hint is str:
        return section.string(name, default)
    if hint == str | None:
        return section.optional_string(name)
    if hint == tuple[str, ...]:
        return section.string_list(name)
    raise TypeError(f"{name}: no reader for {hint}; pass it to read_fields")
