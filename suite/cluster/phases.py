"""Every phase a run's rows may time, in one list (as MLCommons keeps its log keys).

A phase's seconds land in the ``t_<name>`` column of ``iterations.parquet``; the report draws
each phase in its colour and counts the communication phases as communication. Writers use
these constants, never a bare string, so a typo fails at import; a name given as a string that
is not listed fails at its first use (``known_phase``) instead of making a new grey column.
A plugin that times a phase of its own declares it with ``declare_phase``.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from suite.errors import BenchError

#: local mini-batch steps: forward, backward, optimizer (and PruneX's proximal step)
LOCAL_COMPUTE = "local_compute"
#: world all-reduce (DDP's buckets, flat consensus, flat local SGD, dense Top-K)
ALLREDUCE = "allreduce"
#: world all-gather (Top-K's values and indices)
ALLGATHER = "allgather"
#: all-reduce inside a node
INTRA_ALLREDUCE = "intra_allreduce"
#: all-gather inside a node (PruneX's sharded leaders)
INTRA_ALLGATHER = "intra_allgather"
#: all-reduce between nodes (leaders, or every local rank's shard)
INTER_ALLREDUCE = "inter_allreduce"
#: leader -> node broadcast
BROADCAST = "broadcast"
#: OR of the structured mask bitmaps across nodes, and their broadcast in the node
MASK_SYNC = "mask_sync"
#: the node candidate and its projection onto the structured set (or magnitude masks)
PROJECTION = "projection"
#: kept slices into dense buckets, and the casts to the wire dtype
PACK = "pack"
#: buckets back to full-shape tensors
UNPACK = "unpack"
#: PruneX's dual updates, residuals and penalty balancing
DUAL_UPDATE = "dual_update"
#: gradient compression (Top-K selection)
COMPRESS = "compress"
#: gradient decompression
DECOMPRESS = "decompress"
#: the simulator's expected wait for the slowest rank at a synchronization (idle, not
#: traffic: fig. 7 leaves it out)
STRAGGLER_WAIT = "straggler_wait"


@dataclass(frozen=True)
class Phase:
    name: str
    color: str  # in every figure (Tol's bright and muted sets)
    communication: bool  # counted as communication (fig. 7), drawn saturated


#: every phase the suite and its built-in methods time, in the order a round runs them
PHASES: dict[str, Phase] = {
    p.name: p
    for p in (
        Phase(LOCAL_COMPUTE, "#BBBBBB", False),
        Phase(COMPRESS, "#44AA99", False),
        Phase(ALLREDUCE, "#CC3311", True),
        Phase(ALLGATHER, "#882255", True),
        Phase(DECOMPRESS, "#117733", False),
        Phase(INTRA_ALLREDUCE, "#4477AA", True),
        Phase(PROJECTION, "#DDCC77", False),
        Phase(MASK_SYNC, "#AA3377", True),
        Phase(PACK, "#88CCEE", False),
        Phase(INTER_ALLREDUCE, "#EE6677", True),
        Phase(INTRA_ALLGATHER, "#66CCEE", True),
        Phase(BROADCAST, "#228833", True),
        Phase(UNPACK, "#332288", False),
        Phase(DUAL_UPDATE, "#999933", False),
        Phase(STRAGGLER_WAIT, "#DDDDDD", False),
    )
}
#: words that mark an undeclared phase as communication
COMMUNICATION_WORDS = ("allreduce", "allgather", "broadcast")
#: colour of a phase nobody declared (a row written by an older or foreign version)
UNKNOWN_COLOR = "#DDDDDD"
#: the least CIELAB distance (CIE76 Delta E*ab) between a declared phase's colour and the
#: colour of every phase known before it: about four times a just-noticeable difference, so
#: the two stay apart in a stacked bar (the closest built-in pair, pack and intra_allgather,
#: is 7.9 apart; the example plugin's grad_scale is 11.6 from projection)
MIN_COLOR_DISTANCE = 10.0


def declare_phase(name: str, color: str, *, communication: bool) -> str:
    """A plugin's own phase: its colour and whether it is communication. Declaring a
    built-in phase again with other facts is an error, and so is a colour matplotlib cannot
    draw or one closer than ``MIN_COLOR_DISTANCE`` (CIELAB) to a phase already known.

    Args:
        name: the phase's name (its seconds land in the ``t_<name>`` column).
        color: its colour in every figure.
        communication: counted as communication (fig. 7), drawn saturated.

    Returns:
        ``name``, to time the phase under.

    Examples:
        ```python
        SCALE = declare_phase("grad_scale", "#EECC66", communication=False)
        with ctx.recorder.phase(SCALE):
            ...
        ```
    """
    phase = Phase(name, color, communication)
    known = PHASES.get(name)
    if known is not None:
        if known != phase:
            raise ValueError(f"phase {name!r} is already declared as {known}")
        return name
    check_phase_color(name, color)
    PHASES[name] = phase
    return name


def check_phase_color(name: str, color: str) -> None:
    """One line unless ``color`` is a colour matplotlib draws and stands
    ``MIN_COLOR_DISTANCE`` apart from every known phase's colour in CIELAB."""
    # lazy: matplotlib.colors costs ~0.2 s to import; only this path needs it
    from matplotlib.colors import is_color_like

    if not is_color_like(color):
        raise BenchError(f"phase {name!r}: colour {color!r} is not a colour matplotlib knows "
                         "(e.g. '#117733', 'tab:olive')")
    mine = cielab(color)
    for other in PHASES.values():
        distance = math.dist(mine, cielab(other.color))
        if distance < MIN_COLOR_DISTANCE:
            raise BenchError(
                f"phase {name!r}: colour {color} is {distance:.1f} from {other.color} of phase "
                f"{other.name!r} in CIELAB (at least {MIN_COLOR_DISTANCE:g} keeps them apart "
                "in a figure); pick another colour"
            )


def cielab(color: str) -> tuple[float, float, float]:
    """``color`` in CIELAB (D65 white): sRGB decoded to linear light, then XYZ, then L*a*b*."""
    # lazy: matplotlib.colors costs ~0.2 s to import; only this path needs it
    from matplotlib.colors import to_rgb

    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(color)]
    r, g, b = linear
    xyz = (
        (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047,
        0.2126 * r + 0.7152 * g + 0.0722 * b,
        (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883,
    )
    fx, fy, fz = (t ** (1 / 3) if t > (6 / 29) ** 3 else t / (3 * (6 / 29) ** 2) + 4 / 29
                  for t in xyz)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def known_phase(name: str) -> str:
    """``name`` if it is a built-in or declared phase, else a one-line error naming the
    closest known one (a typo would otherwise make a new, uncounted column)."""
    if name in PHASES:
        return name

    close = difflib.get_close_matches(name, PHASES, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise BenchError(f"unknown phase {name!r}{hint} (a plugin declares its own with "
                     "suite.api.declare_phase(name, colour, communication=...))")


def phase_color(name: str) -> str:
    phase = PHASES.get(name)
    return phase.color if phase is not None else UNKNOWN_COLOR


def is_communication(name: str) -> bool:
    """Communication phases; an undeclared one counts when its name says it moves data."""
    phase = PHASES.get(name)
    if phase is not None:
        return phase.communication
    return any(word in name for word in COMMUNICATION_WORDS)
