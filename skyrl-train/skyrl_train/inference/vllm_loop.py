"""The vLLM engine's thread: commands queued from the event loop, and the loop that serves them between steps.

:class:`~skyrl_train.inference.vllm_engine.VLLMEngine` puts commands on a thread-safe queue (new requests, aborts,
holds, calls such as weight loads, stop); :class:`StepLoop` runs on the engine thread, applies them in order and,
while requests are unfinished and the engine is not held, calls ``llm.llm_engine.step()``, resolving each request's
future when it finishes. Every future is resolved on every exit path: when the loop stops, unfinished and queued
work fails with :class:`EngineClosedError`.

After each round of commands and steps the loop records the engine's load (:attr:`StepLoop.load`, replaced whole, so
the event loop reads it without locking): from vLLM's scheduler when the engine core runs in this process; otherwise
the core is in its own process and sends its scheduler's figures with each step's outputs (vLLM's log-stats
pipeline, on for that mode: ``llm_kwargs``), which :class:`SchedulerStatsTap` keeps. Without either (a vLLM version
that has neither), the unfinished request count only.
"""

from __future__ import annotations

import concurrent.futures
import gc
import queue
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from skyrl_train.inference.base import EngineLoad, GenerationOutput, StopReason

__all__ = [
    "Abort",
    "Call",
    "Command",
    "EngineClosedError",
    "Hold",
    "Request",
    "SchedulerStatsTap",
    "StepLoop",
    "Stop",
    "Streamed",
    "Submit",
    "in_process_core",
    "scheduler_load",
    "to_generation_output",
]


class EngineClosedError(RuntimeError):
    """The engine was closed (or its thread ended); create a new one."""


@dataclass
class Streamed:
    """What a streamed request (``pause_at="token"``) has generated so far, one entry per token."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int | None] = field(default_factory=list)
    text: list[str] = field(default_factory=list)


@dataclass
class Request:
    """One prompt on its way to vLLM, and the future its caller awaits."""

    request_id: str
    prompt: list[int]
    params: Any  # vllm.SamplingParams
    future: concurrent.futures.Future[GenerationOutput]
    streamed: Streamed | None = None  # set when the request's tokens arrive step by step


@dataclass
class Submit:
    """Add these requests to vLLM's scheduler."""

    requests: list[Request]


@dataclass
class Abort:
    """Drop these requests (their callers gave up on them)."""

    request_ids: list[str]


@dataclass
class Call:
    """Run ``fn(llm)`` between two steps; its result or exception goes to ``future``."""

    fn: Callable[[Any], Any]  # called with the vllm.LLM on the engine thread
    future: concurrent.futures.Future[Any]


@dataclass
class Hold:
    """Stop (``held``) or restart stepping; ``future`` resolves once done."""

    held: bool  # True: step no more until released
    future: concurrent.futures.Future[Any]


@dataclass
class Stop:
    """End the loop; unfinished and queued work fails."""


Command = Submit | Abort | Call | Hold | Stop


class StepLoop:
    """Serves ``commands`` and steps ``llm`` on the engine thread, until a :class:`Stop`; then shuts ``llm`` down.

    ``policy_version()`` is recorded on each token of a streamed request at the step that delivered it.
    """

    def __init__(self, llm: Any, commands: queue.Queue[Command], policy_version: Callable[[], int | None]) -> None:
        self.llm = llm
        self.commands = commands
        self.policy_version = policy_version
        self.pending: dict[str, Request] = {}  # requests added to vLLM and not finished, by id
        self.held = False  # a Hold applied: the loop steps no more until released
        self.steps = 0  # engine steps run so far (each samples one token of every running request)
        self.load = EngineLoad(0, None)  # as of the latest round of commands and steps (module docstring)
        self.tap = None if in_process_core(llm) else SchedulerStatsTap.install(llm)

    def run(self) -> None:
        """Serve commands (waiting for one while nothing runs) and step, until told to stop."""
        try:
            while self._serve_commands(block=not self.pending or self.held):
                if self.pending and not self.held:
                    self._step()
                self.load = scheduler_load(self.llm, len(self.pending), self.tap)
        finally:
            _fail(self.pending.values(), EngineClosedError("the engine was closed"))
            self._fail_queued()
            llm, self.llm = self.llm, None  # the engine may outlive its thread; the LLM's memory must not
            _shutdown(llm)

    def _serve_commands(self, *, block: bool) -> bool:
        """Apply queued commands (waiting for one when ``block``); False once told to stop."""
        for command in _drain(self.commands, block):
            if isinstance(command, Stop):
                return False
            if isinstance(command, Submit):
                for request in command.requests:
                    self._add(request)
            elif isinstance(command, Hold):
                self._apply_hold(command)
            elif isinstance(command, Abort):
                live = [rid for rid in command.request_ids if self.pending.pop(rid, None) is not None]
                if live:
                    self.llm.llm_engine.abort_request(live)
            else:
                _run_call(command, self.llm)
        return True

    def _apply_hold(self, hold: Hold) -> None:
        """Stop (or restart) sampling between two engine steps; resolves ``hold.future`` when done.

        The engine thread stops stepping. An engine core in its own process would go on sampling by itself, so its
        scheduler is paused as well, and the tokens it sampled before pausing are read now: they are stamped with
        the policy version of the weights that sampled them, the one current until ``pause`` returns.
        """
        client = self.llm.llm_engine.engine_core
        try:
            if not in_process_core(self.llm):
                if hold.held:
                    client.call_utility("pause_scheduler", "keep", False)  # the cache is reset after a load
                    # The pause's reply came after every output sampled before it: they are queued here now.
                    while self.pending and not client.outputs_queue.empty():
                        self._step()
                else:
                    client.call_utility("resume_scheduler")
        except Exception as exc:  # delivered to pause() or resume(), not raised on the engine thread
            _resolve(hold.future, exc)
            return
        self.held = hold.held
        _resolve(hold.future, None)

    def _add(self, request: Request) -> None:
        from vllm.inputs import TokensPrompt

        if request.future.done():  # cancelled before it reached the engine
            return
        try:
            # LLMEngine.add_request keeps our request id on the outputs, so they map back to their futures.
            prompt = TokensPrompt(prompt_token_ids=request.prompt)
            self.llm.llm_engine.add_request(request.request_id, prompt, request.params)
        except Exception as exc:  # e.g. a prompt longer than max_model_len: only this request fails
            _resolve(request.future, exc)
            return
        self.pending[request.request_id] = request

    def _step(self) -> None:
        engine, pending = self.llm.llm_engine, self.pending
        if not engine.has_unfinished_requests():  # should not happen; never spin on requests vLLM lost
            _fail(pending.values(), RuntimeError("vLLM dropped requests without finishing them"))
            pending.clear()
            return
        try:
            outputs = engine.step()
            self.steps += 1
        except Exception as exc:  # the engine failed mid-step: everything in flight failed with it
            _fail(pending.values(), exc)
            engine.abort_request(list(pending))
            pending.clear()
            return
        for output in outputs:
            request = pending.get(output.request_id)
            if request is None:
                continue
            if request.streamed is not None:
                _accumulate(request.streamed, output, request.params, self.policy_version())
            if output.finished:
                del pending[output.request_id]
                _resolve(request.future, to_generation_output(output, request.params, request.streamed))

    def _fail_queued(self) -> None:
        closed = EngineClosedError("the engine was closed")
        for command in _drain(self.commands, block=False):
            if isinstance(command, Submit):
                _fail(command.requests, closed)
            elif isinstance(command, Call):
                _resolve(command.future, closed)


def to_generation_output(output: Any, params: Any, streamed: Streamed | None = None) -> GenerationOutput:
    """Convert a finished ``vllm.RequestOutput`` (one completion, sampled with ``vllm.SamplingParams`` ``params``).

    ``streamed``: the tokens of a request whose outputs came step by step (the last one carries only its own).
    """
    completion = output.outputs[0]
    if streamed is not None:
        token_ids, text = streamed.token_ids, "".join(streamed.text)
        logprobs = streamed.logprobs if params.logprobs is not None else None
    else:
        token_ids, text, logprobs = [int(t) for t in completion.token_ids], completion.text, None
        if params.logprobs is not None and completion.logprobs is not None:
            logprobs = _sampled_logprobs(completion, token_ids)
    reason: StopReason = "length" if completion.finish_reason == "length" else "stop"
    if completion.finish_reason not in ("stop", "length"):
        reason = "abort"
    metadata: dict[str, object] = {}
    if isinstance(completion.stop_reason, str):
        metadata["stop_string"] = completion.stop_reason
    versions = None
    if streamed is not None and token_ids and all(v is not None for v in streamed.versions):
        versions = [int(v) for v in streamed.versions if v is not None]
    return GenerationOutput(
        token_ids, logprobs, reason, text if params.detokenize else None, metadata, token_policy_versions=versions
    )


class SchedulerStatsTap:
    """The scheduler figures a separate engine-core process sent with its latest outputs.

    vLLM's ``LLMEngine.step`` hands each step's ``SchedulerStats`` (sent only with log stats on) to its output
    processor's ``update_scheduler_stats``; the tap wraps that method and keeps the latest. Runs on the engine thread.
    """

    def __init__(self, update: Callable[[Any], None]) -> None:
        self.latest: Any = None  # vllm.v1.metrics.stats.SchedulerStats, once one came
        self._update = update

    @classmethod
    def install(cls, llm: Any) -> SchedulerStatsTap | None:
        """Tap ``llm`` (a ``vllm.LLM``); None where its engine has no such method (other vLLM versions)."""
        processor = getattr(llm.llm_engine, "output_processor", None)
        update = getattr(processor, "update_scheduler_stats", None)
        if processor is None or update is None:
            return None
        tap = cls(update)
        processor.update_scheduler_stats = tap.update
        return tap

    def update(self, stats: Any) -> None:
        """Keep ``stats`` (None on steps that sent none), then do what vLLM does with it."""
        if stats is not None:
            self.latest = stats
        self._update(stats)


def scheduler_load(llm: Any, unfinished: int, tap: SchedulerStatsTap | None = None) -> EngineLoad:
    """The load of ``llm`` (a ``vllm.LLM``) with ``unfinished`` requests of ours in it; call on the engine thread.

    With the engine core in this process: its scheduler's running and waiting counts and KV-cache use. With the core
    in its own process: the figures it sent with its latest step, through ``tap``; none of ours unfinished means
    nothing runs there (the engine serves only this loop). Without either: every unfinished request counts as
    running, and waiting and KV-cache use are None.
    """
    scheduler = getattr(getattr(llm.llm_engine.engine_core, "engine_core", None), "scheduler", None)
    counts = getattr(scheduler, "get_request_counts", None)  # absent in vLLM versions before it: no split known
    if counts is not None:
        running, waiting = counts()
        usage = getattr(scheduler, "get_kv_cache_usage", None)
        return EngineLoad(int(running), int(waiting), None if usage is None else float(usage()))
    latest = tap.latest if tap is not None else None
    if latest is None:
        return EngineLoad(unfinished, None)
    if unfinished == 0:  # the latest figures may predate the last requests' end
        return EngineLoad(0, 0, 0.0)
    waiting = int(latest.num_waiting_reqs) + int(getattr(latest, "num_skipped_waiting_reqs", 0))
    return EngineLoad(int(latest.num_running_reqs), waiting, float(latest.kv_cache_usage))


def in_process_core(llm: Any) -> bool:
    """Whether vLLM's engine core runs in this process, so that it samples only when the engine thread steps it."""
    return getattr(llm.llm_engine.engine_core, "engine_core", None) is not None  # set by the in-process client


def _resolve(future: concurrent.futures.Future[Any], value: Any) -> None:
    """Resolve ``future`` with a result or exception unless its caller already gave up on it."""
    try:
        if isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)
    except concurrent.futures.InvalidStateError:  # cancelled meanwhile
        pass


def _sampled_logprobs(completion: Any, token_ids: list[int]) -> list[float]:
    return [float(step[t].logprob) for step, t in zip(completion.logprobs, token_ids, strict=True)]


def _accumulate(streamed: Streamed, output: Any, params: Any, version: int | None) -> None:
    """Add one step's new tokens of ``output`` (``RequestOutputKind.DELTA``), each sampled by policy ``version``."""
    completion = output.outputs[0]
    token_ids = [int(t) for t in completion.token_ids]
    streamed.token_ids.extend(token_ids)
    streamed.versions.extend([version] * len(token_ids))
    streamed.text.append(completion.text or "")
    if params.logprobs is not None and completion.logprobs is not None:
        streamed.logprobs.extend(_sampled_logprobs(completion, token_ids))


def _drain(commands: queue.Queue[Command], block: bool) -> Iterator[Command]:
    """Queued commands in order; with ``block``, wait for the first one."""
    try:
        yield commands.get(block=block)
        while True:
            yield commands.get_nowait()
    except queue.Empty:
        return


def _run_call(command: Call, llm: Any) -> None:
    try:
        result = command.fn(llm)
    except BaseException as exc:  # delivered to the awaiting caller, not raised on the engine thread
        _resolve(command.future, exc)
    else:
        _resolve(command.future, result)


def _fail(requests: Iterable[Request], exc: BaseException) -> None:
    for request in requests:
        _resolve(request.future, exc)


def _shutdown(llm: Any) -> None:
    """Stop the engine core (and its processes, if any) and drop the LLM's memory."""
    core = llm.llm_engine.engine_core
    core.shutdown()
    del llm
    gc.collect()
