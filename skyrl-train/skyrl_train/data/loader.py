"""A deterministic, resumable loader of prompt batches.

Each epoch visits the dataset in one order: a permutation drawn from ``(seed, epoch)`` when shuffling, the file
order otherwise. The loader's whole state is ``(epoch, position, seed)``, where ``position`` counts the prompts of
the current epoch's order already handed out. Saving that state with a checkpoint and loading it into a fresh
loader continues with exactly the batches an uninterrupted run would have produced.

``drop_last``: with ``drop_last=True`` every batch has ``batch_size`` prompts and the ``len(dataset) %
batch_size`` prompts at the end of an epoch's order are skipped for that epoch (a new order is drawn for the
next epoch, so different prompts are skipped). With ``drop_last=False`` the last batch of an epoch is smaller.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Generic, Protocol, TypeVar

import numpy as np

__all__ = ["PromptLoader"]

logger = logging.getLogger(__name__)

T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")


class _Indexable(Protocol[T_co]):
    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> T_co: ...


class PromptLoader(Generic[T]):
    """Batches of ``batch_size`` items of ``dataset``, epoch after epoch, resumable mid-epoch.

    Iterating the loader yields the remaining batches of the current epoch; the state advances as each batch is
    handed out, so ``state_dict()`` taken after processing a batch resumes with the next one. After the last
    batch of an epoch the state moves to the next epoch, and the next ``for batch in loader`` walks that one.
    One iteration at a time: two live iterators share (and advance) the same state.

    Raises:
        ValueError: ``batch_size`` < 1, an empty dataset, or (with ``drop_last``) fewer items than one batch.
    """

    def __init__(
        self, dataset: _Indexable[T], batch_size: int, *, seed: int = 42, shuffle: bool = True, drop_last: bool = True
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if len(dataset) == 0 or (drop_last and len(dataset) < batch_size):
            raise ValueError(
                f"the dataset has {len(dataset)} prompts, fewer than one batch of {batch_size} "
                "(lower the batch size, add prompts, or set drop_last=False)"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self._seed = seed
        self._epoch = 0
        self._position = 0
        self._order_cache: tuple[int, list[int]] | None = None

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from (0-based)."""
        return self._epoch

    @property
    def position(self) -> int:
        """Prompts of the current epoch already handed out."""
        return self._position

    def __len__(self) -> int:
        """Batches per epoch."""
        n, size = len(self.dataset), self.batch_size
        return n // size if self.drop_last else -(-n // size)

    def __iter__(self) -> Iterator[list[T]]:
        epoch = self._epoch
        while self._epoch == epoch:
            yield self._next_batch()

    def stream(self) -> Iterator[list[T]]:
        """Batches across epochs without end (stop by step count)."""
        while True:
            yield from self

    def items(self) -> Iterator[T]:
        """Items one at a time across epochs without end, in the order the batches hand them out.

        With ``drop_last`` the same tail of each epoch is skipped. The state advances per item, so ``state_dict()``
        resumes with the next one (``trainer.async_mode=fully_async`` draws its prompts so).
        """
        while True:
            index = self._order()[self._position]
            self._position += 1
            self._roll_if_exhausted()
            yield self.dataset[index]

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "position", "seed", "dataset_size"}``: everything needed to continue (JSON-safe)."""
        return {
            "epoch": self._epoch,
            "position": self._position,
            "seed": self._seed,
            "dataset_size": len(self.dataset),
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`); its seed replaces this loader's.

        Raises:
            ValueError: the state was saved over a dataset of another size, so its order would differ.
        """
        size = state.get("dataset_size", len(self.dataset))
        if size != len(self.dataset):
            raise ValueError(
                f"the loader state was saved over {size} prompts but the dataset has {len(self.dataset)}; "
                "resume with the same data files and max_prompt_length"
            )
        if state["seed"] != self._seed:
            logger.warning("resuming the prompt order of seed %d (configured seed %d)", state["seed"], self._seed)
        self._seed = int(state["seed"])
        self._epoch = int(state["epoch"])
        self._position = int(state["position"])
        self._order_cache = None
        self._roll_if_exhausted()

    def _next_batch(self) -> list[T]:
        order = self._order()
        indices = order[self._position : self._position + self.batch_size]
        self._position += len(indices)
        self._roll_if_exhausted()
        return [self.dataset[i] for i in indices]

    def _roll_if_exhausted(self) -> None:
        """Move to the next epoch once the epoch's last (full, with drop_last) batch has been handed out."""
        n = len(self.dataset)
        end = n - n % self.batch_size if self.drop_last else n
        if self._position >= end:
            self._epoch += 1
            self._position = 0

    def _order(self) -> list[int]:
        if self._order_cache is None or self._order_cache[0] != self._epoch:
            n = len(self.dataset)
            if self.shuffle:
                # A fresh generator per (seed, epoch): an epoch's order depends on nothing else, so resume redraws it.
                order = np.random.default_rng([self._seed, self._epoch]).permutation(n).tolist()
            else:
                order = list(range(n))
            self._order_cache = (self._epoch, order)
        return self._order_cache[1]
