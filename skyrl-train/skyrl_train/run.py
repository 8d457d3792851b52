"""Wire a run config into components and drive the training loop; what ``skyrl-train`` (the CLI) calls.

Order: resolve and validate the config (every bad input fails here, before any model loads) → record it in the
run directory → tokenizer, datasets → policy (reference, critic) backends → inference engine → generator → tracker →
resume from the latest checkpoint when there is one → evaluate → train steps with periodic evaluation and
checkpoints → final checkpoint, Hugging Face export and the metrics plot. Returns a :class:`RunResult`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyrl_train import checkpoint
from skyrl_train.backends import BackendConfig, LoraConfig, OptimizerConfig, TorchBackend
from skyrl_train.backends.critic import CriticBackend
from skyrl_train.compute_thread import ComputeThread
from skyrl_train.config import Config, build_components, record_config, resolve, to_dict, validate
from skyrl_train.data.dataset import PromptDataset, PromptRecord
from skyrl_train.data.loader import PromptLoader
from skyrl_train.generators import GeneratorConfig, SkyRLGymGenerator
from skyrl_train.inference.factory import create_engine
from skyrl_train.objective import Objective
from skyrl_train.tracking import Tracker
from skyrl_train.trainer import LoopSettings, Metrics, Trainer, state_for_checkpoint

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What a finished run produced."""

    run_dir: Path
    global_step: int
    eval_history: list[tuple[int, Metrics]] = field(default_factory=list)  # (step, eval metrics)
    last_metrics: Metrics = field(default_factory=dict)
    checkpoint: Path | None = None
    export: Path | None = None
    plot: Path | None = None
    wall_seconds: float = 0.0


def backend_config(config: Config, *, path: str | None = None, trainable: bool = True) -> BackendConfig:
    """The policy's (or, with ``path``, the reference model's) :class:`BackendConfig`."""
    m, o, t = config.model, config.optim, config.trainer
    return BackendConfig(
        model_path=path or m.path,
        dtype=m.dtype,
        micro_train_batch_size=t.micro_train_batch_size,
        micro_forward_batch_size=t.micro_forward_batch_size,
        max_tokens_per_microbatch=t.max_tokens_per_microbatch,
        remove_padding=t.remove_padding,
        gradient_checkpointing=m.gradient_checkpointing and trainable,
        seed=t.seed,
        optimizer=OptimizerConfig(
            lr=o.lr,
            betas=(o.adam_betas[0], o.adam_betas[1]),
            weight_decay=o.weight_decay,
            eps=o.eps,
            max_grad_norm=o.max_grad_norm,
            scheduler=o.scheduler,
            num_warmup_steps=o.num_warmup_steps,
        ),
        lora=LoraConfig(rank=m.lora_rank, alpha=m.lora_alpha, dropout=m.lora_dropout) if trainable else LoraConfig(),
    )


def critic_backend_config(config: Config) -> BackendConfig:
    """The critic's :class:`BackendConfig`: the policy's settings with ``model.critic_path`` and ``optim.critic_lr``."""
    if not config.model.critic_path:
        raise ValueError("no critic is configured: set model.critic_path")
    policy = backend_config(config, path=config.model.critic_path)
    return dataclasses.replace(policy, optimizer=dataclasses.replace(policy.optimizer, lr=config.optim.critic_lr))


def generator_config(config: Config) -> GeneratorConfig:
    """The generator's settings from the ``generator`` and ``environment`` sections."""
    g, env = config.generator, config.environment
    assert g.max_input_length is not None  # filled by resolve()
    return GeneratorConfig(
        max_turns=g.max_turns,
        max_input_length=g.max_input_length,
        max_generate_length=g.max_generate_length,
        max_response_length=g.max_response_length,
        batched=g.batched,
        env_configs=env.env_configs,
        max_concurrent_trajectories=g.max_concurrent_trajectories,
        timeout_s=g.timeout_s,
        max_env_workers=env.max_env_workers,
        zero_reward_on_non_stop=g.zero_reward_on_non_stop,
        apply_overlong_filtering=g.apply_overlong_filtering,
        on_failure=g.on_failure,
        chat_template_kwargs=g.chat_template_kwargs,
    )


def loop_settings(config: Config) -> LoopSettings:
    """The loop's own settings."""
    components = build_components(config)
    a = config.algorithm
    return LoopSettings(
        n_samples_per_prompt=config.generator.n_samples_per_prompt,
        policy_mini_batch_size=config.trainer.policy_mini_batch_size,
        update_epochs_per_batch=config.trainer.update_epochs_per_batch,
        advantage_estimator=a.advantage_estimator,
        advantage=components.advantage,
        use_kl_in_reward=a.use_kl_in_reward,
        kl_estimator_type=a.kl_estimator_type,
        zero_variance_filter=a.zero_variance_filter,
        dynamic_sampling=a.dynamic_sampling,
        max_sample_batches=a.max_sample_batches,
        min_replace_ratio=a.min_replace_ratio,
        value_clip=a.value_clip,
        logprob_temperature=components.logprob_temperature,
        eval_n_samples_per_prompt=config.generator.eval_n_samples_per_prompt,
        seed=config.trainer.seed,
    )


def objective_of(config: Config) -> Objective:
    """The loss terms from the ``algorithm`` section."""
    a = config.algorithm
    return Objective(
        policy_loss_type=a.policy_loss_type,
        policy_loss=build_components(config).policy_loss,
        use_kl_loss=a.use_kl_loss,
        kl_loss_coef=a.kl_loss_coef,
        kl_estimator_type=a.kl_estimator_type,
        entropy_coef=a.entropy_loss_coef,
    )


def run(config: Config, *, echo_config: bool = True) -> RunResult:
    """Train as ``config`` says (synchronous wrapper around :func:`arun`)."""
    return asyncio.run(arun(config, echo_config=echo_config))


async def arun(config: Config, *, echo_config: bool = True) -> RunResult:
    """Train as ``config`` says; see the module docstring for the order of work."""
    started = time.monotonic()
    config = resolve(config)
    validate(config)
    run_dir = Path(config.trainer.run_dir)
    record_config(config, run_dir, echo=print if echo_config else None)
    session = await _Session.open(config)
    try:
        result = await session.train()
    finally:
        await session.close()
    result.wall_seconds = time.monotonic() - started
    return result


class _Session:
    """The live components of one run, and the outer loop over steps."""

    def __init__(self, config: Config) -> None:
        from transformers import AutoTokenizer

        self.config = config
        self.run_dir = Path(config.trainer.run_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(config.model.path)
        self.train_set = self._dataset(config.data.train_data)
        self.eval_prompts: list[PromptRecord] = (
            list(self._dataset(config.data.val_data)) if config.data.val_data else []
        )
        self.loader = PromptLoader(
            self.train_set,
            config.trainer.train_batch_size,
            seed=config.data.seed,
            shuffle=config.data.shuffle,
            drop_last=config.data.drop_last,
        )

    def _dataset(self, paths: list[str]) -> PromptDataset:
        return PromptDataset(
            paths,
            default_env_class=self.config.environment.env_class,
            tokenizer=self.tokenizer,
            max_prompt_length=self.config.data.max_prompt_length,
            chat_template_kwargs=self.config.generator.chat_template_kwargs,
        )

    @classmethod
    async def open(cls, config: Config) -> _Session:
        session = cls(config)
        session._build()
        return session

    def _build(self) -> None:
        config = self.config
        components = build_components(config)
        inference = config.inference
        # With the local engine, every model of the run computes on one thread (skyrl_train.compute_thread: why).
        self.compute = ComputeThread() if inference.engine == "local" else None
        compute = self.compute
        policy = TorchBackend(backend_config(config), compute)
        ref = None
        if config.algorithm.use_kl_loss or config.algorithm.use_kl_in_reward:
            ref = TorchBackend(backend_config(config, path=config.model.ref_path, trainable=False), compute)
        critic = CriticBackend(critic_backend_config(config), compute) if config.model.critic_path else None
        options = _engine_options(config)
        self.engine = create_engine(inference.engine, config.model.path, compute=compute, **options)
        generator = SkyRLGymGenerator(self.engine, self.tokenizer, generator_config(config))
        self.tracker = Tracker.create(
            config.trainer.logger,
            self.run_dir,
            project_name=config.trainer.project_name,
            run_name=config.trainer.run_name,
            config=to_dict(config),
            total_steps=self.total_steps(),
            samples_per_step=config.trainer.log_samples_per_step,
        )
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.trainer = Trainer(
            settings=loop_settings(config),
            objective=objective_of(config),
            policy=policy,
            engine=self.engine,
            generator=generator,
            sampling_params=components.sampling_params,
            eval_sampling_params=components.eval_sampling_params,
            pad_token_id=int(pad),
            ref=ref,
            critic=critic,
            kl_controller=components.kl_controller,
            sink=self.tracker,
            compute=compute,
        )

    def total_steps(self) -> int:
        t = self.config.trainer
        per_epoch = len(self.loader)
        return t.max_training_steps if t.max_training_steps is not None else t.epochs * per_epoch

    async def train(self) -> RunResult:
        t = self.config.trainer
        result = RunResult(run_dir=self.run_dir, global_step=0)
        await self._resume()
        if t.eval_before_train and self.trainer.global_step == 0:
            await self._evaluate(result)
        batches = self.loader.stream()
        while self.trainer.global_step < self.total_steps():
            # Dynamic sampling draws its refills from the same stream, so they advance the saved loader state.
            result.last_metrics = await self.trainer.train_step(next(batches), lambda: next(batches))
            step = self.trainer.global_step
            if self.eval_prompts and t.eval_interval > 0 and step % t.eval_interval == 0:
                await self._evaluate(result)
            if t.ckpt_interval > 0 and step % t.ckpt_interval == 0:
                result.checkpoint = self._save(result.last_metrics)
        if self.eval_prompts and (not result.eval_history or result.eval_history[-1][0] != self.trainer.global_step):
            await self._evaluate(result)
        result.global_step = self.trainer.global_step
        result.checkpoint = self._save(result.last_metrics)
        result.export = self._export()
        result.plot = self.tracker.finish()
        return result

    async def _evaluate(self, result: RunResult) -> None:
        if not self.eval_prompts:
            return
        metrics = await self.trainer.evaluate(self.eval_prompts)
        result.eval_history.append((self.trainer.global_step, metrics))
        self.tracker.log(metrics, self.trainer.global_step)

    async def _resume(self) -> None:
        t = self.config.trainer
        assert t.ckpt_path is not None
        path = checkpoint.resolve_resume_dir(t.resume_mode, t.ckpt_path, t.resume_path)
        if path is None:
            return
        state = checkpoint.load_checkpoint(path, read_state=self._read_models)
        self.trainer.global_step = state.global_step
        if state.loader_state is not None:
            self.loader.load_state_dict(state.loader_state)
        kl_coef = state.extra.get("kl_coef")
        if kl_coef is not None and self.trainer.kl_controller is not None:
            self.trainer.kl_controller.value = float(kl_coef)
        await self.trainer.sync_weights()
        print(f"resumed from {path} at step {state.global_step}")

    def _save(self, metrics: Metrics) -> Path:
        t = self.config.trainer
        assert t.ckpt_path is not None
        return checkpoint.save_checkpoint(
            t.ckpt_path,
            self.trainer.global_step,
            write_state=self._write_models,
            config=to_dict(self.config),
            metrics=metrics,
            extra=state_for_checkpoint(self.trainer),
            loader_state=self.loader.state_dict(),
            max_to_keep=t.max_ckpts_to_keep,
        )

    def _write_models(self, path: Path) -> None:
        checkpoint.save_models(path, self.trainer.policy, critic=self.trainer.critic)

    def _read_models(self, path: Path) -> None:
        checkpoint.load_models(path, self.trainer.policy, critic=self.trainer.critic)

    def _export(self) -> Path:
        assert self.config.trainer.export_path is not None
        path = Path(self.config.trainer.export_path) / f"global_step_{self.trainer.global_step}"
        export = getattr(self.trainer.policy, "export_hf", None)
        if export is None:
            raise TypeError(f"{type(self.trainer.policy).__name__} cannot export a Hugging Face directory")
        export(path, self.config.model.path)
        return path

    async def close(self) -> None:
        await self.engine.close()
        close = getattr(self.trainer.generator, "close", None)
        if close is not None:
            maybe = close()
            if asyncio.iscoroutine(maybe):
                await maybe
        if self.compute is not None:
            await asyncio.to_thread(self.compute.close)


def _engine_options(config: Config) -> dict[str, Any]:
    inference = config.inference
    options = dict(inference.engine_kwargs)
    if inference.engine == "vllm":
        import torch

        # The section's defaults are for GPUs; on a CPU the engine picks its own (a RAM share, eager mode).
        if torch.cuda.is_available():
            options.setdefault("gpu_memory_utilization", inference.gpu_memory_utilization)
        if inference.enforce_eager:
            options.setdefault("enforce_eager", True)
    if inference.engine == "remote" and inference.remote_urls:
        options.setdefault("base_url", inference.remote_urls[0])
    return options
