"""Training goes on when trajectories fail: a fifth of a step's trajectories crash their env, time out, or never start.

The rollouts are real (``SkyRLGymGenerator`` over a scripted engine and a registered env); the policy, and for GAE
the critic, are the tiny model. Each step must take the optimizer steps its prompts call for (failed rows ride
along in their prompt's mini-batch, masked), keep every mini-batch a multiple of the micro-batch size, and give
finite losses, under each estimator.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_train.algorithms import PolicyLossConfig
from skyrl_train.backends import BackendConfig, LossFn, TorchBackend, TrainingBatch
from skyrl_train.backends.critic import CriticBackend
from skyrl_train.data.dataset import PromptRecord
from skyrl_train.generators.skyrl_gym_generator import GeneratorConfig, SkyRLGymGenerator
from skyrl_train.generators.testing import Request, ScriptedEngine
from skyrl_train.inference.base import SamplingParams
from skyrl_train.objective import Objective
from skyrl_train.trainer import LoopSettings, Trainer

ENV_ID = "test_failing_actions"
PROMPTS, SAMPLES = 4, 5  # 20 trajectories a step
MINI_BATCH = 2  # prompts per optimizer step: 2 optimizer steps a step
MICRO_BATCH = 5  # rows per micro-batch: a mini-batch of 2 prompts is 10 rows
STEPS = 5
Run = tuple[list[dict[str, float]], list[TrainingBatch]]  # each step's metrics, every mini-batch trained
SEED_BITS = (1 << 20) - 1  # the trainer's per-step seed leaves the low 20 bits to the trajectory's index


class ActionEnv(BaseTextEnv):
    """One turn: ``crash`` raises, ``stall`` blocks past the generator's deadline, ``right`` earns 1, else 0."""

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.fail_init = bool((extras or {}).get("fail_init"))

    def init(self, prompt: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
        if self.fail_init:
            raise RuntimeError("the env could not start")
        return prompt, {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if "crash" in action:
            raise RuntimeError("the env crashed")
        if "stall" in action:
            time.sleep(STALL_S)
        return BaseTextEnvStepOutput(observations=[], reward=float("right" in action), done=True, metadata={})


STALL_S = 2.0  # how long a stalled step blocks: past the generator's deadline
INIT_FAILURE_STEP = 2  # in this step prompt 3's env fails to start, for all five samples, and nothing else fails


def failing_rows(step: int) -> dict[int, str]:
    """The trajectory index → failing action of ``step``: 4 of 20 (20 %), half crashes, half timeouts.

    Step 0 fails samples 1-4 of prompt 0, leaving it one surviving sample (which earns 1); later steps spread out.
    """
    if step == INIT_FAILURE_STEP:
        return {}
    rows = [1, 2, 3, 4] if step == 0 else [(step + 6 * k) % (PROMPTS * SAMPLES) for k in range(4)]
    return {row: ("crash" if k % 2 == 0 else "stall") for k, row in enumerate(rows)}


class Script:
    """The engine's replies: the failing actions of the step, otherwise ``right`` or ``wrong`` varying per sample."""

    def __init__(self) -> None:
        self.step = 0

    def __call__(self, request: Request) -> str:
        assert request.params.seed is not None
        index = request.params.seed & SEED_BITS
        failing = failing_rows(self.step)
        if index in failing:
            return failing[index]
        return "right" if (index * 7 + self.step) % 3 == 0 else "wrong"


class NextStep:
    """Moves the script to the next step after each step, as the prompts of a new step arrive."""

    def __init__(self, script: Script) -> None:
        self.script = script

    def __call__(self, trainer: Trainer, metrics: Mapping[str, float]) -> None:
        self.script.step = trainer.global_step


@pytest.fixture(scope="module", autouse=True)
def _env_registered() -> Iterator[None]:
    skyrl_gym.register(id=ENV_ID, entry_point=ActionEnv)
    yield
    skyrl_gym.deregister(ENV_ID)


def _backend(model_dir: Path, critic: bool = False) -> TorchBackend:
    config = BackendConfig(
        str(model_dir), gradient_checkpointing=False, micro_train_batch_size=MICRO_BATCH, micro_forward_batch_size=20
    )
    return CriticBackend(config) if critic else TorchBackend(config)


def _recording(backend: TorchBackend, batches: list[TrainingBatch]) -> None:
    forward_backward = backend.forward_backward

    def recording(batch: TrainingBatch, loss_fn: LossFn, **kwargs: Any) -> dict[str, float]:
        batches.append(batch)
        return forward_backward(batch, loss_fn, **kwargs)

    backend.forward_backward = recording  # type: ignore[method-assign]


def _prompts(step: int) -> list[PromptRecord]:
    return [
        PromptRecord(
            [{"role": "user", "content": f"Task {step}-{k}."}],
            ENV_ID,
            {"fail_init": step == INIT_FAILURE_STEP and k == PROMPTS - 1},
            f"s{step}p{k}",
        )
        for k in range(PROMPTS)
    ]


def _train(
    model_dir: Path, tokenizer: PreTrainedTokenizerBase, estimator: str
) -> tuple[list[dict[str, float]], list[TrainingBatch]]:
    script = Script()
    engine = ScriptedEngine(tokenizer, script)
    # Room for a crash to reach its env on a loaded host (at 0.5 s one timed out instead in a CI run); a stall
    # (2 s) still outlasts it.
    generator = SkyRLGymGenerator(engine, tokenizer, GeneratorConfig(timeout_s=STALL_S - 0.5))
    policy = _backend(model_dir)
    trained: list[TrainingBatch] = []
    _recording(policy, trained)
    trainer = Trainer(
        settings=LoopSettings(
            n_samples_per_prompt=SAMPLES, policy_mini_batch_size=MINI_BATCH, advantage_estimator=estimator, seed=3
        ),
        objective=Objective(policy_loss_type="regular", policy_loss=PolicyLossConfig()),
        policy=policy,
        engine=engine,
        generator=generator,
        sampling_params=SamplingParams(max_tokens=4),
        eval_sampling_params=SamplingParams(max_tokens=4),
        pad_token_id=int(tokenizer.pad_token_id or 0),
        critic=_backend(model_dir, critic=True) if estimator == "gae" else None,
        callbacks=[NextStep(script)],
    )
    metrics = [asyncio.run(trainer.train_step(_prompts(step))) for step in range(STEPS)]
    return metrics, trained


@pytest.fixture(scope="module")
def runs(tiny_model_dir: Path, tokenizer: PreTrainedTokenizerBase) -> Callable[[str], Run]:
    """Each estimator's five steps, trained once for all the tests that read them."""
    done: dict[str, Run] = {}

    def run(estimator: str) -> Run:
        if estimator not in done:
            done[estimator] = _train(tiny_model_dir, tokenizer, estimator)
        return done[estimator]

    return run


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce++", "gae"])
def test_a_fifth_of_trajectories_failing_leaves_training_on_schedule(
    runs: Callable[[str], Run], estimator: str
) -> None:
    metrics, trained = runs(estimator)

    for number, step in enumerate(metrics):
        init_failure = number == INIT_FAILURE_STEP
        assert step["rollout/stop_env_error"] == pytest.approx(0.25 if init_failure else 0.1)
        assert step.get("rollout/stop_timeout", 0.0) == pytest.approx(0.0 if init_failure else 0.1)
        assert step["policy/optimizer_steps"] == PROMPTS // MINI_BATCH
        losses = {key: value for key, value in step.items() if "loss" in key or "grad_norm" in key}
        assert losses
        assert all(math.isfinite(value) for value in losses.values()), losses
    assert len(trained) == STEPS * PROMPTS // MINI_BATCH
    for batch in trained:  # whole prompts: failed rows ride along, masked
        assert len(batch) == MINI_BATCH * SAMPLES


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_a_prompt_left_with_one_sample_gets_no_advantage(
    runs: Callable[[str], Run], tokenizer: PreTrainedTokenizerBase, estimator: str
) -> None:
    """Step 0 fails four of prompt 0's five samples; the survivor (reward 1) has no baseline to compare with."""
    _, trained = runs(estimator)
    survivors = [
        batch.tensors["advantages"][row]
        for batch in trained[: PROMPTS // MINI_BATCH]
        for row in range(len(batch))
        if "Task 0-0." in tokenizer.decode(batch.input_ids[row]) and bool(batch.response_mask[row].any())
    ]
    assert len(survivors) == 1
    assert bool((survivors[0] == 0).all())
