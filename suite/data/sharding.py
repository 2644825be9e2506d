"""Per-rank training data, as in the paper: every rank owns one fixed disjoint shard.

The split happens once, with a permutation every rank computes from the same seed, so no
rank ever sees another's samples; each epoch only reshuffles within the shard. Evaluation
instead splits the test set into contiguous slices whose correct counts are summed.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from suite.data.workload import TensorData
from suite.errors import BenchError

CROP_PADDING = 4


def seeded_generator(*key: int) -> torch.Generator:
    """A torch generator for a tuple of ints; SeedSequence mixes them so that nearby keys
    such as (seed, rank, epoch) and (seed, rank, epoch + 1) give unrelated streams."""
    state = np.random.SeedSequence(list(key)).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


class ShardedLoader:
    """Endless ``(images, labels)`` batches from this rank's shard of the train set, at the
    side the model takes (``TensorData.for_model``).

    ``step`` counts the batches taken so far and ``epoch`` is the epoch of the latest one,
    so ``step / steps_per_epoch`` is the fractional epoch a run has reached.

    With ``device`` (CUDA runs) the shard lives on that device and batches are gathered and
    augmented there, as the fastest CIFAR-10 trainers do: the host only draws the batch's
    order and crop offsets (a few hundred integers), so it never bounds the step. The
    batches are the same images as on the host path, bit for bit.
    """

    def __init__(
        self, data: TensorData, rank: int, world_size: int, batch_size: int, seed: int,
        device: torch.device | None = None,
    ):
        if not 0 <= rank < world_size:
            raise BenchError(f"rank {rank} is outside a world of {world_size}")
        if batch_size <= 0:
            raise BenchError(f"batch size must be positive, got {batch_size}")
        shard_size = len(data) // world_size  # the remainder is dropped: equal shards
        if shard_size == 0:
            raise BenchError(f"{len(data)} training samples cannot fill {world_size} shards")
        self.data = data
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.batch_size = min(batch_size, shard_size)  # a small shard is one whole-shard batch
        self.steps_per_epoch = shard_size // self.batch_size
        self.step = 0
        split = torch.randperm(len(data), generator=seeded_generator(seed))
        self._shard = split[rank * shard_size : (rank + 1) * shard_size]
        self.device = device
        if device is not None:  # the shard, resident on the device, indexed by position
            self._images = data.images[self._shard].to(device)
            self._labels = data.labels[self._shard].to(device)
        else:  # the train set, indexed by sample
            self._images, self._labels = data.images, data.labels
        self._start_epoch(0)

    def shard_indices(self) -> torch.Tensor:
        """Indices into the train set that this rank owns."""
        return self._shard.clone()

    def calibration_batches(self, count: int) -> list[torch.Tensor]:
        """The first ``count`` batches of this rank's shard in a fixed order, unaugmented, on
        the loader's device: the same images whenever they are asked for (BatchNorm
        statistics of an averaged model are estimated on them), the training stream untouched.
        A small shard has fewer whole batches."""
        count = min(count, self.steps_per_epoch)
        n = count * self.batch_size
        images = self._images[:n] if self.device is not None else self._images[self._shard[:n]]
        batches = images.reshape(count, self.batch_size, *images.shape[1:]).unbind()
        return [self.data.for_model(batch) for batch in batches]

    def calibration_labels(self, count: int) -> list[torch.Tensor]:
        """The labels of ``calibration_batches(count)``, batch for batch (a loss on the
        calibration batches compares models on the same images, e.g. at PruneX's freeze)."""
        count = min(count, self.steps_per_epoch)
        n = count * self.batch_size
        labels = self._labels[:n] if self.device is not None else self._labels[self._shard[:n]]
        return list(labels.reshape(count, self.batch_size).unbind())

    def state_dict(self) -> dict:
        """The position in the stream of batches (for checkpoints)."""
        return {"step": self.step, "epoch": self.epoch, "generator": self._generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self._start_epoch(int(state["epoch"]))  # the epoch's order, then the generator's place
        self._generator.set_state(state["generator"])

    def __iter__(self) -> ShardedLoader:
        return self

    def _start_epoch(self, epoch: int) -> None:
        # the epoch's order and augmentation depend only on (seed, rank, epoch)
        self.epoch = epoch
        self._generator = seeded_generator(self.seed, self.rank, epoch)
        positions = torch.randperm(len(self._shard), generator=self._generator)
        if self.device is not None:  # shard positions, copied once per epoch
            self._order = positions.to(self.device)
        else:  # train-set indices
            self._order = self._shard[positions]

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        position = self.step % self.steps_per_epoch
        if position == 0 and self.step > 0:
            self._start_epoch(self.step // self.steps_per_epoch)
        start = position * self.batch_size
        index = self._order[start : start + self.batch_size]
        images, labels = self._images[index], self._labels[index]
        if self.data.augment:
            images = random_crop_flip(images, self._generator)
        self.step += 1
        return self.data.for_model(images), labels


def random_crop_flip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random crop after padding by 4, and horizontal flip with probability 1/2.

    The whole batch is one gather instead of a per-image transform loop. Padding is zero,
    which on normalized images is the dataset's mean colour rather than torchvision's black.
    The offsets and flips are drawn on the host from ``generator`` (the same stream whatever
    the device) and reach the device in one non-blocking copy; the gather runs where
    ``images`` are.
    """
    n, c, h, w = images.shape
    pad = CROP_PADDING
    device = images.device
    padded = F.pad(images, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (n, 1), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (n, 1), generator=generator)
    flip = (torch.rand(n, 1, generator=generator) < 0.5).long()
    drawn = torch.cat([dy, dx, flip], dim=1)
    if device.type == "cuda":
        drawn = drawn.pin_memory().to(device, non_blocking=True)
    dy, dx, flip = drawn[:, :1], drawn[:, 1:2], drawn[:, 2:].bool()
    ahead, back = torch.arange(w, device=device), torch.arange(w - 1, -1, -1, device=device)
    rows = dy + torch.arange(h, device=device)
    cols = dx + torch.where(flip, back, ahead)
    return padded[
        torch.arange(n, device=device).view(n, 1, 1, 1),
        torch.arange(c, device=device).view(1, c, 1, 1),
        rows.view(n, 1, h, 1),
        cols.view(n, 1, 1, w),
    ]


def eval_slice(n: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s contiguous share of ``n`` test samples; shares differ by at most one
    and together cover all of them, so summed correct counts score the whole test set."""
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))
