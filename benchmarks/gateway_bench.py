"""Gateway overhead per call beside calling the engine directly, with a scripted engine so the overhead dominates.

    .venv/bin/python benchmarks/gateway_bench.py                        # 1,000 calls a row (a few seconds)
    .venv/bin/python benchmarks/gateway_bench.py --quick --json out.json  # smoke run

One process, one event loop: the gateway (``skyrl_train.gateway``) serves on 127.0.0.1 in front of a scripted engine
that answers every prompt with the same 31 precomputed ids at once (no model), and an aiohttp client with keep-alive
calls it. Each timed call is a pair, in alternating order so drifts in the machine's load hit both alike:

* **direct**: ``await engine.generate([prompt_ids], params)`` with the ids of the gateway's latest call;
* **gateway**: the HTTP request end to end, as a client sees it (client encoding and decoding included): parse and
  validate, render the chat template (or the delta), plan the merge, generate, decode, parse tool calls, record,
  answer.

Rows: the first turn of a chat (a full render), later turns of ten-turn episodes (each merged by message match,
the delta rendered), the same streamed (SSE), ``/v1/completions`` with token ids (merged by token match), and the
HTTP floor (``GET /v1/models``, no engine). Reported per row: p50 and p90 of both sides and of the per-call
difference (the overhead); the target is an overhead p50 ≤ 2 ms. Output: the table on stdout and JSON
(``--json``, default ``benchmarks/results/gateway_bench.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from _machine import host_info

from skyrl_train.gateway import Gateway, GatewayConfig
from skyrl_train.inference.base import GenerationOutput, SamplingParams
from skyrl_train.models.tiny import build_tokenizer

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "gateway_bench.json"
TARGET_MS = 2.0
TURNS = 10  # turns of one chat episode
REPLY = "The answer is 42. First add the apples, then the books, so the total is 42.\n#### 42"


@dataclass
class FastEngine:
    """An InferenceEngine answering every prompt with the same precomputed ids, without awaiting anything."""

    reply_ids: list[int]
    last_prompt: list[int] = field(default_factory=list)

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[GenerationOutput]:
        self.last_prompt = list(prompts[-1])
        ids = self.reply_ids[: params.max_tokens]
        return [GenerationOutput(list(ids), [-0.5] * len(ids), "stop") for _ in prompts]

    async def update_weights(self, weights: Iterable[Any]) -> None:
        pass

    async def pause(self) -> None:
        pass

    async def resume(self) -> None:
        pass

    async def close(self) -> None:
        pass


@dataclass
class Row:
    label: str
    direct_s: list[float] = field(default_factory=list)
    gateway_s: list[float] = field(default_factory=list)

    def add(self, direct: float | None, gateway: float) -> None:
        """One call: both sides (a pair) or the gateway side only (rows without a direct counterpart)."""
        if direct is not None:
            self.direct_s.append(direct)
        self.gateway_s.append(gateway)

    def report(self) -> dict[str, Any]:
        overhead = [g - d for g, d in zip(self.gateway_s, self.direct_s, strict=False)] if self.direct_s else []
        out: dict[str, Any] = {"label": self.label, "calls": len(self.gateway_s)}
        for name, values in (("direct", self.direct_s), ("gateway", self.gateway_s), ("overhead", overhead)):
            out[f"{name}_p50_ms"] = _quantile_ms(values, 0.5)
            out[f"{name}_p90_ms"] = _quantile_ms(values, 0.9)
        out["target_ms"] = TARGET_MS if overhead else None
        out["target_met"] = None if not overhead else out["overhead_p50_ms"] <= TARGET_MS
        return out


def _quantile_ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1e3 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


class Bench:
    """The gateway, its engine and an HTTP client on one loop."""

    def __init__(self, gateway: Gateway, engine: FastEngine, http: aiohttp.ClientSession) -> None:
        self.gateway = gateway
        self.engine = engine
        self.http = http
        self.flip = False

    async def pair(self, row: Row, call: Callable[[], Awaitable[Any]]) -> Any:
        """Time one gateway call and one direct engine call, in alternating order."""
        self.flip = not self.flip
        if self.flip or not self.engine.last_prompt:
            answer, gateway_s = await _timed(call)
            direct_s = await self.direct()
        else:
            direct_s = await self.direct()
            answer, gateway_s = await _timed(call)
        row.add(direct_s, gateway_s)
        return answer

    async def direct(self) -> float:
        params = SamplingParams(max_tokens=64)
        _, elapsed = await _timed(lambda: self.engine.generate([self.engine.last_prompt], params))
        return elapsed

    async def post(self, url: str, body: dict[str, Any]) -> Any:
        async with self.http.post(url, json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"{url} answered {response.status}: {await response.text()}")
            if body.get("stream"):
                return await response.read()
            return await response.json()


async def _timed(call: Callable[[], Awaitable[Any]]) -> tuple[Any, float]:
    start = time.perf_counter()
    answer = await call()
    return answer, time.perf_counter() - start


def question(k: int) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a careful assistant. Think step by step."},
        {"role": "user", "content": f"What is {k} + {k + 1}? Show the steps and end with #### <number>."},
    ]


async def chat_episodes(bench: Bench, episodes: int, first: Row, later: Row, streamed: Row) -> None:
    for episode in range(episodes):
        handle = bench.gateway.open_session()
        url = handle.base_url + "/chat/completions"
        messages = question(episode)
        for turn in range(TURNS):
            row = first if turn == 0 else (streamed if turn % 2 == 0 else later)
            body = {"model": "policy", "messages": messages, "max_tokens": 64, "stream": row is streamed}
            answer = await bench.pair(row, functools.partial(bench.post, url, body))
            content = REPLY if row is streamed else answer["choices"][0]["message"]["content"]
            messages = [*messages, {"role": "assistant", "content": content}]
            messages.append({"role": "user", "content": f"Check step {turn} again, then go on."})
        [sample] = bench.gateway.close_session(handle.session_id)
        assert len(sample.turns) == TURNS, "every turn of an episode must merge into one sample"


async def completion_episodes(bench: Bench, episodes: int, row: Row, tokenizer: Any) -> None:
    for episode in range(episodes):
        handle = bench.gateway.open_session()
        url = handle.base_url + "/completions"
        prompt = tokenizer.encode(f"What is {episode} + 1? Answer:", add_special_tokens=False)
        for _ in range(TURNS):
            body = {"model": "policy", "prompt": prompt, "max_tokens": 64, "return_token_ids": True}
            answer = await bench.pair(row, functools.partial(bench.post, url, body))
            prompt = [
                *prompt,
                *answer["choices"][0]["token_ids"],
                *tokenizer.encode(" Next:", add_special_tokens=False),
            ]
        assert len(bench.gateway.close_session(handle.session_id)) == 1


async def http_floor(bench: Bench, calls: int, row: Row) -> None:
    url = bench.gateway.url + "/v1/models"

    async def get() -> Any:
        async with bench.http.get(url) as response:
            return await response.json()

    for _ in range(calls):
        _, elapsed = await _timed(get)
        row.add(None, elapsed)


async def measure(calls: int) -> tuple[list[Row], dict[str, Any]]:
    tokenizer = build_tokenizer()
    engine = FastEngine([*tokenizer.encode(REPLY, add_special_tokens=False), tokenizer.eos_token_id])
    config = GatewayConfig(max_model_len=32768)
    rows = [Row(label) for label in ("chat, first turn", "chat, later turn", "chat, later turn, streamed")]
    rows += [Row("completions, token ids"), Row("HTTP floor (GET /v1/models)")]
    episodes = max(1, calls // TURNS)
    async with Gateway(engine, tokenizer, config) as gateway, aiohttp.ClientSession() as http:
        bench = Bench(gateway, engine, http)
        warm = [Row("warm-up")] * 3
        await chat_episodes(bench, 2, *warm)  # untimed: template compilation, connection set-up
        await chat_episodes(bench, episodes, rows[0], rows[1], rows[2])
        await completion_episodes(bench, episodes, rows[3], tokenizer)
        await http_floor(bench, calls, rows[4])
        stats = gateway.stats
    workload = {
        "turns_per_episode": TURNS,
        "episodes": episodes,
        "reply_tokens": len(engine.reply_ids),
        "gateway_errors": stats.errors,
        "requests": stats.requests,
    }
    return rows, workload


def table(reports: list[dict[str, Any]]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    head = f"{'row':<30} {'calls':>5} {'direct p50':>11} {'gateway p50':>12} {'p90':>8} {'overhead p50':>13} {'p90':>8}"
    lines = [head + "  target", "-" * (len(head) + 8)]
    for r in reports:
        met = {True: "ok", False: "MISSED", None: ""}[r["target_met"]]
        lines.append(
            f"{r['label']:<30} {r['calls']:>5} {ms(r['direct_p50_ms']):>11} {ms(r['gateway_p50_ms']):>12} "
            f"{ms(r['gateway_p90_ms']):>8} {ms(r['overhead_p50_ms']):>13} {ms(r['overhead_p90_ms']):>8}  {met}"
        )
    lines.append(f"(milliseconds; target: overhead p50 <= {TARGET_MS} ms)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000, help="timed calls per row (chat rows share episodes)")
    parser.add_argument("--quick", action="store_true", help="20 calls a row (2 first turns): a smoke run")
    parser.add_argument("--json", "--output", dest="output", type=Path, default=DEFAULT_OUTPUT, help="JSON report")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    calls = 20 if args.quick else args.calls
    rows, workload = asyncio.run(measure(calls))
    reports = [row.report() for row in rows]
    print(table(reports))
    result = {
        "benchmark": "gateway_bench",
        "quick": args.quick,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": host_info(),
        "workload": workload,
        "rows": reports,
        "samples_s": {row.label: {"direct": row.direct_s, "gateway": row.gateway_s} for row in rows},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
