"""PruneX's options, with their defaults and ranges (the one place they are written).

Which to tune: the keep fractions set the structure (and so the inter-node bytes); rho1/rho2
set how hard local models are pulled to their node's and the global consensus; the freeze
options decide when the masks stop changing and the packing buffers become fixed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from suite.method import RoundSettings
from suite.options import AT_LEAST_1, FRACTION, POSITIVE, option

DEFAULT_CHANNEL_KEEP = 0.5  # paper sec. 5.1.5


@dataclass
class PruneXFlatSettings(RoundSettings):
    """Options shared by ``prunex`` and its flat-consensus ablation ``prunex-flat``."""

    filter_keep: float | None = option(
        None, "fraction of output filters kept per conv", check=FRACTION
    )
    channel_keep: float | None = option(
        None,
        "fraction of input channels kept per conv",
        check=FRACTION,
        shown_default=f"{DEFAULT_CHANNEL_KEEP} when no keep is given",
    )
    shape_keep: float | None = option(
        None, "fraction of kernel positions kept per conv", check=FRACTION
    )
    rho1: float = option(1.5e-3, "initial intra-node penalty (paper sec. 5.1.5)", check=POSITIVE)
    rho_max: float = option(10.0, "cap on the adaptive penalties", check=POSITIVE)
    adaptive_rho: bool = option(
        True, "residual balancing of the penalties (Boyd et al. 3.4.1)", off_flag="fixed-rho"
    )
    freeze_round: int | None = option(None, "freeze the masks after this round", check=AT_LEAST_1)
    freeze_patience: int = option(
        3, "freeze the masks after N consecutive unchanged rounds", check=AT_LEAST_1
    )
    masks_from: str | None = option(
        None,
        "start from a PruneX run's masks (its folder or masks.pt), frozen",
        existing_path=True,
    )
    eps_abs: float | None = option(
        None, "stop once Boyd's residual tests pass with this absolute tolerance", check=POSITIVE
    )
    eps_rel: float = option(1e-3, "relative residual tolerance of that test", check=POSITIVE)

    def __post_init__(self) -> None:
        if self.filter_keep is None and self.channel_keep is None and self.shape_keep is None:
            self.channel_keep = DEFAULT_CHANNEL_KEEP

    def check_model(self, model) -> None:
        """Before any rank starts: ``--masks-from`` is readable and fits ``model``'s convs
        (shapes only: ``model`` may live on the meta device)."""
        if self.masks_from is not None:
            from methods.prunex.method import load_masks
            from methods.prunex.state import admm_blocks

            blocks = admm_blocks(model)
            constrained = [i for i, b in enumerate(blocks) if b.constrained]
            load_masks(self.masks_from, blocks, constrained, "cpu")

    @property
    def keeps(self) -> dict[str, float | None]:
        return {
            "filter_keep": self.filter_keep,
            "channel_keep": self.channel_keep,
            "shape_keep": self.shape_keep,
        }


@dataclass
class PruneXSettings(PruneXFlatSettings):
    """Hierarchical PruneX adds the inter-node level: its penalty and how leaders talk."""

    rho2: float = option(1.5e-4, "initial inter-node penalty (paper sec. 5.1.5)", check=POSITIVE)
    bucket_mb: float = option(32.0, "inter-node packing bucket size in MiB", check=POSITIVE)
    leader_mode: Literal["single", "sharded"] = option(
        "single",
        "single: one leader per node carries the inter-node all-reduce; sharded: every local "
        "rank all-reduces 1/P of the packed buckets with its peers (Horovod-style)",
    )
    wire_dtype: Literal["fp32", "bf16"] = option(
        "fp32", "dtype of the packed inter-node buffers (fp32 math on both ends)"
    )
