"""Datasets with a known cost per item, for the DataLoader tuner's tests.

Items sleep rather than spin: a sleeping worker leaves the CPU free, so the speed-up
from more workers holds on a 2-core machine that also runs other tests.
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset

ITEM_S = 0.008
"""Seconds each item costs."""


class SleepyDataset(Dataset[torch.Tensor]):
    def __init__(self, n: int = 100_000, item_s: float = ITEM_S) -> None:
        self.n, self.item_s = n, item_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.item_s)
        return torch.full((8,), float(i))


class BrokenDataset(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> torch.Tensor:
        raise KeyError(f"no item {i}")


def make_sleepy() -> SleepyDataset:
    return SleepyDataset()


def make_tiny() -> SleepyDataset:
    return SleepyDataset(n=12, item_s=0.0)


def make_broken() -> BrokenDataset:
    return BrokenDataset()


def not_a_dataset() -> int:
    return 3


def first_half_sampler(dataset: SleepyDataset) -> range:
    return range(len(dataset) // 2)


def make_instant() -> SleepyDataset:
    return SleepyDataset(n=100_000, item_s=0.0)


def stack(batch: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(batch)
