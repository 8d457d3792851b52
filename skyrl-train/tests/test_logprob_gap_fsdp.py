"""``policy/rollout_logprob_gap`` on the FSDP worker group: measured by the update's own forward, before the step.

A step on the policy that sampled (one epoch, one mini-batch) takes its old log-probs from the training forward, which
runs in the Ray workers. The gap must come from that forward too: the weights that sampled, and no forward of its own
after the optimizer step. The batch has a group masked out by the zero-variance filter (the gap still covers its
tokens), micro-batches of one row (some hold masked-out rows only) and an odd number of rows (rank 1's share is
padded with a masked copy of a row).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from skyrl_train.algorithms import PolicyLossConfig, masked_mean
from skyrl_train.backends import BackendConfig, OptimizerConfig, TorchBackend, TrainingBackend
from skyrl_train.data.dataset import PromptRecord
from skyrl_train.experience import to_experience
from skyrl_train.generators.base import GeneratorInput, GeneratorOutput
from skyrl_train.inference.base import GenerationOutput, SamplingParams
from skyrl_train.objective import Objective
from skyrl_train.trainer import LoopSettings, Trainer

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e ./skyrl-train")

from skyrl_train.backends.ray_group import FSDPBackend, WorkerGroupConfig  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SAMPLES = 3  # per prompt: 3 prompts give 9 rows, split 5 + 4 over two ranks (the 4 padded to 5)
FLAT = "p0"  # every sample of this prompt earns the same reward: the zero-variance filter masks its group out
PAD_ID = 0


class NoEngine:
    """Takes the weight sync; the rollouts come from :class:`ScriptedRollouts`."""

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[GenerationOutput]:
        raise AssertionError("the scripted generator does not call the engine")

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        for _ in weights:
            pass

    async def pause(self) -> None:
        pass

    async def resume(self) -> None:
        pass

    async def close(self) -> None:
        pass


class ScriptedRollouts:
    """Random responses of 2 to 5 tokens with engine log-probs that differ from the model's; keeps its outputs."""

    def __init__(self) -> None:
        self.outputs: list[GeneratorOutput] = []

    async def generate(self, batch: GeneratorInput) -> GeneratorOutput:
        gen = torch.Generator().manual_seed(len(self.outputs))
        rows = len(batch.trajectory_ids)
        lengths = [2 + row % 4 for row in range(rows)]
        responses = [torch.randint(3, 600, (n,), generator=gen).tolist() for n in lengths]
        samples = [int(t.rsplit(":", 1)[1]) for t in batch.trajectory_ids]
        flat = [t.startswith(f"{FLAT}:") for t in batch.trajectory_ids]
        rewards = [1.0 if f else float(s % 2) for f, s in zip(flat, samples, strict=True)]
        output = GeneratorOutput(
            prompt_token_ids=[[5, 100 + row] for row in range(rows)],
            response_ids=responses,
            loss_masks=[[0, *[1] * (n - 1)] for n in lengths],  # the first token stands for an observation
            rewards=[[0.0] * (n - 1) + [r] for n, r in zip(lengths, rewards, strict=True)],
            rollout_logprobs=[(-3.0 * torch.rand(n, generator=gen)).tolist() for n in lengths],
            stop_reasons=["stop"] * rows,
            trajectory_ids=list(batch.trajectory_ids),
        )
        self.outputs.append(output)
        return output


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _config(model_dir: Path) -> BackendConfig:
    return BackendConfig(
        str(model_dir),
        gradient_checkpointing=False,
        micro_train_batch_size=1,
        micro_forward_batch_size=4,
        optimizer=OptimizerConfig(lr=1e-2, scheduler="constant"),  # a large step: the gap after it is far off
    )


def _trainer(policy: TrainingBackend, **settings: Any) -> Trainer:
    return Trainer(
        settings=LoopSettings(
            **{"n_samples_per_prompt": SAMPLES, "policy_mini_batch_size": 3, "zero_variance_filter": True, **settings}
        ),
        # An entropy bonus: its metric is a mean over the trained tokens that differs from one micro-batch to the next.
        objective=Objective(policy_loss_type="regular", policy_loss=PolicyLossConfig(), entropy_coef=1e-3),
        policy=policy,
        engine=NoEngine(),
        generator=ScriptedRollouts(),
        sampling_params=SamplingParams(max_tokens=5),
        eval_sampling_params=SamplingParams(max_tokens=5),
        pad_token_id=PAD_ID,
    )


def _record_calls(backend: Any, calls: list[str]) -> None:
    """Append the name of every ``forward``, ``forward_backward`` and ``optim_step`` of ``backend`` to ``calls``."""
    for name in ("forward", "forward_backward", "optim_step"):
        method = getattr(backend, name)

        def recorded(*args: Any, _name: str = name, _method: Any = method, **kwargs: Any) -> Any:
            calls.append(_name)
            return _method(*args, **kwargs)

        setattr(backend, name, recorded)


def _prompts() -> list[PromptRecord]:
    return [PromptRecord([{"role": "user", "content": uid}], "scripted", {}, uid) for uid in ("p0", "p1", "p2")]


def _gap_before_the_update(model_dir: Path, output: GeneratorOutput) -> float:
    """The mean |rollout − model| log-prob over every generated token, from the initial weights in this process."""
    batch = to_experience(output, PAD_ID).batch
    log_probs = TorchBackend(_config(model_dir)).forward(batch).log_probs
    return float(masked_mean((batch.tensors["rollout_log_probs"] - log_probs).abs(), batch.response_mask))


def test_the_gap_comes_from_the_training_forward_on_the_workers(cluster: None, tiny_model_dir: Path) -> None:
    policy = FSDPBackend(_config(tiny_model_dir), WorkerGroupConfig(num_workers=2))
    try:
        trainer = _trainer(policy)
        calls: list[str] = []
        _record_calls(policy, calls)
        metrics = asyncio.run(trainer.train_step(_prompts()))
    finally:
        policy.close()
    assert calls == ["forward_backward", "optim_step"]  # no old-log-prob pass, no gap pass after the step
    generator = trainer.generator
    assert isinstance(generator, ScriptedRollouts)
    expected_gap = _gap_before_the_update(tiny_model_dir, generator.outputs[0])
    assert expected_gap > 0.5
    assert metrics["policy/rollout_logprob_gap"] == pytest.approx(expected_gap, abs=1e-5)
    # Every other metric of the update is what one process reports with a separate old-log-prob pass.
    separate = asyncio.run(
        _trainer(TorchBackend(_config(tiny_model_dir)), reuse_update_log_probs=False).train_step(_prompts())
    )
    keys = {key for key in separate if key.startswith("policy/")}
    assert {"policy/entropy", "policy/ratio_mean", "policy/loss", "policy/grad_norm"} <= keys <= metrics.keys()
    for key in keys:
        assert metrics[key] == pytest.approx(separate[key], rel=1e-4, abs=1e-5), key
