"""DAPO dynamic sampling in the loop (Yu et al., arXiv 2503.14476): train only on prompt groups whose rewards vary.

A group whose responses all earn the same reward has a group-relative advantage of zero: it costs a forward and
backward pass and teaches nothing. ``algorithm.dynamic_sampling`` picks what to do about such groups:

``filter``  (:func:`collect_informative_groups`) draw batch after batch of prompts, keep only the groups with
            reward variance, and stop once they fill the step's ``train_batch_size`` groups (surplus groups of the
            last batch are dropped).
``replace`` (:func:`replace_uninformative_groups`) replace each zero-variance group by a copy of a random
            informative group of the same batch, once at least ``min_replace_ratio`` of its groups are
            informative; a batch with fewer is discarded and a fresh one drawn.

Both draw at most ``max_sample_batches`` batches per step, then raise :class:`DynamicSamplingError`. A group's
variance is over its trajectories that did not fail (see :mod:`skyrl_train.experience`): a group left with fewer
than two is not informative, and a kept group keeps its failed rows (masked) with it.

Both take the sampling as a coroutine function ``sample(attempt) -> Experience`` (``attempt`` 0 is the step's own
batch of prompts, later ones are refills), so the loop owns the prompts, seeds and generator.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import torch

from skyrl_train.algorithms.filtering import filter_groups, replace_groups, zero_variance_rows
from skyrl_train.experience import Experience, concat_experiences, select_rows

logger = logging.getLogger(__name__)

SampleFn = Callable[[int], Awaitable[Experience]]
"""``await sample(attempt)``: roll out the ``attempt``-th batch of prompts of this step (0-based)."""


class DynamicSamplingError(RuntimeError):
    """Dynamic sampling cannot assemble a training batch: ``max_sample_batches`` ran out, or the prompts did."""


@dataclass
class _Tally:
    """What one step's dynamic sampling drew, for the metrics."""

    batches: int = 0  # batches of prompts rolled out
    groups: int = 0  # prompt groups among them
    informative: int = 0  # groups whose rewards vary

    def add(self, experience: Experience) -> None:
        self.batches += 1
        self.groups += experience.num_groups
        self.informative += count_informative_groups(experience)

    def metrics(self, **extra: float) -> dict[str, float]:
        return {
            "dynamic_sampling/sample_batches": float(self.batches),
            "dynamic_sampling/groups_sampled": float(self.groups),
            "dynamic_sampling/groups_informative": float(self.informative),
            **{f"dynamic_sampling/{key}": value for key, value in extra.items()},
        }


def count_informative_groups(experience: Experience) -> int:
    """The number of prompt groups of ``experience`` whose rewards are not all equal."""
    zero_variance = zero_variance_rows(experience.trajectory_rewards, experience.group_index, valid=experience.counted)
    return int(torch.unique(experience.group_index[~zero_variance]).numel())


async def collect_informative_groups(
    sample: SampleFn, target_groups: int, max_sample_batches: int, pad_token_id: int
) -> tuple[Experience, dict[str, float]]:
    """``filter``: the first ``target_groups`` informative groups over up to ``max_sample_batches`` batches.

    Returns the experience (groups in the order they were sampled, ids ``0 … target_groups − 1``) and metrics
    ``dynamic_sampling/{sample_batches, groups_sampled, groups_informative, groups_kept}``.

    Raises:
        DynamicSamplingError: ``max_sample_batches`` batches held fewer than ``target_groups`` informative groups.
    """
    tally, missing = _Tally(), target_groups
    parts: list[Experience] = []
    while tally.batches < max_sample_batches:
        experience = await sample(tally.batches)
        tally.add(experience)
        kept = filter_groups(experience.trajectory_rewards, experience.group_index, missing, valid=experience.counted)
        if len(kept.row_index):
            parts.append(select_rows(experience, kept.row_index, kept.group_index))
        missing = kept.num_groups_needed
        if missing == 0:
            return concat_experiences(parts, pad_token_id), tally.metrics(groups_kept=float(target_groups))
        logger.info("dynamic sampling: %d of %d groups informative so far", target_groups - missing, target_groups)
    raise DynamicSamplingError(
        f"dynamic sampling ('filter') drew algorithm.max_sample_batches={max_sample_batches} batches "
        f"({tally.groups} prompt groups) and found {target_groups - missing} of the {target_groups} groups with "
        "varying rewards a step needs. Raise algorithm.max_sample_batches, make rewards vary within a group "
        "(more generator.n_samples_per_prompt, a higher generator.temperature, prompts of medium difficulty), "
        "or use algorithm.dynamic_sampling=replace"
    )


async def replace_uninformative_groups(
    sample: SampleFn, min_replace_ratio: float, max_sample_batches: int, generator: torch.Generator
) -> tuple[Experience, dict[str, float]]:
    """``replace``: the first batch with enough informative groups, its zero-variance groups replaced.

    ``generator`` draws the replacements (seed it per step for reproducible runs). Returns the experience (as
    many groups as the batch had; a copy has its own group id) and metrics
    ``dynamic_sampling/{sample_batches, groups_sampled, groups_informative, groups_replaced}``.

    Raises:
        DynamicSamplingError: none of ``max_sample_batches`` batches reached ``min_replace_ratio``.
    """
    tally = _Tally()
    while tally.batches < max_sample_batches:
        experience = await sample(tally.batches)
        tally.add(experience)
        result = replace_groups(
            experience.trajectory_rewards,
            experience.group_index,
            min_replace_ratio,
            generator=generator,
            valid=experience.counted,
        )
        if result.num_groups_needed == 0:
            replaced = experience.num_groups - count_informative_groups(experience)
            replaced_experience = select_rows(experience, result.row_index, result.group_index)
            return replaced_experience, tally.metrics(groups_replaced=float(replaced))
        # Too few informative groups to copy from: the batch would be dominated by duplicates, so draw another.
        logger.warning(
            "dynamic sampling ('replace'): %d of %d groups informative, below min_replace_ratio=%s; "
            "sampling another batch",
            count_informative_groups(experience),
            experience.num_groups,
            min_replace_ratio,
        )
    raise DynamicSamplingError(
        f"dynamic sampling ('replace') drew algorithm.max_sample_batches={max_sample_batches} batches and none "
        f"had algorithm.min_replace_ratio={min_replace_ratio} of its prompt groups with varying rewards. Lower "
        "algorithm.min_replace_ratio, raise algorithm.max_sample_batches, or make rewards vary within a group "
        "(more generator.n_samples_per_prompt, a higher generator.temperature, prompts of medium difficulty)"
    )
