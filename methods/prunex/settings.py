"""PruneX's options, with their defaults and ranges (the one place they are written).

Which to tune: the keep fractions set the structure (and so the inter-node bytes); rho1/rho2
set how hard local models are pulled to their node's and the global consensus; the freeze
options decide when the masks stop changing and the packing buffers become fixed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from methods.prunex.penalties import DEFAULT_ROUND_PULL
from suite.api import (
    AT_LEAST_1,
    FRACTION,
    POSITIVE,
    Check,
    NodeAveragingSettings,
    PackingSettings,
    RoundSettings,
    StructuredKeepSettings,
    option,
)


@dataclass
class PruneXFlatSettings(RoundSettings, NodeAveragingSettings, StructuredKeepSettings):
    """Options shared by ``prunex`` and its flat-consensus ablation ``prunex-flat``."""

    rho1: float | None = option(
        None,
        "initial intra-node penalty, absolute (paper sec. 5.1.5: 1.5e-3)",
        check=POSITIVE,
        shown_default="from --round-pull",
    )
    round_pull: float = option(
        DEFAULT_ROUND_PULL,
        "fraction of theta's distance to its anchor that one round of local SGD closes; "
        "sets rho1 from the recipe's lr and H",
        check=Check(lambda v: 0 < v < 1, "in (0, 1)"),
    )
    penalties: Literal["pull", "paper"] = option(
        "pull",
        "initial rho1, rho2 not given absolutely: pull: rho1 from --round-pull, rho2 = rho1/10; "
        "paper: the paper's 1.5e-3 and 1.5e-4",
    )
    rho_max: float = option(10.0, "cap on the adaptive penalties", check=POSITIVE)
    adaptive_rho: bool = option(
        True, "residual balancing of the penalties (Boyd et al. 3.4.1)", off_flag="fixed-rho"
    )
    freeze_round: int | None = option(None, "freeze the masks after this round", check=AT_LEAST_1)
    freeze_epoch: float | None = option(
        None,
        "freeze the masks at the end of the round in which a rank has consumed this many "
        "epochs of its shard (the paper's T_freeze)",
        check=POSITIVE,
    )
    freeze_patience: int = option(
        3, "freeze the masks after N consecutive unchanged rounds", check=AT_LEAST_1
    )
    freeze_share: float = option(
        0.25,
        "freeze the masks at the latest at the end of the round that reaches this share of "
        "the run's local steps, so the masked consensus trains on its support for the rest "
        "(1: only the other rules; a consensus evaluated before it ever trained masked is "
        "near chance on fragile models, benchmarks/measured/models.md; 0.25 rather than 0.5 "
        "gained 0.7-3.2 points at keep 0.5 on six families, benchmarks/measured/families.md)",
        check=FRACTION,
    )
    after_freeze: Literal["admm", "sgd"] = option(
        "sgd",
        "sgd: sec. 4.5's prose, standard local SGD on the fixed support with the same packed "
        "exchange, no proximal term, no duals, the recipe's weight decay (the default: 2.4-2.7 "
        "points above admm at the same bytes, benchmarks/measured/frontier.md); admm: "
        "Algorithm 1 after the freeze (masked z_i, proximal pull, duals, rho balancing)",
    )
    freeze_start: Literal["better", "ranks", "consensus"] = option(
        "better",
        "where the ranks continue from at the freeze (--after-freeze sgd): ranks: each its own "
        "theta (its node's mean with node averaging) on the frozen support; consensus: the "
        "global z (theta := z); better: z if its loss on the calibration batches (z's BN "
        "statistics estimated on z) is not above the ranks' own, else the ranks' theta",
    )
    consensus_bn: Literal["estimated", "averaged"] = option(
        "estimated",
        "BatchNorm statistics of the evaluated and exported consensus z: estimated: on z "
        "itself, over 8 fixed batches of each rank's shard, averaged over the ranks (the "
        "ranks' statistics describe their own models, not z, and are far off where models "
        "drift apart across many BN layers, e.g. MobileNetV3); averaged: the ranks' running "
        "statistics averaged each round",
    )
    eps_abs: float | None = option(
        None, "stop once Boyd's residual tests pass with this absolute tolerance", check=POSITIVE
    )
    eps_rel: float = option(1e-3, "relative residual tolerance of that test", check=POSITIVE)


@dataclass
class PruneXSettings(PruneXFlatSettings, PackingSettings):
    """Hierarchical PruneX adds the inter-node level: its penalty and how leaders talk."""

    rho2: float | None = option(
        None,
        "initial inter-node penalty, absolute (paper sec. 5.1.5: 1.5e-4)",
        check=POSITIVE,
        shown_default="rho1 / 10, the paper's ratio",
    )
    leader_mode: Literal["single", "sharded"] = option(
        "single",
        "single: one leader per node carries the inter-node all-reduce; sharded: every local "
        "rank all-reduces 1/P of the packed buckets with its peers (Horovod-style)",
    )
    wire_dtype: Literal["fp32", "bf16"] = option(
        "fp32", "dtype of the packed inter-node buffers (fp32 math on both ends)"
    )
