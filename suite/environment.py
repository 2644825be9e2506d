"""The environment variables the suite reads, each read through one typed reader that names
the variable and what it takes when its value is not that: a malformed ``WORLD_SIZE`` or
``PRUNEX_FLUSH_SECONDS`` is one line and exit 2 when ``bench`` starts
(``check_environment``), not a traceback inside a rank.
"""

from __future__ import annotations

import os

from suite.errors import BenchError

#: words a flag variable takes, and what they mean
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")


def _value(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None else value.strip()


def env_int(name: str, default: int, *, minimum: int | None = None,
            maximum: int | None = None) -> int:
    """``name`` as an integer (``default`` where unset).

    Raises:
        BenchError: it is not an integer in [minimum, maximum].
    """
    text = _value(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or (minimum is not None and value < minimum) or (
            maximum is not None and value > maximum):
        bounds = describe_bounds(minimum, maximum)
        raise BenchError(f"environment variable {name}={text!r} must be an integer{bounds}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None,
              positive: bool = False, maximum: float | None = None) -> float:
    """``name`` as a number (``default`` where unset).

    Raises:
        BenchError: it is not a finite number at least ``minimum`` (above 0 if ``positive``)
            and at most ``maximum``.
    """
    text = _value(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    bad = value != value or value in (float("inf"), float("-inf")) or (
        minimum is not None and value < minimum) or (positive and value <= 0) or (
        maximum is not None and value > maximum)
    if bad:
        bounds = (f" above 0{describe_bounds(None, maximum).replace(' of', ' and')}"
                  if positive else describe_bounds(minimum, maximum))
        raise BenchError(f"environment variable {name}={text!r} must be a number{bounds}")
    return value


def env_flag(name: str, default: bool = False) -> bool:
    """``name`` as a yes/no (unset: ``default``).

    Raises:
        BenchError: it is none of ``TRUE_WORDS`` and ``FALSE_WORDS``.
    """
    text = (_value(name) or "").lower()
    if name not in os.environ:
        return default
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise BenchError(f"environment variable {name}={os.environ[name]!r} must be 1 or 0 (also: "
                     f"{'/'.join(TRUE_WORDS[1:])} or {'/'.join(FALSE_WORDS[1:-1])})")


def describe_bounds(minimum, maximum) -> str:
    if minimum is not None and maximum is not None:
        return f" in [{minimum}, {maximum}]"
    if minimum is not None:
        return f" of at least {minimum}"
    return f" of at most {maximum}" if maximum is not None else ""


#: the integer variables a run reads: the suite's own, torchrun's and SLURM's, with their least
INTEGERS = {
    "PRUNEX_STOP_AFTER_ITERATION": 0, "RANK": 0, "WORLD_SIZE": 1, "LOCAL_RANK": 0,
    "LOCAL_WORLD_SIZE": 1, "TORCHELASTIC_RESTART_COUNT": 0, "SLURM_JOB_NUM_NODES": 1,
    "SLURM_NTASKS": 1, "SLURM_NTASKS_PER_NODE": 1, "SLURM_PROCID": 0, "SLURM_NODEID": 0,
    "SLURM_LOCALID": 0, "SLURM_RESTART_COUNT": 0, "OMP_NUM_THREADS": 1,
}
#: the number variables: (default, least, whether it must be above the least, most)
NUMBERS = {
    # seconds between a rank's row flushes (a day at most: a run's rows reach disk while it goes)
    "PRUNEX_FLUSH_SECONDS": (5.0, 0.0, False, 86_400.0),
    # seconds of training between the ranks' agreements (an hour at most)
    "PRUNEX_AGREE_SECONDS": (1.0, 0.0, True, 3_600.0),
    # bytes per second the simulator scales host-timed phases by (a petabyte/s at most)
    "PRUNEX_HOST_MEMORY_BANDWIDTH": (0.0, 0.0, True, 1e15),
}
FLAGS = ("PRUNEX_STRICT_PLUGINS", "PRUNEX_PROGRESS", "PRUNEX_STRICT_DETERMINISM")


def number(name: str) -> float:
    """A variable of ``NUMBERS``, read now (never at import: ``bench`` checks every variable
    before a module reads one, and a test may set it after importing)."""
    default, least, above, most = NUMBERS[name]
    return env_float(name, default, minimum=least, positive=above, maximum=most)


def check_environment() -> None:
    """Every variable above that is set, read once, and the process-group variables together:
    the first malformed one is one line.

    Raises:
        BenchError: naming the variable, its value and what it takes.
    """
    for name, least in INTEGERS.items():
        env_int(name, least, minimum=least)
    env_int("MASTER_PORT", 29500, minimum=1, maximum=65535)
    for name in NUMBERS:
        number(name)
    for name in FLAGS:
        env_flag(name)
    check_process_group_variables()


def check_process_group_variables() -> None:
    """torchrun's variables as one process group would read them: a rank inside its world,
    and an address to meet at (without one, the ranks wait 30 s and fail deep in torch).

    Raises:
        BenchError: naming the variables that disagree.
    """
    if _value("RANK") is None or _value("WORLD_SIZE") is None:
        return
    rank, world = env_int("RANK", 0, minimum=0), env_int("WORLD_SIZE", 1, minimum=1)
    if rank >= world:
        raise BenchError(f"environment variables RANK={rank} and WORLD_SIZE={world}: a rank "
                         f"is one of 0..{world - 1}")
    local = _value("LOCAL_RANK")
    local_world = _value("LOCAL_WORLD_SIZE")
    if local and local_world and env_int("LOCAL_RANK", 0, minimum=0) >= env_int(
            "LOCAL_WORLD_SIZE", 1, minimum=1):
        raise BenchError(f"environment variables LOCAL_RANK={local} and LOCAL_WORLD_SIZE="
                         f"{local_world}: a local rank is one of 0..{int(local_world) - 1}")
    if "SLURM_PROCID" in os.environ:
        return  # a SLURM step: the address is taken from the job (suite.launchers.local)
    if not _value("MASTER_ADDR"):
        state = "is empty" if "MASTER_ADDR" in os.environ else "is not set"
        raise BenchError(f"environment variable RANK is set (a torchrun job) and MASTER_ADDR "
                         f"{state}: set MASTER_ADDR to rank 0's host (and MASTER_PORT), or "
                         "unset RANK and WORLD_SIZE to run locally")
