"""The checks every typed config section shares, and ``Section``, the base of the frozen sections ``train``,
``train.mesh``, ``optim`` and ``lora`` (``ArchConfig`` uses the same checks). No jax.

A section is a frozen dataclass whose ``__post_init__`` checks each field, so a section that exists is valid;
``Section.of(config)`` makes one from a ``ConfigDict`` (or a mapping; an instance is returned as it is): unknown
fields are refused with the closest valid names, missing ones take their defaults. Every error is a
``ConfigError`` naming the field and the value (``train.steps=0 must be a positive integer``).
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import ClassVar

from layerscale_jax.errors import ConfigError, did_you_mean


def check_fields(section, known, prefix: str, owner: str = "") -> None:
    """Refuse fields of ``section`` (a mapping or ``ConfigDict``) not in ``known``, naming the closest valid ones."""
    unknown = sorted(set(section.keys()) - set(known))
    if unknown:
        listed = ", ".join(f"{prefix}{key}{did_you_mean(key, known)}" for key in unknown)
        raise ConfigError(f"unknown config field(s) {listed}; valid fields of "
                          f"{owner or prefix.rstrip('.') or 'a config'}: {', '.join(sorted(known))}")


def integer(name: str, value, minimum: int | None = None, *, also: tuple = (), note: str = "") -> int:
    """``value`` if it is an int (not a bool) ≥ ``minimum`` (or one of ``also``), else an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or (
            minimum is not None and value < minimum and value not in also):
        kind = {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer ≥ {minimum}")
        raise ConfigError(f"{name}={value!r} must be {kind}{note}")
    return value


def number(name: str, value, low: float = -math.inf, high: float = math.inf, *, low_open: bool = False,
           high_open: bool = False) -> float:
    """``value`` as a float if it is a finite number in the interval, else an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name}={value!r} must be a number")
    if not math.isfinite(value):
        raise ConfigError(f"{name}={value!r} must be a finite number")
    if (value <= low if low_open else value < low) or (value >= high if high_open else value > high):
        if high == math.inf:
            raise ConfigError(f"{name}={value!r} must be a finite number {'>' if low_open else '≥'} {low:g}")
        raise ConfigError(f"{name}={value!r} must lie in {'(' if low_open else '['}{low:g}, {high:g}"
                          f"{')' if high_open else ']'}")
    return float(value)


def choice(name: str, value, choices: tuple):
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {choices}")
    return value


def boolean(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} must be a bool")
    return value


def patterns(name: str, value) -> tuple[str, ...]:
    """A regex or a sequence of them as a tuple of strings (a single string is one regex)."""
    value = ((value,) if value else ()) if isinstance(value, str) else tuple(value or ())
    for pattern in value:
        if not isinstance(pattern, str):
            raise ConfigError(f"{name} entry {pattern!r} must be a regex string")
    return value


@dataclasses.dataclass(frozen=True)
class Section:
    """A frozen config section; subclasses name their ``PREFIX`` and check their fields in ``__post_init__``."""
    PREFIX: ClassVar[str] = ""

    @classmethod
    def of(cls, section):
        """The section of a ``ConfigDict`` or mapping (missing fields: the defaults); an instance as it is."""
        if isinstance(section, cls):
            return section
        names = [field.name for field in dataclasses.fields(cls)]
        check_fields(section, names, f"{cls.PREFIX}.")
        return cls(**{name: section[name] for name in names if name in section})

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)        # normalising a field of the frozen section while it is made

    def to_config(self):
        """The section as a ``ConfigDict`` (what config files start from: ``default_train_config()`` ...)."""
        import ml_collections
        return ml_collections.ConfigDict(dataclasses.asdict(self))
