"""GPU check: the local engine sleeps into pinned host buffers it reuses, and wakes with the same weights and output.

Pinned (page-locked) memory exists only with CUDA, so this runs in ``gpu_check.py`` on a GPU machine; on the CPU the
buffers' reuse and the bit-for-bit restore are tested in ``skyrl-train/tests/inference/test_model_weights.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any


def check_pinned_sleep(model_dir: Path) -> dict[str, Any]:
    """``{"ok": bool, "why": str}`` after two sleep/wake cycles of a local engine on ``cuda``."""
    return {"ok": not (problems := asyncio.run(_problems(model_dir))), "why": "; ".join(problems)}


async def _problems(model_dir: Path) -> list[str]:
    import torch

    from skyrl_train.inference.base import SamplingParams
    from skyrl_train.inference.local import LocalEngine

    engine = LocalEngine.from_pretrained(model_dir, device="cuda")
    params = SamplingParams(max_tokens=6, temperature=0)
    problems: list[str] = []
    try:
        before = {name: t.detach().clone() for name, t in engine.model.state_dict().items()}
        expected = (await engine.generate([[5, 6, 7]], params))[0].token_ids
        pointers: list[dict[str, int]] = []
        for cycle in range(2):
            await engine.sleep()
            if not all(p.device.type == "cpu" and p.is_pinned() for p in engine.model.parameters()):
                problems.append(f"sleep {cycle}: a weight is not in pinned host memory")
            pointers.append({name: buffer.data_ptr() for name, buffer in engine._offload.buffers.items()})
            await engine.wake_up()
        if pointers[0] != pointers[1]:
            problems.append("the second sleep allocated new host buffers")
        changed = [n for n, t in engine.model.state_dict().items() if not torch.equal(t.cpu(), before[n].cpu())]
        if changed:
            problems.append(f"weights changed across sleeps: {changed[:3]}")
        if (await engine.generate([[5, 6, 7]], params))[0].token_ids != expected:
            problems.append("the output changed across sleeps")
    finally:
        await engine.close()
    return problems
