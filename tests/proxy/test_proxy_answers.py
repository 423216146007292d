"""The answers' fixed prefixes, their isError flags, and what they never say."""

from __future__ import annotations

import pytest

from agentrt.proxy import Prefix
from agentrt.proxy._answers import Answer

NOT_ERRORS = {"PENDING_APPROVAL", "IN_PROGRESS", "INTERRUPTED", "UNKNOWN_OUTCOME", "UNRECORDED"}
ERRORS = {
    "DENIED",
    "INVALID",
    "REJECTED",
    "EXPIRED",
    "DUPLICATE",
    "BLOCKED",
    "UNAVAILABLE",
    "STALE",
    "TOOL_ERROR",
}


def every_answer() -> list[Answer]:
    return [
        Answer.pending("t", "a1"),
        Answer.interrupted("t", "a1"),
        Answer.unknown_outcome("t", "a1"),
        Answer.in_progress("t"),
        Answer.unrecorded(),
        Answer.denied("t", "no"),
        Answer.invalid("t", "bad"),
        Answer.rejected("t", "note"),
        Answer.expired("t"),
        Answer.duplicate("t", 0.0, True),
        Answer.blocked("t"),
        Answer.unavailable("busy."),
        Answer.stale("t"),
        Answer.tool_error('server "s" tool "t" reported an error: no such file'),
    ]


def test_every_prefix_is_an_error_exactly_when_the_spec_says() -> None:
    assert {str(prefix) for prefix in Prefix} == NOT_ERRORS | ERRORS
    for answer in every_answer():
        assert answer.prefix is not None
        assert answer.text.startswith(f"{answer.prefix}: ")
        assert answer.is_error is (str(answer.prefix) in ERRORS)


@pytest.mark.parametrize("answer", every_answer(), ids=lambda answer: str(answer.prefix))
def test_no_answer_names_the_operator_command_or_the_database(answer: Answer) -> None:
    # The model may tell the user where a person approves (the inbox, `agentrt approve`),
    # never how to reach the records: no database, run id, path or option.
    text = answer.text.replace("agentrt inbox", "").replace("agentrt approve command", "")
    for word in ("agentrt ", "--db", "--approval", ".db", "run id", "database", "config", "/"):
        assert word not in text


@pytest.mark.parametrize(
    "answer",
    [Answer.pending("t", "a1"), Answer.interrupted("t", "a1"), Answer.unknown_outcome("t", "a1")],
    ids=lambda answer: str(answer.prefix),
)
def test_a_waiting_answer_says_a_person_approves_in_the_inbox_or_with_agentrt_approve(
    answer: Answer,
) -> None:
    assert "a person must approve it in the agentrt inbox or with the agentrt approve command" in (
        answer.text
    )


def test_unknown_outcome_names_an_answer_that_could_not_be_read() -> None:
    text = Answer.unknown_outcome("fs_write", "a1").text
    assert "timed out" in text and "could not be read (too long or malformed)" in text


def test_an_upstream_tool_error_keeps_its_fixed_prefix() -> None:
    answer = Answer.tool_error('server "s" tool "t" reported an error: \x1b[31mno such file')
    assert answer.text.startswith('TOOL_ERROR: server "s" tool "t" reported an error: ')
    assert answer.is_error and "\x1b" not in answer.text


def test_model_and_server_text_in_prose_is_escaped_and_bounded() -> None:
    hostile = "\x1b[31m" + "\u202e" + "x" * 50_000
    for answer in (Answer.rejected("t", hostile), Answer.invalid(hostile, hostile)):
        assert "\x1b" not in answer.text and "\u202e" not in answer.text
        assert len(answer.text) < 3_000


def test_a_result_that_is_a_json_string_is_given_as_its_text() -> None:
    assert Answer.result('"hello\\nworld"').text == "hello\nworld"
    assert Answer.result('{"b":1,"a":[2]}').text == '{"b":1,"a":[2]}'
    assert Answer.result('"x"').is_error is False
