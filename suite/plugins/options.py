"""Method options, declared once by the method that reads them.

A method registers a *settings* dataclass next to its factory (as torch's ``PowerSGDState``
owns the PowerSGD hook's settings). Each field made with ``option`` is one option: its
type comes from the annotation (``Literal[...]`` gives choices), its default from the field,
its range and one line of help from the call. The command line, sweeps, experiment files,
``bench list`` and the README table all read these declarations, and ``resolve_settings``
is the one place where values given by a user are converted and checked, before any rank
starts and again, identically, inside each rank.

Cross-field rules (``--channel-keep`` is the default only when no keep is given, say) live in
the settings class's ``__post_init__``, which raises ``BenchError`` naming the flags.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from suite.config import flag_of
from suite.errors import BenchError

__all__ = [
    "AT_LEAST_1",
    "FRACTION",
    "POSITIVE",
    "Check",
    "Option",
    "at_least",
    "check_default",
    "check_value",
    "option",
    "options_of",
    "resolve_settings",
    "settings_dict",
]

_META = "prunex_bench_option"


@dataclass(frozen=True)
class Check:
    """A range test with the words that describe it in an error ("in (0, 1]").

    Args:
        test: ``value -> bool``, True for a valid value.
        text: what a valid value is, as an error says it.

    Examples:
        ```python
        UNIT = Check(lambda v: 0 <= v <= 1, "in [0, 1]")
        prune_at: float = option(0.5, "fraction trained dense first", check=UNIT)
        ```
    """

    test: Callable[[Any], bool]
    text: str


FRACTION = Check(lambda v: 0 < v <= 1, "in (0, 1]")
"""A keep or a fraction: in (0, 1]."""
POSITIVE = Check(lambda v: v > 0, "positive")
"""A rate, a size, a penalty: greater than 0."""
AT_LEAST_1 = Check(lambda v: v >= 1, "at least 1")
"""A count: at least 1."""


def at_least(n: int) -> Check:
    """A count of at least ``n``.

    Args:
        n: the smallest valid value.

    Returns:
        The check (``--start-powersgd-iter`` uses ``at_least(2)``).
    """
    return Check(lambda v: v >= n, f"at least {n}")


def check_value(flag: str, value: Any, check: Check | None) -> None:
    """One-line error unless ``value`` is finite (if a float) and passes ``check``."""
    if isinstance(value, float) and not math.isfinite(value):
        raise BenchError(f"{flag} must be finite, got {value}")
    if check is not None and not check.test(value):
        raise BenchError(f"{flag} must be {check.text}, got {value}")


@dataclass(frozen=True)
class _Declared:
    help: str
    check: Check | None
    off_flag: str | None
    shown_default: str | None
    existing_path: bool


def option(
    default: Any,
    help: str,
    *,
    check: Check | None = None,
    off_flag: str | None = None,
    shown_default: str | None = None,
    existing_path: bool = False,
) -> Any:
    """A settings field that is a user-facing option: a flag, an experiment-file key and a
    sweep axis. Its type is the field's annotation (``bool``, ``int``, ``float``, ``str``,
    ``X | None``, or ``Literal["a", "b"]`` for a choice).

    Args:
        default: the value when the option is not given (checked at registration).
        help: one line for ``--help``, ``bench list`` and the options table.
        check: its range (``POSITIVE``, ``FRACTION``, ...).
        off_flag: for booleans, the flag that sets False (``fixed-rho`` beside
            ``--adaptive-rho``).
        shown_default: how to describe a default computed at run time (``None`` in the
            field).
        existing_path: the value names a file or folder that must exist.

    Returns:
        A dataclass field carrying the declaration.

    Examples:
        ```python
        @dataclass
        class EFSignSettings:
            gain: float = option(1.0, "scale of the sign update", check=POSITIVE)
            scaled: bool = option(True, "scale by the mean magnitude", off_flag="unscaled")
            mode: Literal["layer", "model"] = option("layer", "where the scale is taken")
        ```
    """
    meta = _Declared(help, check, off_flag, shown_default, existing_path)
    return dataclasses.field(default=default, metadata={_META: meta})


@dataclass(frozen=True)
class Option:
    """One option as every front end sees it: a flag, a config-file key, a sweep axis."""

    name: str  # the key in RunConfig.options and in experiment files: channel_keep
    kind: type  # bool, int, float or str
    choices: tuple[str, ...] | None
    default: Any
    help: str
    check: Check | None = None
    off_flag: str | None = None
    shown_default: str | None = None
    existing_path: bool = False

    @property
    def flag(self) -> str:
        return flag_of(self.name)

    @property
    def signature(self) -> tuple:
        """What must agree where two methods declare the same flag."""
        return (self.kind, self.choices, self.default, self.help, self.off_flag,
                self.shown_default, self.check.text if self.check else None)

    def describe(self) -> str:
        return f"{self.type_text}, default {self.default_text}: {self.help!r}"

    @property
    def flags(self) -> tuple[str, ...]:
        """Every flag it takes on the command line: ``--adaptive-rho``, ``--fixed-rho``."""
        return (self.flag, f"--{self.off_flag}") if self.off_flag else (self.flag,)

    @property
    def declaration(self) -> str:
        """The click declaration: ``--channel-keep``, or ``--adaptive-rho/--fixed-rho``."""
        return f"{self.flag}/--{self.off_flag}" if self.off_flag else self.flag

    @property
    def default_text(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        if self.default is None:
            return "off"
        if self.kind is bool:
            return self.flag if self.default else f"--{self.off_flag}"
        return str(self.default)

    @property
    def type_text(self) -> str:
        if self.choices:
            return "|".join(self.choices)
        if self.existing_path:
            return "PATH"
        return {bool: "flag", int: "INT", float: "FLOAT", str: "TEXT"}[self.kind]

    def convert(self, value: Any) -> Any:
        """``value`` (from a flag, a YAML file or a manifest) as this option's type, checked."""
        if value is None:
            return None
        try:
            if self.kind is bool:
                converted = _as_bool(value)
            elif self.kind is int:
                if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                    raise ValueError
                converted = int(value)
            elif self.kind is float:
                if isinstance(value, bool):
                    raise ValueError
                converted = float(value)
            else:
                converted = str(value)
        except (TypeError, ValueError):
            raise BenchError(f"{self.flag} takes {self.type_text}, got {value!r}") from None
        if self.choices and converted not in self.choices:
            raise BenchError(
                f"{self.flag} must be one of {', '.join(self.choices)}, got {converted!r}"
            )
        check_value(self.flag, converted, self.check)
        if self.existing_path and not Path(converted).exists():
            raise BenchError(f"{self.flag} {converted}: no such file or folder")
        return converted


#: declared type -> the Python types its default may have (an int is a float's default too)
_DEFAULT_TYPES = {bool: (bool,), int: (int,), float: (float, int), str: (str,)}


def check_default(opt: Option, where: str) -> None:
    """A declared default has the option's type, is one of its choices, and passes its
    check, in that order, each a one-line error naming ``where`` (``method 'qsgd'``) and the
    option: a string default of an int option is a mistake, not a value to convert, and a
    range test must never see a value of another type."""
    value = opt.default
    if value is None:
        return
    wanted = _DEFAULT_TYPES[opt.kind]
    if not isinstance(value, wanted) or (opt.kind is not bool and isinstance(value, bool)):
        raise BenchError(
            f"{where}: the default of {opt.flag} is {value!r} ({type(value).__name__}), but "
            f"the option is declared {opt.type_text}; give a default of that type"
        )
    if opt.choices and value not in opt.choices:
        raise BenchError(f"{where}: the default of {opt.flag} is invalid ({opt.flag} must be "
                         f"one of {', '.join(opt.choices)}, got {value!r})")
    try:
        check_value(opt.flag, value, opt.check)
    except BenchError as exc:
        raise BenchError(f"{where}: the default of {opt.flag} is invalid ({exc})") from None
    except Exception as exc:  # a check that cannot take its own default
        raise BenchError(f"{where}: the check of {opt.flag} ({opt.check.text}) fails on its "
                         f"default {value!r}: {type(exc).__name__}: {exc}") from None


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


def options_of(settings: type | None) -> list[Option]:
    """The options a settings dataclass declares, in field order (inherited ones first); a
    field without ``option`` is an error (it would be dropped without a word)."""
    if settings is None:
        return []
    if not dataclasses.is_dataclass(settings):
        raise BenchError(f"settings {settings!r} is not a dataclass of option(...) fields")
    hints = typing.get_type_hints(settings)
    found = []
    for field in dataclasses.fields(settings):
        meta = field.metadata.get(_META)
        if meta is None:
            raise BenchError(
                f"{settings.__name__}.{field.name} is a settings field without option(...): "
                "every field of a method's settings is a user-facing option; declare it with "
                "suite.api.option(default, help)"
            )
        kind, choices = _kind(hints[field.name], f"{settings.__name__}.{field.name}")
        if kind is bool and meta.off_flag is None:
            raise BenchError(f"{settings.__name__}.{field.name}: a bool option needs an off_flag")
        found.append(
            Option(
                field.name,
                kind,
                choices,
                field.default,
                meta.help,
                meta.check,
                meta.off_flag,
                meta.shown_default,
                meta.existing_path,
            )
        )
    return found


def _kind(annotation: Any, where: str) -> tuple[type, tuple[str, ...] | None]:
    """``float | None`` -> (float, None); ``Literal["a", "b"]`` -> (str, ("a", "b"))."""
    if typing.get_origin(annotation) is Literal:
        return str, tuple(str(a) for a in typing.get_args(annotation))
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if args:  # Optional[X] / X | None
        if len(args) != 1:
            raise BenchError(f"{where}: an option has one type, got {annotation}")
        return _kind(args[0], where)
    if annotation in (bool, int, float, str):
        return annotation, None
    raise BenchError(f"{where}: option type must be bool, int, float, str or Literal")


def resolve_settings(settings: type | None, given: dict, method: str) -> Any:
    """The method's settings object from the options a user gave (``{"rho1": 0.01}``):
    every value converted and range-checked, unknown names refused with one line."""
    if settings is None:
        if given:
            raise BenchError(f"{method} has no options; got {_flags(given)}")
        return None
    declared = {o.name: o for o in options_of(settings)}
    unknown = [name for name in given if name not in declared]
    if unknown:
        known = ", ".join(o.flag for o in declared.values()) or "none"
        raise BenchError(f"{_flags(unknown)} is not an option of {method} (its options: {known})")
    values = {name: declared[name].convert(value) for name, value in given.items()}
    return settings(**{k: v for k, v in values.items() if v is not None})


def settings_dict(settings: Any) -> dict:
    """Every option's value, defaults included (the manifest's ``method_settings``)."""
    if settings is None:
        return {}
    return {o.name: getattr(settings, o.name) for o in options_of(type(settings))}


def _flags(names) -> str:
    return ", ".join(flag_of(n) for n in names)
