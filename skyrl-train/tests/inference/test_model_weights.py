"""Host offload of a served model (the local engine's sleep): buffers kept across sleeps, weights back bit for bit."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from skyrl_train.inference.model_weights import HostOffload, copy_weights


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, so that equality is bit-for-bit (``-0.0`` is not ``0.0``, NaNs compare)."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def data_ptrs(offload: HostOffload) -> dict[str, int]:
    return {name: buffer.data_ptr() for name, buffer in offload.buffers.items()}


def test_two_offloads_reuse_the_host_buffers_and_restore_the_weights_bit_for_bit(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    before = snapshot(model)
    offload = HostOffload()
    device = torch.device("cpu")

    offload.to_host(model)
    first = data_ptrs(offload)
    assert set(first) == {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}
    for name, param in model.named_parameters():  # asleep, the weights live in the buffers
        assert param.data_ptr() == first[name]
    offload.to_device(model, device)
    for name, param in model.named_parameters():  # awake, they live in memory of their own again
        assert param.data_ptr() != first[name]

    offload.to_host(model)
    assert data_ptrs(offload) == first  # the second sleep allocated nothing
    offload.to_device(model, device)

    after = model.state_dict()
    assert after.keys() == before.keys()
    for name, tensor in after.items():
        assert tensor.dtype == before[name].dtype, name
        assert tensor.shape == before[name].shape, name
        assert torch.equal(bits(tensor), bits(before[name])), name


def test_weights_loaded_while_offloaded_come_back_with_the_model() -> None:
    model = nn.Linear(3, 2)
    offload = HostOffload()
    offload.to_host(model)
    copy_weights(model, [("weight", torch.full((2, 3), 0.5)), ("bias", torch.zeros(2))])
    offload.to_device(model, torch.device("cpu"))
    assert torch.equal(model.weight, torch.full((2, 3), 0.5))
    assert torch.equal(model.bias, torch.zeros(2))


def test_a_buffer_is_allocated_anew_when_its_tensor_changes_shape() -> None:
    model = nn.Linear(3, 2)
    offload = HostOffload()
    offload.to_host(model)
    offload.to_device(model, torch.device("cpu"))
    model.weight.data = torch.ones(4, 3)
    offload.to_host(model)
    assert offload.buffers["weight"].shape == (4, 3)
    offload.to_device(model, torch.device("cpu"))
    assert torch.equal(model.weight, torch.ones(4, 3))


# Pinned buffers need CUDA: benchmarks/gpu_check.py checks the engine's sleep into them on a GPU machine.
