"""A third-party method in one file, written against the plugin API alone (``suite.api``): the
whole of what a plugin writes to add a method with an option, a phase and a look of its own
(the test gives it a dist-info with a ``prunex_bench.methods`` entry point).

Synchronous data-parallel SGD whose averaged gradients are scaled by ``--grad-scale`` before
the update; the all-reduce goes through the suite's communicator, so its bytes and time are
recorded like any built-in method's.
"""

from dataclasses import dataclass

import torch
from torch import nn

from suite.api import (
    METHODS,
    POSITIVE,
    Look,
    Method,
    RunContext,
    StepResult,
    average_buffers_for_eval,
    broadcast_initial_state,
    crosses_nodes_every_round,
    declare_phase,
    figure_reads,
    flatten,
    option,
    phases,
    schema,
    unflatten_into,
)

#: a phase of this plugin's own, drawn in its colour in fig. 8
SCALE = declare_phase("grad_scale", "#EECC66", communication=False)


@dataclass
class ScaledSGDSettings:
    grad_scale: float = option(1.0, "factor applied to the averaged gradients", check=POSITIVE)


class ScaledSGD(Method):
    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.model = ctx.model
        broadcast_initial_state(self.model)
        recipe = ctx.recipe
        self.optimizer = torch.optim.SGD(
            self.model.parameters(), lr=recipe.lr, momentum=recipe.momentum,
            weight_decay=recipe.weight_decay,
        )
        self.batches = iter(ctx.loader)

    def step(self, iteration: int) -> StepResult:
        ctx = self.ctx
        x, y = next(self.batches)
        x, y = x.to(ctx.device), y.to(ctx.device)
        with ctx.recorder.phase(phases.LOCAL_COMPUTE):
            self.optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        flat = ctx.comm.all_reduce(flatten(grads), ctx.topology.world, phase=phases.ALLREDUCE)
        with ctx.recorder.phase(SCALE):
            unflatten_into(grads, flat.mul_(ctx.settings.grad_scale / ctx.topology.world_size))
        with ctx.recorder.phase(phases.LOCAL_COMPUTE):
            ctx.apply_lr(self.optimizer)
            self.optimizer.step()
        return StepResult(loss.item(), len(y))

    def eval_model(self) -> nn.Module:
        return average_buffers_for_eval(self.model)

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


@figure_reads(iterations=(schema.ITERATION, schema.LOSS))  # the columns it draws
def loss_per_iteration(runs, out, kit, width=None):
    """A figure of the plugin's own, drawn by `bench report` after the suite's: the training
    loss of every scaled-SGD run per iteration (``kit``: the report's figure and style)."""
    name, title = "scaled_sgd_loss", "Scaled SGD: training loss per iteration"
    rows = runs.table(schema.ITERATIONS_TABLE)
    mine = runs.runs[schema.METHOD].to_numpy()[rows[kit.RUN_INDEX].to_numpy()] == "scaled-sgd"
    rows = rows[mine]
    if rows.empty:
        return kit.Skipped(name, title, "no scaled-sgd run")
    loss = rows.groupby([kit.RUN_INDEX, schema.ITERATION])[schema.LOSS].mean().reset_index()
    loss.insert(0, schema.RUN_ID, runs.runs[schema.RUN_ID].to_numpy()[loss.pop(kit.RUN_INDEX)])
    run_ids = sorted(loss[schema.RUN_ID].unique())
    with kit.paper_figure(width or "one") as (fig, axes):
        for _, line in loss.groupby(schema.RUN_ID):
            axes[0, 0].plot(line[schema.ITERATION], line[schema.LOSS], marker=".")
        axes[0, 0].set_xlabel("iteration")
        axes[0, 0].set_ylabel("training loss (mean over ranks)")
        files, context = kit.finish(fig, runs, run_ids, out, name, title)
    return kit.Figure(name, title, files, loss, run_ids, context=context)


@METHODS.register(
    "scaled-sgd",
    "Synchronous SGD with scaled averaged gradients (a plugin)",
    settings=ScaledSGDSettings,
    look=Look("Scaled SGD", "#117733", "d"),
    activity=crosses_nodes_every_round,  # `bench compare` fails a run that never sent
    figures=(loss_per_iteration,),  # `bench report` draws it after the suite's figures
)
def make_scaled_sgd(ctx: RunContext) -> ScaledSGD:
    return ScaledSGD(ctx)
