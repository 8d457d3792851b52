"""Fixtures for the generator tests: the tiny tokenizer and scripted probe envs registered under test ids."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput


class ProbeLog:
    """What the probe envs did, shared across the worker threads env calls run in."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.events: list[tuple[str, str]] = []  # (tag, event)
        self.open_envs = 0
        self.max_open_envs = 0
        self.gates: dict[str, threading.Event] = {}

    def record(self, tag: str, event: str) -> None:
        with self.lock:
            self.events.append((tag, event))

    def opened(self) -> None:
        with self.lock:
            self.open_envs += 1
            self.max_open_envs = max(self.max_open_envs, self.open_envs)

    def closed(self) -> None:
        with self.lock:
            self.open_envs -= 1

    def tagged(self, event: str) -> list[str]:
        with self.lock:
            return [tag for tag, name in self.events if name == event]

    def gate(self, name: str) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(name, threading.Event())


PROBE_LOG = ProbeLog()


class ProbeEnv(BaseTextEnv):
    """A scripted text env driven by its extras.

    extras:
        tag: name used in the log.
        steps: list of step specs (the last repeats): {"reward", "done", "observations", "sleep_s", "raise",
            "wait_for" (a gate name to block on, thread-blocking), "open" (a gate name to set)}.
        fail_in: "init" | "close" | "get_metrics" to raise there; "close_sleep_s" to block in close.
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.extras = dict(extras or {})
        self.tag = str(self.extras.get("tag", "probe"))
        self.steps: list[dict[str, Any]] = list(self.extras.get("steps", [{"reward": 1.0, "done": True}]))
        self.env_config = env_config
        PROBE_LOG.opened()
        self.closed_once = False

    def init(self, prompt: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
        PROBE_LOG.record(self.tag, "init")
        if self.extras.get("fail_in") == "init":
            raise RuntimeError("probe init failure")
        return prompt, {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        spec = self.steps[min(self.turns, len(self.steps) - 1)]
        self.turns += 1
        PROBE_LOG.record(self.tag, "step")
        if spec.get("sleep_s"):
            time.sleep(spec["sleep_s"])  # deliberately blocking, as a slow env would
        if spec.get("wait_for"):
            released = PROBE_LOG.gate(spec["wait_for"]).wait(timeout=20)
            PROBE_LOG.record(self.tag, "released" if released else "gave_up")
        if spec.get("open"):
            PROBE_LOG.gate(spec["open"]).set()
        if spec.get("raise"):
            raise RuntimeError("probe step failure")
        PROBE_LOG.record(self.tag, "stepped")
        return BaseTextEnvStepOutput(
            observations=list(spec.get("observations", [])),
            reward=float(spec.get("reward", 0.0)),
            done=bool(spec.get("done", False)),
            metadata={"action": action},
        )

    def get_metrics(self) -> dict[str, Any]:
        if self.extras.get("fail_in") == "get_metrics":
            raise RuntimeError("probe metrics failure")
        return {"steps": self.turns, "max_turns_seen": self.extras.get("max_turns"), "config": self.env_config}

    def close(self) -> None:
        if self.closed_once:
            return
        self.closed_once = True
        PROBE_LOG.closed()
        PROBE_LOG.record(self.tag, "close")
        if self.extras.get("close_sleep_s"):
            time.sleep(self.extras["close_sleep_s"])
        if self.extras.get("fail_in") == "close":
            raise RuntimeError("probe close failure")


@pytest.fixture(scope="session", autouse=True)
def _probe_env_registered() -> Iterator[None]:
    skyrl_gym.register(id="test_probe", entry_point=ProbeEnv)
    yield
    skyrl_gym.deregister("test_probe")


@pytest.fixture
def probe_log() -> ProbeLog:
    """The probe envs' shared log, emptied for each test."""
    PROBE_LOG.reset()
    return PROBE_LOG


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    """The tiny model's tokenizer (ChatML template, ``<|im_end|>`` as EOS)."""
    return AutoTokenizer.from_pretrained(tiny_model_dir)
