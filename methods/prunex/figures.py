"""PruneX's own figures of the paper's evaluation (figs. 10 and 11), declared at its
registration (``figures=``) and drawn by ``bench report`` after the suite's: the primal
residuals of a few layers over rounds, and the adaptive penalties. Each is drawn from the run
folders' ``layers`` table alone, with the report's kit (suite.report.kit), which the report
hands in.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from suite.api import figure_reads, schema


@figure_reads(layers=(schema.ITERATION, schema.LAYER, schema.CONSTRAINED, schema.R_INTRA,
                      schema.R_INTER))
def residuals(runs, out: Path, kit, width: str | None = None, layers_shown: int = 4):
    """Fig. 10: intra- and inter-node primal residuals of a few layers over rounds."""
    name, title = "fig10_residuals", "Primal residuals per layer"
    all_layers = kit.trained_rows(runs, runs.table("layers"))
    if all_layers.empty:
        return kit.Skipped(name, title, "no PruneX run with layers.parquet that trained "
                           "(a simulation does not)")
    rounds = all_layers.groupby(kit.RUN_INDEX, sort=False)[schema.ITERATION].nunique()
    gpus = runs.runs[schema.GPUS]
    # the largest run with a few rounds (one round has no curve)
    run = max(rounds.index, key=lambda i: (rounds[i] >= 3, gpus.iat[i], rounds[i]))
    layers = all_layers[all_layers[kit.RUN_INDEX] == run].drop(columns=kit.RUN_INDEX)
    layers = layers.reset_index(drop=True)
    constrained = layers[layers.constrained]
    names = list(dict.fromkeys(constrained.layer))
    picked = names[:: max(1, len(names) // layers_shown)][:layers_shown]
    part = (
        layers[layers.layer.isin(picked)]
        .melt(
            id_vars=[schema.ITERATION, schema.LAYER], value_vars=[schema.R_INTRA, schema.R_INTER],
            var_name="residual",
        )
        .dropna()
    )
    with kit.paper_figure(width or "one", ratio=0.9) as (fig, axes):
        ax = axes[0, 0]
        colors = dict(zip(picked, ("#0077BB", "#EE7733", "#009988", "#CC3311", "#33BBEE")))
        for (layer, kind), line in part.groupby([schema.LAYER, "residual"], sort=False):
            ax.plot(line.iteration, line.value, color=colors[layer], marker=".", ms=3,
                    ls="-" if kind == schema.R_INTRA else "--",
                    label=layer.removesuffix(".weight") if kind == schema.R_INTRA else None)
        ax.plot([], [], color="k", ls="-", label="intra-node")
        ax.plot([], [], color="k", ls="--", label="inter-node")
        kit.log_scale(ax, "y")
        kit.round_axis(ax, part.iteration)
        ax.set_ylabel("primal residual (L2)")
        ax.set_title(kit.label_table(runs.runs.iloc[[run]]).iat[0])  # the title says the rest
        kit.legend_outside(fig, axes, ncol=2)
        run_id = runs.runs[schema.RUN_ID].iat[run]
        files, context = kit.finish(fig, runs, [run_id], out, name, title)
    return kit.Figure(name, title, files, part, [run_id], context=context)


@figure_reads(layers=(schema.ITERATION, schema.RHO1, schema.RHO2))
def penalties(runs, out: Path, kit, width: str | None = None):
    """Fig. 11: rho1 and rho2 (mean over layers) over rounds, per PruneX configuration."""
    name, title = "fig11_rho", "Adaptive penalties over rounds"
    layers = kit.trained_rows(runs, runs.table("layers"))
    if layers.empty:
        return kit.Skipped(name, title, "no PruneX run with layers.parquet that trained "
                           "(a simulation does not)")
    chosen = layers[kit.RUN_INDEX].unique()
    # what the PruneX runs share is judged among them (their labels may leave out ranks)
    labels = pd.Series(kit.label_table(runs.runs.iloc[chosen]).to_numpy(), index=chosen)
    rhos = [schema.RHO1, schema.RHO2]
    means = layers.groupby([kit.RUN_INDEX, schema.ITERATION])[rhos].mean().reset_index()
    frame = means.melt(id_vars=[kit.RUN_INDEX, schema.ITERATION], var_name="penalty")
    frame = frame.sort_values(kit.RUN_INDEX, kind="stable").reset_index(drop=True)
    owner = frame.pop(kit.RUN_INDEX).to_numpy()
    frame = frame.assign(run=labels[owner].to_numpy(),
                         method=runs.runs[schema.METHOD].to_numpy()[owner],
                         run_id=runs.runs[schema.RUN_ID].to_numpy()[owner])
    frame = frame[frame.value > 0]
    styles = kit.series_styles(zip(frame.run, frame.method))
    with kit.paper_figure(width or "two", ncols=2, ratio=0.75) as (fig, axes):
        for ax, penalty in zip(axes[0], (schema.RHO1, schema.RHO2)):
            part = frame[frame.penalty == penalty]
            for label, line in part.groupby("run", sort=False):
                mean = line.groupby(schema.ITERATION).value.mean()  # repeats: their mean
                ax.plot(mean.index, mean.values, ms=3, markevery=max(1, len(mean) // 6),
                        label=label, **styles[label])
            if part.value.max() > 10 * part.value.min():
                kit.log_scale(ax, "y")
            kit.round_axis(ax, part.iteration)
            ax.set_ylabel(f"{penalty} (mean over layers)")
        kit.legend_outside(fig, axes, ncol=2)
        files, context = kit.finish(fig, runs, frame.run_id.unique(), out, name, title)
    return kit.Figure(name, title, files, frame, sorted(frame.run_id.unique()), context=context)
