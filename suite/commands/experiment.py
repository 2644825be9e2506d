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
import reprlib
from pathlib import Path

from suite.errors import BenchError
from suite.results import schema
from suite.results.folder import MANIFEST
from suite.results.records import DamagedFile, Manifest, read_text, validate
from suite.sim.profile import shipped_profiles

#: manifest config keys that record what happened rather than what was asked
_RECORDED_ONLY = (schema.RUN_ID, "resume", "overwrite")


def unique_key_loader():
    """yaml's SafeLoader that refuses a key given twice in one mapping (plain YAML keeps the
    last silently: ``method: prunex`` then ``method: ddp`` would run DDP)."""
    # lazy: yaml costs ~0.1 s to import; only experiment files need it
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    mark = key_node.start_mark
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice", mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeys


def read_experiment(path: str | Path) -> dict:
    """The file's settings as ``{flag key: value}`` (underscored keys, options flattened).

    Raises:
        BenchError: one line naming the file and, for a YAML error, its line and column: the
            file is unreadable, not text, not YAML, not a mapping, or gives a key twice.
    """
    file = Path(path)
    if file.is_dir():
        file = file / MANIFEST
    data = _load_yaml(file, path)
    if not isinstance(data, dict):
        raise BenchError(f"--config {path}: expected a mapping of flag names to values")
    if isinstance(data.get(schema.CONFIG), dict):  # a run folder's manifest
        data = _from_manifest(data, path)
    elif file.name == MANIFEST:
        raise BenchError(f"--config {path}: a run's manifest without its {schema.CONFIG} (the "
                         "run's configuration): damaged, not an experiment")
    return _flatten(data, path)


def _load_yaml(file: Path, path: str | Path):
    """The YAML in ``file``, each way it can fail turned into one line naming ``path`` (as
    the user gave it) rather than a traceback.

    Raises:
        BenchError: the file is unreadable, not text, or not valid YAML (with its line and
            column where yaml knows them).
    """
    # lazy: yaml costs ~0.1 s to import; only this path needs it
    import yaml

    try:
        text = read_text(file, what="experiment file", limit=MAX_EXPERIMENT_BYTES)
        data = yaml.load(text, Loader=unique_key_loader())  # a SafeLoader
    except FileNotFoundError as exc:
        raise BenchError(f"--config {path}: cannot read it ({exc.strerror})") from None
    except DamagedFile as exc:
        problem = ("not a text file (an experiment file is YAML or a run's manifest.json)"
                   if exc.problem.startswith("not text") else exc.problem)
        raise BenchError(f"--config {path}: {problem}") from None
    except RecursionError:
        raise BenchError(f"--config {path}: nested too deeply to be an experiment") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise BenchError(f"--config {path}: not valid YAML{where} ({what})") from None
    if expanded_size(data) > MAX_EXPERIMENT_VALUES:
        raise BenchError(f"--config {path}: expands to more than {MAX_EXPERIMENT_VALUES} "
                         "values (YAML aliases repeating aliases): not an experiment")
    return data


#: an experiment file's largest size, and the most values it may expand to: a sweep of a few
#: hundred cells is far below both; YAML aliases of aliases ("billion laughs") are not
MAX_EXPERIMENT_BYTES = 1 << 20
MAX_EXPERIMENT_VALUES = 100_000


def expanded_size(data) -> int:
    """How many values ``data`` holds once its YAML aliases are expanded, counted over its
    distinct objects (an alias is the same object again), so a bomb is measured without
    expanding it."""
    sizes: dict[int, int] = {}

    def size(value) -> int:
        if not isinstance(value, (list, dict)):
            return 1
        if id(value) not in sizes:
            sizes[id(value)] = 0  # a cycle (a recursive alias) counts once
            children = value.values() if isinstance(value, dict) else value
            sizes[id(value)] = 1 + sum(size(child) for child in children)
        return sizes[id(value)]

    try:
        return size(data)
    except RecursionError:
        return MAX_EXPERIMENT_VALUES + 1


def _flatten(data: dict, path: str | Path) -> dict:
    """The file's mapping as flag keys: underscored, ``options:`` merged into the top level
    (a key may not be in both), ``model`` read as ``workload``, and unset (null) keys dropped,
    so the flag's own default stands.

    Raises:
        BenchError: ``options`` is not a mapping, or names a key also given at the top.
    """
    flat: dict = {}
    for key, value in data.items():
        if str(key).replace("-", "_") == "options":
            if not isinstance(value, dict):
                raise BenchError(f"--config {path}: 'options' must be a mapping")
            if any(_key(k) in flat for k in value):  # also under its own name
                twice = next(_key(k) for k in value if _key(k) in flat)
                raise BenchError(f"--config {path}: {twice!r} given twice (at the top and "
                                 "under options)")
            flat.update({_key(k): v for k, v in value.items()})
        else:
            name = _key(key)
            flat["workload" if name == "model" else name] = value  # --model is --workload
    return {k: v for k, v in flat.items() if v is not None}


def _truthy(value) -> bool:
    return value is True or str(value).strip().lower() in ("1", "true", "yes", "on")


def _key(name) -> str:
    return str(name).strip().lstrip("-").replace("-", "_")


def _from_manifest(manifest: dict, path) -> dict:
    try:  # a run folder's manifest is a run's record: every field of its kind
        validate(manifest, Manifest, where=f"--config {path}")
    except DamagedFile as exc:
        raise BenchError(str(exc)) from None
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


def apply_to_command(ctx, values: dict, list_keys: tuple[str, ...] = (),
                     source: str = "--config") -> None:
    """Make ``values`` the defaults of the click command ``ctx`` (flags still override).

    ``list_keys``: parameters that take comma lists (sweeps), where a YAML list is joined;
    any other parameter refuses a list. ``source``: how errors name the file
    (``--config run.yaml``); each value is converted by its flag's type here, so a wrong one
    names the file and the key, not only the flag.
    """
    params = {p.name: p for p in ctx.command.params if p.name and p.name != "config"}
    values = _resolve_off_flags(params, values, source)
    _refuse_unknown(values, params, source)
    defaults = _checked_defaults(ctx, params, values, list_keys, source)
    ctx.default_map = {**(ctx.default_map or {}), **defaults}


def _resolve_off_flags(params: dict, values: dict, source: str) -> dict:
    """``values`` with each off flag given as a key (``fixed-rho: true``) turned into its
    parameter's value (``adaptive_rho: False``), so the file may use either flag's name;
    ``values`` itself is left as it was (a new dict is made where one is found).

    Raises:
        BenchError: an off flag is given a list.
    """
    for param in params.values():  # an off flag as a key: ``fixed-rho: true``
        for off in getattr(param, "secondary_opts", []):
            off_key = _key(off)
            if off_key in values:
                if isinstance(values[off_key], list):
                    raise BenchError(f"{source}: {off_key} takes one value (true or false)")
                values = {**values, param.name: not _truthy(values[off_key])}
                del values[off_key]
    return values


def _refuse_unknown(values: dict, params: dict, source: str) -> None:
    """Refuse keys that are no flag of the command, naming them all and suggesting the
    closest flag to the first (a typo in a file would otherwise be silently ignored).

    Raises:
        BenchError: a key is not one of ``params``.
    """
    unknown = sorted(k for k in values if k not in params)
    if unknown:
        close = difflib.get_close_matches(unknown[0], params, n=1)
        hint = (f"did you mean {close[0]!r}?" if close else
                "keys are bench run's flags with '_' for '-' (bench run --help)")
        raise BenchError(f"{source}: unknown key {', '.join(map(repr, unknown))}; {hint}")


def _checked_defaults(ctx, params: dict, values: dict, list_keys: tuple[str, ...],
                      source: str) -> dict:
    """``values`` as click defaults: a list joined with commas where the flag takes a comma
    list, and each value converted by its flag's type now (the result is discarded), so a bad
    one names the file and key rather than only the flag.

    Raises:
        BenchError: a list for a one-value flag, or a value its flag's type refuses.
    """
    # lazy: click is the command line's; only this path needs it here
    import click

    defaults = {}
    for key, value in values.items():
        if isinstance(value, list):
            if key not in list_keys:
                raise BenchError(f"{source}: {key} takes one value, got the list "
                                 f"{reprlib.repr(value)}")
            value = ",".join(str(v) for v in value)
        param = params[key]
        try:
            if not (isinstance(value, str) and getattr(param, "multiple", False)):
                param.type.convert(value, param, ctx)
        except click.BadParameter as exc:
            raise BenchError(f"{source}: {key}: {exc.format_message()}") from None
        defaults[key] = value
    return defaults
