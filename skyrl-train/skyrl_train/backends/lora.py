"""LoRA adapters through PEFT, and the merged weights an inference engine loads.

PEFT is an optional dependency, imported only when ``lora.rank > 0``. With adapters on, only the adapter matrices
(and any ``extra_trainable`` modules, such as a critic's value head) require gradients; the base weights stay
frozen. For the weight sync and the Hugging Face export, :func:`merged_weights` folds every adapter into its
base weight, ``W + (alpha / r) · B A``, and names the result as in the original model.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from skyrl_train.backends.config import LoraConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ADAPTER = "default"  # PEFT's name for the single adapter this backend trains


def _import_peft() -> Any:
    try:
        import peft
    except ImportError as exc:
        raise ImportError(
            "LoRA (lora.rank > 0) needs the `peft` package: pip install peft "
            "(then uninstall torchvision/torchaudio if pip pulled them in next to a CPU torch)"
        ) from exc
    return peft


def apply_lora(model: PreTrainedModel, config: LoraConfig, *, extra_trainable: Sequence[str] = ()) -> nn.Module:
    """Wrap ``model`` with LoRA adapters; return the PEFT model (which owns ``model``).

    Args:
        model: the Hugging Face model; its linear layers named by ``config.target_modules`` get adapters.
        config: rank, alpha, dropout and target modules; ``config.rank`` must be positive.
        extra_trainable: top-level submodule names of ``model`` trained in full next to the adapters
            (e.g. ``"score"`` for a value head). They keep their original parameter names.
    """
    if not config.enabled:
        raise ValueError("apply_lora needs lora.rank > 0")
    peft = _import_peft()
    peft_config = peft.LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=config.target_modules,
        # Fully trained modules get no adapter ("all-linear" would otherwise adapt a value head too).
        exclude_modules=[*(config.exclude_modules or []), *extra_trainable] or None,
        bias="none",
    )
    wrapped: nn.Module = peft.get_peft_model(model, peft_config)
    for name in extra_trainable:
        for param in getattr(model, name).parameters():
            param.requires_grad_(True)
    return wrapped


def is_lora_model(model: nn.Module) -> bool:
    """Whether ``model`` is a PEFT wrapper (without importing PEFT when it is not installed)."""
    return type(model).__module__.startswith("peft.")


def unwrap(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a PEFT wrapper (with adapter layers injected), or ``model`` itself."""
    if is_lora_model(model):
        inner: nn.Module = model.get_base_model()  # type: ignore[operator]
        return inner
    return model


@torch.no_grad()
def merged_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of the model with adapters folded in, named as the original Hugging Face model.

    Adapted layers yield fresh tensors ``W + ΔW``, computed one at a time as the iterator advances (so at most one
    extra weight is alive); every other tensor is a detached view of the live parameter (copy it to keep it past
    the next optimizer step). Tied weights are yielded once, under their first name, as ``save_pretrained`` does.
    """
    inner = unwrap(model)
    adapted = _adapted_layers(inner)
    seen: set[int] = set()
    for name, tensor in inner.state_dict(keep_vars=True).items():
        if _is_adapter_tensor(name) or tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        hf_name = name.replace(".base_layer.", ".")
        value = tensor.detach()
        layer = adapted.get(hf_name)
        if layer is not None:
            value = (value + layer.get_delta_weight(ADAPTER)).to(value.dtype)
        yield hf_name, value


def _adapted_layers(inner: nn.Module) -> dict[str, Any]:
    """``{"<module>.weight": layer}`` for every layer carrying the adapter (PEFT ``LoraLayer``s)."""
    layers: dict[str, Any] = {}
    for module_name, module in inner.named_modules():
        lora_a = getattr(module, "lora_A", None)
        if isinstance(lora_a, nn.ModuleDict) and ADAPTER in lora_a and hasattr(module, "get_delta_weight"):
            layers[f"{module_name}.weight"] = module
    return layers


def _is_adapter_tensor(name: str) -> bool:
    return any(part.startswith("lora_") for part in name.split("."))
