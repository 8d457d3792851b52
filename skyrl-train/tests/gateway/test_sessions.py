"""The recording and the merge rule of skyrl_train.gateway.sessions, without HTTP or a tokenizer."""

from __future__ import annotations

import pytest

from skyrl_train.gateway.sessions import Sample, Session
from skyrl_train.inference.base import GenerationOutput

EOT = 2


def out(ids: list[int], version: int | None = None) -> GenerationOutput:
    logprobs = [-0.1 * (k + 1) for k in range(len(ids))]
    return GenerationOutput(ids, logprobs, "stop", metadata={} if version is None else {"policy_version": version})


def no_delta(start: int) -> list[int]:
    raise AssertionError("no message match expected")


def full(ids: list[int]):  # type: ignore[no-untyped-def]
    return lambda: list(ids)


def check_alignment(sample: Sample) -> None:
    assert len(sample.response_ids) == len(sample.loss_mask) == len(sample.logprobs)
    for position, (mask, logprob) in enumerate(zip(sample.loss_mask, sample.logprobs, strict=True)):
        assert mask == 1 or logprob == 0.0, position
    trained = [i for i, mask in enumerate(sample.loss_mask) if mask]
    assert trained == [i for turn in sample.turns for i in range(turn.start, turn.end)]


def test_message_match_grows_the_sample_and_appends_the_missing_end_of_turn() -> None:
    session = Session("s", EOT)
    first = session.plan(["a"], no_delta, full([10, 11]))
    assert first.via == "new"
    assert first.prompt_ids == [10, 11]
    assert session.record(first, [out([20, 21])], ["a+r1"])  # no end-of-turn token: the next turn adds one
    second = session.plan(["a", "a+r1", "a+r1+u"], lambda start: [30 + start], no_delta)  # type: ignore[arg-type]
    assert second.via == "messages"
    assert second.prompt_ids == [10, 11, 20, 21, EOT, 32]  # delta of messages 2: after the matched reply
    assert session.record(second, [out([40, EOT], version=7)], ["a+r1+u+r2"])
    [sample] = session.close()
    assert sample.prompt_ids == [10, 11]
    assert sample.response_ids == [20, 21, EOT, 32, 40, EOT]
    assert sample.loss_mask == [1, 1, 0, 0, 1, 1]
    assert sample.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.1, -0.2]
    assert [t.policy_version for t in sample.turns] == [None, 7]
    assert sample.policy_version == 7
    assert sample.policy_versions == [-1, -1, -1, -1, 7, 7]
    check_alignment(sample)
    assert session.counts.messages == 1
    assert session.counts.new == 1


def test_a_reply_that_spans_a_weight_sync_keeps_each_tokens_version() -> None:
    # The engine changed weights inside the reply: its first two tokens are of version 3, the rest of version 4.
    session = Session("s", EOT)
    versions = [3, 3, 4, 4]
    reply = GenerationOutput([20, 21, 22, EOT], [-0.1] * 4, "stop", policy_version=3, token_policy_versions=versions)
    session.record(session.plan(["a"], no_delta, full([10, 11])), [reply], ["a+r"])
    [sample] = session.close()
    assert sample.policy_versions == [3, 3, 4, 4]  # fresh tokens are not stamped with the turn's first version
    assert sample.policy_version == 3


def test_token_match_takes_the_rendered_ids_and_a_rewritten_context_splits() -> None:
    session = Session("s", EOT)
    session.record(session.plan([], no_delta, full([1, 2])), [out([5, EOT])], [None])
    merged = session.plan([], no_delta, full([1, 2, 5, EOT, 9, 9]))
    assert merged.via == "tokens"
    assert merged.new_ids == [9, 9]
    session.record(merged, [out([6, EOT])], [None])
    rewritten = session.plan([], no_delta, full([1, 2, 7, 9]))  # the reply was replaced by a summary
    assert rewritten.via == "new"
    session.record(rewritten, [out([8])], [None])
    first, second = session.close()
    assert first.response_ids == [5, EOT, 9, 9, 6, EOT]
    assert first.loss_mask == [1, 1, 0, 0, 1, 1]
    assert second.prompt_ids == [1, 2, 7, 9]
    assert second.response_ids == [8]
    assert second.loss_mask == [1]
    for sample in (first, second):
        check_alignment(sample)


def test_the_longest_matching_point_wins() -> None:
    session = Session("s", EOT)
    session.record(session.plan([], no_delta, full([1])), [out([2])], [None])
    session.record(session.plan([], no_delta, full([1, 2, 3])), [out([4])], [None])
    plan = session.plan([], no_delta, full([1, 2, 3, 4, 5]))
    assert plan.base_length == 4
    assert plan.new_ids == [5]


def test_continuing_from_inside_a_sample_forks_with_the_history_untrained() -> None:
    session = Session("s", EOT)
    session.record(session.plan(["u"], no_delta, full([1])), [out([2, EOT])], ["u+a"])
    retry = ["u", "u+a", "u+a+o"]
    session.record(session.plan(retry, lambda s: [3], no_delta), [out([4, EOT])], ["u+a+o+b"])
    again = session.plan(retry, lambda s: [3], no_delta)  # the same request once more (a retry)
    assert again.via == "messages"
    assert again.base_length == 3
    session.record(again, [out([5, EOT])], ["u+a+o+c"])
    original, fork = session.close()
    assert original.response_ids == [2, EOT, 3, 4, EOT]
    assert original.loss_mask == [1, 1, 0, 1, 1]
    assert fork.prompt_ids == [1]
    assert fork.response_ids == [2, EOT, 3, 5, EOT]
    assert fork.loss_mask == [0, 0, 0, 1, 1]
    check_alignment(fork)
    assert session.counts.forks == 1


def test_n_choices_train_each_reply_once() -> None:
    session = Session("s", EOT)
    session.record(session.plan(["u"], no_delta, full([1])), [out([2, EOT])], ["u+a"])
    plan = session.plan(["u", "u+a", "u+a+o"], lambda s: [3], no_delta)
    session.record(plan, [out([4, EOT]), out([5, EOT])], ["b", "c"])
    first, second = session.close()
    assert first.loss_mask == [1, 1, 0, 1, 1]
    assert second.response_ids == [2, EOT, 3, 5, EOT]
    assert second.loss_mask == [0, 0, 0, 1, 1]

    fresh = Session("t", EOT)
    fresh.record(fresh.plan([], no_delta, full([1])), [out([2]), out([3])], [None, None])
    assert [s.response_ids for s in fresh.close()] == [[2], [3]]  # two new samples, nothing copied


def test_a_concurrent_request_from_the_same_state_forks_when_it_records_second() -> None:
    session = Session("s", EOT)
    session.record(session.plan(["u"], no_delta, full([1])), [out([2, EOT])], ["u+a"])
    keys = ["u", "u+a", "u+a+o"]
    one, two = session.plan(keys, lambda s: [3], no_delta), session.plan(keys, lambda s: [3], no_delta)
    session.record(one, [out([4])], ["x"])
    session.record(two, [out([5])], ["y"])
    original, fork = session.close()
    assert original.response_ids[-1] == 4
    assert fork.response_ids[-1] == 5
    assert fork.loss_mask == [0, 0, 0, 1]


def test_a_closed_session_records_nothing() -> None:
    session = Session("s", EOT)
    plan = session.plan([], no_delta, full([1]))
    assert session.close() == []
    assert session.record(plan, [out([2])], [None]) is False
    assert session.samples() == []


def test_replies_without_logprobs_are_refused() -> None:
    session = Session("s", EOT)
    plan = session.plan([], no_delta, full([1]))
    with pytest.raises(ValueError, match="log-probabilities"):
        session.record(plan, [GenerationOutput([2], None, "stop")], [None])
    assert session.samples() == []
    assert session.counts.new == 0
