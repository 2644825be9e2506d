"""A live view of a running job (``--tensorboard``): TensorBoard event files in the run
folder, written by rank 0 while the run goes, so ``tensorboard --logdir results/`` shows
every run side by side before any of them ends.

Per iteration (the global step is the iteration): the world's mean training loss, the lr,
every phase's seconds, the bytes all ranks sent per link class, and the method's scalars
(density, mask drift, packed bytes); per PruneX layer its penalties rho1 and rho2; per
evaluation the test accuracy (in %) and loss. The parquet tables stay the record; this log
is for watching.
"""

from __future__ import annotations

from pathlib import Path

from suite.results import schema

#: the run folder's subfolder that holds the event files
FOLDER = "tensorboard"
SCALARS = (schema.DENSITY, schema.MASK_DRIFT, schema.MASK_DRIFT_FRACTION, schema.PACKED_BYTES,
           schema.LR)


class TensorBoardLog:
    """Rank 0's event writer. ``resume_at`` drops the events a crashed attempt wrote after
    the checkpoint the run continues from (TensorBoard's purge_step)."""

    def __init__(self, run_folder: Path, resume_at: int = 0):
        # lazy: torch.utils.tensorboard costs ~0.2 s to import; only this path needs it
        from torch.utils.tensorboard import SummaryWriter

        self.path = Path(run_folder) / FOLDER
        self.writer = SummaryWriter(str(self.path), purge_step=resume_at or None)
        self.layers_seen = 0

    def iteration(self, row: dict, mean_loss: float, inter: float, intra: float) -> None:
        step = row[schema.ITERATION]
        add = self.writer.add_scalar
        add("train/loss", mean_loss, step)
        add("bytes/inter_node", inter, step)
        add("bytes/intra_node", intra, step)
        for key, value in row.items():
            if key.startswith("t_") and value is not None:
                add(f"seconds/{key[2:]}", value, step)
            elif key in SCALARS and value is not None:
                add(f"method/{key}" if key != "lr" else "train/lr", value, step)

    def layers(self, rows: list[dict]) -> None:
        """PruneX's per-layer rows recorded since the last call: rho1 and rho2."""
        for row in rows[self.layers_seen :]:
            for key in (schema.RHO1, schema.RHO2):
                self.writer.add_scalar(f"{key}/{row[schema.LAYER]}", row[key],
                                       row[schema.ITERATION])
        self.layers_seen = len(rows)

    def evaluation(self, iteration: int, accuracy: float, test_loss: float) -> None:
        self.writer.add_scalar("eval/accuracy_percent", 100 * accuracy, iteration)
        self.writer.add_scalar("eval/test_loss", test_loss, iteration)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
