"""Experiment files: a run or a sweep written down, and read back as command-line defaults.

A file (YAML; JSON is YAML too) maps the same keys as the flags, with dashes or underscores
(``channel-keep: 0.3``, ``lr: 0.1``); method options may also sit under ``options:``. Flags
given on the command line override the file. A sweep file may give lists (``method: [prunex,
ddp]``, ``workload: [...]``, ``seed: [0, 1, 2]``, ``channel_keep: [0.3, 0.5]``).

A run folder's ``manifest.json`` is itself an experiment file: its ``config`` is read, less
the recorded run id (a run of it again gets a new folder) and with the launcher chosen anew
(``auto``) where it was resolved from the environment or was a SLURM job's.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from suite.errors import BenchError
from suite.results import schema
from suite.results.folder import MANIFEST
from suite.sim.profile import shipped_profiles

#: manifest config keys that record what happened rather than what was asked
_RECORDED_ONLY = (schema.RUN_ID, "resume", "overwrite")


def read_experiment(path: str | Path) -> dict:
    """The file's settings as ``{flag key: value}`` (underscored keys, options flattened)."""
    # lazy: yaml costs ~0.1 s to import; only this path needs it
    import yaml

    file = Path(path)
    if file.is_dir():
        file = file / MANIFEST
    try:
        data = yaml.safe_load(file.read_text())
    except OSError as exc:
        raise BenchError(f"--config {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise BenchError(f"--config {path}: not valid YAML ({first})") from None
    if not isinstance(data, dict):
        raise BenchError(f"--config {path}: expected a mapping of flag names to values")
    if isinstance(data.get(schema.CONFIG), dict):  # a run folder's manifest
        data = _from_manifest(data, path)
    flat: dict = {}
    for key, value in data.items():
        if str(key).replace("-", "_") == "options":
            if not isinstance(value, dict):
                raise BenchError(f"--config {path}: 'options' must be a mapping")
            flat.update({_key(k): v for k, v in value.items()})
        else:
            flat[_key(key)] = value
    return {k: v for k, v in flat.items() if v is not None}


def _truthy(value) -> bool:
    return value is True or str(value).strip().lower() in ("1", "true", "yes", "on")


def _key(name) -> str:
    return str(name).strip().lstrip("-").replace("-", "_")


def _from_manifest(manifest: dict, path) -> dict:
    config = {k: v for k, v in manifest[schema.CONFIG].items() if k not in _RECORDED_ONLY}
    if config.get(schema.LAUNCHER) in ("local", "torchrun", "slurm"):
        config[schema.LAUNCHER] = "auto"
    if manifest.get(schema.SIMULATED):
        simulation = manifest.get(schema.SIMULATION, {})
        name = simulation.get(schema.PROFILE, {}).get(schema.PROFILE_NAME)
        if name not in shipped_profiles():
            raise BenchError(
                f"--config {path}: simulated on profile {name!r}, which is not shipped; "
                "give its JSON file with --profile"
            )
        config[schema.PROFILE] = name
        config["replay"] = simulation.get(schema.REPLAYED_ITERATIONS)
    return config


def apply_to_command(ctx, values: dict, list_keys: tuple[str, ...] = ()) -> None:
    """Make ``values`` the defaults of the click command ``ctx`` (flags still override).

    ``list_keys``: parameters that take comma lists (sweeps), where a YAML list is joined;
    any other parameter refuses a list.
    """
    params = {p.name: p for p in ctx.command.params if p.name and p.name != "config"}
    for param in params.values():  # an off flag as a key: ``fixed-rho: true``
        for off in getattr(param, "secondary_opts", []):
            off_key = _key(off)
            if off_key in values:
                if isinstance(values[off_key], list):
                    raise BenchError(f"--config: {off_key} takes one value (true or false)")
                values = {**values, param.name: not _truthy(values[off_key])}
                del values[off_key]
    unknown = sorted(k for k in values if k not in params)
    if unknown:
        close = difflib.get_close_matches(unknown[0], params, n=1)
        hint = (f"did you mean {close[0]!r}?" if close else
                "keys are bench run's flags with '_' for '-' (bench run --help)")
        raise BenchError(f"--config: unknown key {', '.join(map(repr, unknown))}; {hint}")
    defaults = {}
    for key, value in values.items():
        if isinstance(value, list):
            if key not in list_keys:
                raise BenchError(f"--config: {key} takes one value, got the list {value}")
            value = ",".join(str(v) for v in value)
        defaults[key] = value
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
