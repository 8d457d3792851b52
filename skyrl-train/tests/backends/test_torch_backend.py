from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from skyrl_train.algorithms import PolicyLossConfig, cross_entropy_loss
from skyrl_train.backends import ModelOutput, TrainingBackend, TrainingBatch
from skyrl_train.backends.config import BackendConfig, LoraConfig, OptimizerConfig
from skyrl_train.backends.torch_backend import TorchBackend, make_scheduler

PROMPTS = [3, 5, 2, 4, 5, 1, 3, 4]
RESPONSES = [4, 2, 5, 5, 1, 3, 4, 2]


def backend(model_dir: Path, **overrides: Any) -> TorchBackend:
    optimizer = overrides.pop("optimizer", OptimizerConfig(lr=1e-3, num_warmup_steps=0))
    fields: dict[str, Any] = {
        "micro_train_batch_size": 8,
        "micro_forward_batch_size": 8,
        "gradient_checkpointing": False,
    }
    return TorchBackend(BackendConfig(str(model_dir), optimizer=optimizer, **{**fields, **overrides}))


def hand_log_probs(model: Any, batch: TrainingBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row alone, unpadded, through transformers; log_softmax(logits / T) gathered at the response tokens."""
    T = batch.response_length
    L = batch.input_ids.shape[1]
    expected = torch.zeros(len(batch), T)
    known = torch.zeros(len(batch), T, dtype=torch.bool)
    for i in range(len(batch)):
        real = batch.attention_mask[i].bool()
        ids = batch.input_ids[i][real]
        first = int(real.nonzero()[0])  # column of ids[0]
        with torch.no_grad():
            logp = torch.log_softmax(model(ids[None]).logits[0] / temperature, dim=-1)
        for t in range(T):
            col = L - T + t
            if real[col] and col - 1 >= first:
                expected[i, t] = logp[col - 1 - first, ids[col - first]]
                known[i, t] = True
    return expected, known


def grads(b: TorchBackend) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in b.model.named_parameters() if p.grad is not None}


def params(b: TorchBackend) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in b.model.named_parameters()}


def test_is_a_training_backend(small_model_dir: Path) -> None:
    assert isinstance(backend(small_model_dir), TrainingBackend)


@pytest.mark.parametrize("packed", [False, True])
def test_forward_matches_a_hand_forward(small_model_dir: Path, make_batch: Any, packed: bool) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    b = backend(small_model_dir, remove_padding=packed, micro_forward_batch_size=3)
    out = b.forward(batch, temperature=0.7, with_entropy=True)
    reference = AutoModelForCausalLM.from_pretrained(small_model_dir)
    expected, known = hand_log_probs(reference, batch, 0.7)
    assert out.log_probs.shape == (8, batch.response_length)
    assert (out.log_probs - expected)[known].abs().max() < 1e-5
    assert (out.log_probs[~known] == 0).all()
    # Entropy of the row-0 distribution at its first predicted response token.
    real = batch.input_ids[0][batch.attention_mask[0].bool()]
    with torch.no_grad():
        logits = reference(real[None]).logits[0, PROMPTS[0] - 1] / 0.7
    entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum()
    assert abs(float(out.entropy[0, 0]) - float(entropy)) < 1e-4  # type: ignore[index]


def test_forward_is_deterministic_and_gradient_free(small_model_dir: Path, make_batch: Any) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    b = backend(small_model_dir)
    first, second = b.forward(batch), b.forward(batch)
    assert torch.equal(first.log_probs, second.log_probs)
    assert not first.log_probs.requires_grad
    assert first.entropy is None


@pytest.fixture(scope="module")
def reference_grads(small_model_dir: Path, make_batch: Any, sft_loss: Any) -> dict[str, torch.Tensor]:
    """One padded micro-batch of all 8 rows."""
    b = backend(small_model_dir, remove_padding=False)
    b.forward_backward(make_batch(PROMPTS, RESPONSES), sft_loss)
    return grads(b)


@pytest.mark.parametrize(
    "overrides",
    [
        {"micro_train_batch_size": 2},
        {"micro_train_batch_size": 1, "remove_padding": True},
        {"max_tokens_per_microbatch": 20, "remove_padding": False},
        {"max_tokens_per_microbatch": 12, "remove_padding": True},
        {"micro_train_batch_size": 8, "remove_padding": True},
        {"micro_train_batch_size": 4, "gradient_checkpointing": True},
        {"micro_train_batch_size": 3},  # 3 + 3 + 2 rows: the last micro-batch is short
    ],
    ids=["4-micro", "8-micro-packed", "tokens-padded", "tokens-packed", "packed", "checkpointing", "short-last"],
)
def test_gradients_do_not_depend_on_layout(
    small_model_dir: Path, make_batch: Any, sft_loss: Any, reference_grads: dict[str, torch.Tensor], overrides: Any
) -> None:
    b = backend(small_model_dir, **overrides)
    b.forward_backward(make_batch(PROMPTS, RESPONSES), sft_loss)
    got = grads(b)
    assert got.keys() == reference_grads.keys()
    worst = max(float((got[n] - reference_grads[n]).abs().max()) for n in got)
    assert worst < 1e-5


def test_forward_backward_metrics_are_token_weighted(small_model_dir: Path, make_batch: Any) -> None:
    batch = make_batch([2, 2], [3, 1])  # response tokens in the loss: 2 and 0
    b = backend(small_model_dir, micro_train_batch_size=1)
    calls = iter([{"m": 4.0}, {"m": 100.0}])

    def loss_fn(output: ModelOutput, micro_batch: TrainingBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return output.log_probs.sum() * 0.0 + 1.5, next(calls)

    metrics = b.forward_backward(batch, loss_fn)
    assert metrics == {"m": 4.0, "loss": 3.0}


def test_sft_loss_decreases(small_model_dir: Path, make_batch: Any) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    batch.tensors["old_log_probs"] = torch.zeros_like(batch.response_mask)
    batch.tensors["advantages"] = torch.zeros_like(batch.response_mask)
    config = PolicyLossConfig()

    def loss_fn(output: ModelOutput, mb: TrainingBatch) -> tuple[torch.Tensor, dict[str, float]]:
        t = mb.tensors
        return cross_entropy_loss(
            output.log_probs,
            t["old_log_probs"],
            t["advantages"],
            mb.response_mask,
            config,
            token_weights=t["token_weights"],
        )

    b = backend(small_model_dir, micro_train_batch_size=4, optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.0))
    losses = []
    for _ in range(20):
        losses.append(b.forward_backward(batch, loss_fn)["loss"])
        stats = b.optim_step()
        assert stats["skipped"] == 0.0
    assert losses[-1] < 0.5 * losses[0]
    assert b.global_step == 20


def test_reported_grad_norm_is_torchs_and_clipping_applies(
    small_model_dir: Path, make_batch: Any, sft_loss: Any
) -> None:
    b = backend(small_model_dir, optimizer=OptimizerConfig(lr=1e-3, max_grad_norm=0.01))
    b.forward_backward(make_batch(PROMPTS, RESPONSES), sft_loss)
    expected = torch.nn.utils.get_total_norm(list(grads(b).values()))
    stats = b.optim_step()
    assert abs(stats["grad_norm"] - float(expected)) < 1e-4 * float(expected)
    assert float(expected) > 0.01  # so clipping was active
    assert all(p.grad is None for p in b.trainable_parameters())


def test_clipping_scales_gradients_to_max_norm(small_model_dir: Path, make_batch: Any, sft_loss: Any) -> None:
    b = backend(small_model_dir, optimizer=OptimizerConfig(lr=1e-3, max_grad_norm=0.01))
    b.forward_backward(make_batch(PROMPTS, RESPONSES), sft_loss)
    seen: list[float] = []

    def record(*_: Any) -> None:  # runs after clipping, before AdamW reads the gradients
        seen.append(
            float(torch.nn.utils.get_total_norm([p.grad for p in b.trainable_parameters() if p.grad is not None]))
        )

    b.optimizer.register_step_pre_hook(record)
    b.optim_step()
    assert abs(seen[0] - 0.01) < 1e-6


def test_non_finite_gradients_skip_the_update(small_model_dir: Path, make_batch: Any, sft_loss: Any) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    b = backend(small_model_dir)
    b.forward_backward(batch, sft_loss)
    b.optim_step()
    before = params(b)
    b.forward_backward(batch, lambda out, mb: (out.log_probs.sum() * float("nan"), {}))
    stats = b.optim_step()
    assert stats["skipped"] == 1.0
    assert not math.isfinite(stats["grad_norm"])
    assert all(torch.equal(before[n], p) for n, p in params(b).items())
    b.forward_backward(batch, sft_loss)
    assert b.optim_step()["skipped"] == 0.0
    assert all(torch.isfinite(p).all() for p in b.model.parameters())


def _lrs(config: OptimizerConfig, steps: int) -> list[float]:
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=config.lr)
    scheduler = make_scheduler(optimizer, config)
    values: list[float] = []
    for _ in range(steps):
        values.append(float(scheduler.get_last_lr()[0]))
        optimizer.step()
        scheduler.step()
    return values


def test_schedulers_at_known_steps() -> None:
    assert _lrs(OptimizerConfig(lr=1.0, scheduler="constant", num_warmup_steps=3), 3) == [1.0, 1.0, 1.0]
    assert _lrs(OptimizerConfig(lr=1.0, num_warmup_steps=4), 6) == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert _lrs(OptimizerConfig(lr=1.0, num_warmup_steps=0), 2) == [1.0, 1.0]
    linear = _lrs(OptimizerConfig(lr=2.0, scheduler="linear", num_warmup_steps=2, total_steps=10), 11)
    assert linear[:3] == [0.0, 1.0, 2.0]
    assert linear[6] == pytest.approx(1.0)
    assert linear[10] == pytest.approx(0.0)
    cosine = _lrs(OptimizerConfig(lr=1.0, scheduler="cosine", total_steps=10), 11)
    assert cosine[0] == pytest.approx(1.0)
    assert cosine[5] == pytest.approx(0.5)
    assert cosine[10] == pytest.approx(0.0, abs=1e-12)


def test_optim_step_reports_the_scheduled_lr(small_model_dir: Path, make_batch: Any, sft_loss: Any) -> None:
    b = backend(small_model_dir, micro_train_batch_size=1, optimizer=OptimizerConfig(lr=1e-3, num_warmup_steps=2))
    lrs = []
    for _ in range(3):
        b.forward_backward(make_batch([2], [2]), sft_loss)
        lrs.append(b.optim_step()["lr"])
    assert lrs == pytest.approx([0.0, 5e-4, 1e-3])


def _train(b: TorchBackend, batch: TrainingBatch, loss_fn: Any, steps: int) -> None:
    for _ in range(steps):
        b.forward_backward(batch, loss_fn)
        b.optim_step()


@pytest.mark.parametrize("lora", [LoraConfig(), LoraConfig(rank=4, dropout=0.2)], ids=["full", "lora-dropout"])
def test_save_load_continues_bitwise(
    small_model_dir: Path, make_batch: Any, sft_loss: Any, tmp_path: Path, lora: LoraConfig
) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    opt = OptimizerConfig(lr=1e-2, num_warmup_steps=3)
    straight = backend(small_model_dir, lora=lora, optimizer=opt, micro_train_batch_size=4)
    _train(straight, batch, sft_loss, 4)

    first = backend(small_model_dir, lora=lora, optimizer=opt, micro_train_batch_size=4)
    _train(first, batch, sft_loss, 2)
    first.save(tmp_path / "ckpt")
    first.save(tmp_path / "ckpt")  # overwriting an existing checkpoint works
    torch.manual_seed(1234)  # the resumed run must not depend on the RNG state at load time
    resumed = backend(small_model_dir, lora=lora, optimizer=opt, micro_train_batch_size=4, seed=7)
    resumed.load(tmp_path / "ckpt")
    assert resumed.global_step == 2
    _train(resumed, batch, sft_loss, 2)

    expected, got = params(straight), params(resumed)
    assert all(torch.equal(expected[n], got[n]) for n in expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary directories left


def test_load_rejects_a_directory_that_is_not_a_checkpoint(small_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a backend checkpoint"):
        backend(small_model_dir).load(tmp_path)


def test_get_weights_uses_hf_names_once(small_model_dir: Path) -> None:
    b = backend(small_model_dir)
    names = [name for name, _ in b.get_weights()]
    reference = AutoModelForCausalLM.from_pretrained(small_model_dir)
    from safetensors.torch import load_file

    assert sorted(names) == sorted(load_file(small_model_dir / "model.safetensors"))
    assert set(names) <= set(reference.state_dict())
    assert all(not t.requires_grad for _, t in b.get_weights())


def test_export_hf_loads_with_transformers(
    small_model_dir: Path, make_batch: Any, sft_loss: Any, tmp_path: Path
) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    b = backend(small_model_dir)
    _train(b, batch, sft_loss, 2)
    b.export_hf(tmp_path / "hf")
    b.export_hf(tmp_path / "hf")  # replacing an export works
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    expected, known = hand_log_probs(loaded, batch, 1.0)
    got = b.forward(batch).log_probs
    assert (got - expected)[known].abs().max() < 1e-5
    assert (tmp_path / "hf" / "tokenizer.json").is_file()


def test_same_seed_same_training(small_model_dir: Path, make_batch: Any, sft_loss: Any) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    runs = []
    for _ in range(2):
        b = backend(small_model_dir, lora=LoraConfig(rank=2, dropout=0.1), seed=3)
        _train(b, batch, sft_loss, 2)
        runs.append(params(b))
    assert all(torch.equal(runs[0][n], runs[1][n]) for n in runs[0])


def test_missing_model_path_says_how_to_build_one(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no Hugging Face model at .*missing.*build_tiny_model"):
        TorchBackend(BackendConfig(str(tmp_path / "missing")))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: OptimizerConfig(scheduler="cosine"), "set total_steps"),
        (lambda: OptimizerConfig(scheduler="step"), "unknown scheduler"),  # type: ignore[arg-type]
        (lambda: BackendConfig("m", micro_train_batch_size=0), "positive number of rows"),
        (lambda: BackendConfig("m", max_tokens_per_microbatch=0), "-1 \\(off\\) or positive"),
        (lambda: BackendConfig("m", dtype="int8"), "unknown dtype"),  # type: ignore[arg-type]
    ],
)
def test_config_errors(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda b: b.select(slice(0, 0)), "the batch is empty"),
        (lambda b: TrainingBatch(b.input_ids, b.attention_mask[:, 1:], b.response_mask), "attention_mask"),
        (lambda b: TrainingBatch(b.input_ids, b.attention_mask, b.input_ids[:, :0].float()), "last T positions"),
        (lambda b: TrainingBatch(b.input_ids, b.attention_mask, b.response_mask, {"x": b.response_mask[:1]}), "'x'"),
    ],
)
def test_malformed_batches_are_rejected(small_model_dir: Path, make_batch: Any, edit: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        backend(small_model_dir).forward(edit(make_batch([2, 3], [2, 2])))


def test_temperature_must_be_positive(small_model_dir: Path, make_batch: Any) -> None:
    with pytest.raises(ValueError, match="temperature must be positive"):
        backend(small_model_dir).forward(make_batch([2], [2]), temperature=0.0)


def test_has_active_dropout_sees_modules_and_config_rates(small_model_dir: Path) -> None:
    assert not backend(small_model_dir).has_active_dropout()  # the tiny Qwen2: attention_dropout 0
    with_adapter_dropout = backend(small_model_dir, lora=LoraConfig(rank=4, alpha=8, dropout=0.1))
    assert with_adapter_dropout.has_active_dropout()  # LoRA's nn.Dropout on the adapter input
    b = backend(small_model_dir)
    b.model.config.attention_dropout = 0.1  # applied functionally inside attention, no module to find
    assert b.has_active_dropout()
    b.model.config.attention_dropout = 0.0
    b.model.config.router_jitter_noise = 0.01  # mixture-of-experts routers perturb their logits in training mode
    assert b.has_active_dropout()
