"""PruneX (hierarchical H-SADMM) and its flat-consensus ablation; importing registers both."""

from methods.prunex import figures
from methods.prunex.method import PruneX
from methods.prunex.settings import PruneXFlatSettings, PruneXSettings
from suite.api import METHODS, Look, prunes_across_nodes

HANDLING = (
    "conv weights projected onto filter/channel/shape keep sets (default channel keep 0.5); "
    "BN, biases and FC are dense ADMM blocks; BN running stats averaged each round, the "
    "evaluated z's estimated on z itself"
)


@METHODS.register(
    "prunex",
    "PruneX: hierarchical H-SADMM, leaders OR masks and all-reduce packed kept slices between "
    f"nodes; {HANDLING}",
    settings=PruneXSettings,
    look=Look("PruneX", "#D55E00", "o"),
    activity=prunes_across_nodes,
    figures=(figures.residuals, figures.penalties),
    nightly=True,
)
def make_prunex(ctx):
    return PruneX(ctx, hierarchical=True)


@METHODS.register(
    "prunex-flat",
    "PruneX (AR) ablation: flat consensus, dense world all-reduce then projection, no "
    "hierarchy or shrinkage; same math as prunex",
    settings=PruneXFlatSettings,
    look=Look("PruneX (AR)", "#CC79A7", "s"),
    activity=prunes_across_nodes,
    figures=(figures.residuals, figures.penalties),
    nightly=True,
)
def make_prunex_flat(ctx):
    return PruneX(ctx, hierarchical=False)
