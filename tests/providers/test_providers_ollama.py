"""OllamaAgent against a real HTTP server on 127.0.0.1 playing Ollama's /api/chat."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrt.agent import Decision, DecisionKind, Observation, StepInput
from agentrt.providers import MAX_RESPONSE_BYTES, NO_RETRY, OllamaAgent, ProviderError
from agentrt.providers.ollama import ollama_base_url
from agentrt.tools import SideEffect, ToolSpec

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

READ = ToolSpec(
    name="read_text_file",
    description="Read a file as text.",
    input_schema={
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
    side_effect=SideEffect.READ_ONLY,
    timeout=5.0,
)


def step_input(history: list[Observation] | None = None) -> StepInput:
    return StepInput(run_id="run-1", goal="Read notes.txt.", tools=[READ], history=history or [])


def chat_answer(message: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "message": {"role": "assistant", **message}, "done": True}


async def test_ollama_tool_call_becomes_a_tool_call_with_every_number_literal_kept(
    model_server: Any,
) -> None:
    # Sent raw so the literal 1.50 reaches the adapter as written.
    model_server.answer(
        raw=b'{"model":"m","done":true,"message":{"role":"assistant","content":"",'
        b'"tool_calls":[{"function":{"name":"read_text_file",'
        b'"arguments":{"path":"/s/notes.txt","limit":1.50}}}]}}'
    )
    agent = OllamaAgent("qwen3:30b-a3b", base_url=model_server.url)

    decision = await agent.decide(step_input())

    assert decision == Decision.tool_call("read_text_file", '{"limit":1.50,"path":"/s/notes.txt"}')
    (request,) = model_server.requests
    assert request.path == "/api/chat"
    body = request.json()
    assert body["model"] == "qwen3:30b-a3b"
    assert body["stream"] is False
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_text_file",
                "description": "Read a file as text.",
                "parameters": dict(READ.input_schema),
            },
        }
    ]
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][1]["content"] == "Read notes.txt."
    assert "authorization" not in {name.lower() for name in request.headers}


async def test_ollama_text_reply_completes_the_run(model_server: Any) -> None:
    model_server.answer(chat_answer({"content": "notes.txt says hello."}))
    agent = OllamaAgent("m", base_url=model_server.url)

    decision = await agent.decide(step_input())

    assert decision == Decision.complete("notes.txt says hello.")


async def test_ollama_reply_with_neither_text_nor_call_fails_the_run(model_server: Any) -> None:
    model_server.answer(chat_answer({"content": "   "}))
    agent = OllamaAgent("m", base_url=model_server.url)

    decision = await agent.decide(step_input())

    assert decision.kind is DecisionKind.FAIL
    assert "neither text nor a tool call" in decision.reason


async def test_ollama_history_is_rendered_as_calls_and_tool_messages(model_server: Any) -> None:
    model_server.answer(chat_answer({"content": "done"}))
    agent = OllamaAgent("m", base_url=model_server.url)
    history = [
        Observation(1, "read_text_file", '{"path":"/s/notes.txt"}', "result", '"hello"'),
        Observation(2, "read_text_file", '{"path":', "invalid", "the input is not valid JSON"),
        Observation(
            3, "write_file", '{"path":"/x"}', "denied", "destructive tools are not allowed"
        ),
    ]

    await agent.decide(step_input(history))

    messages = model_server.requests[0].json()["messages"]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    assert messages[2]["tool_calls"] == [
        {"function": {"name": "read_text_file", "arguments": {"path": "/s/notes.txt"}}}
    ]
    assert messages[3] == {"role": "tool", "tool_name": "read_text_file", "content": '"hello"'}
    # A call whose arguments were not an object is told back as the exact text sent.
    assert "tool_calls" not in messages[4]
    assert '{"path":' in messages[4]["content"]
    assert messages[5]["content"].startswith("The call was not run because it was invalid: ")
    assert messages[7]["content"].startswith("The call was denied by the operator's policy: ")


async def test_ollama_error_status_is_refused_with_the_server_text_escaped(
    model_server: Any,
) -> None:
    model_server.answer({"error": 'model "evil\u202e\x1b[31m" not found'}, status=404)
    agent = OllamaAgent("evil", base_url=model_server.url)

    with pytest.raises(ProviderError) as caught:
        await agent.decide(step_input())

    message = str(caught.value)
    assert "answered 404" in message
    assert "\\u202e" in message and "\\x1b" in message
    assert "\u202e" not in message and "\x1b" not in message


async def test_ollama_redirect_is_refused_and_never_followed(
    model_server: Any, other_server: Any
) -> None:
    model_server.answer({}, status=307, headers={"Location": f"{other_server.url}/api/chat"})
    other_server.answer(chat_answer({"content": "should never be read"}))
    agent = OllamaAgent("m", base_url=model_server.url)

    with pytest.raises(ProviderError, match="redirect \\(307\\)"):
        await agent.decide(step_input())

    assert len(model_server.requests) == 1
    assert other_server.requests == []


async def test_ollama_redirect_is_refused_even_when_the_callers_client_follows_them(
    model_server: Any, other_server: Any
) -> None:
    import httpx2

    model_server.answer({}, status=302, headers={"Location": f"{other_server.url}/api/chat"})
    agent = OllamaAgent(
        "m",
        base_url=model_server.url,
        http_client_factory=lambda: httpx2.AsyncClient(follow_redirects=True),
    )

    with pytest.raises(ProviderError, match="redirects are not followed"):
        await agent.decide(step_input())

    assert other_server.requests == []


async def test_ollama_oversized_streamed_body_is_refused(model_server: Any) -> None:
    padding = "x" * (MAX_RESPONSE_BYTES + 1)
    model_server.answer(chat_answer({"content": padding}), chunked=True)
    agent = OllamaAgent("m", base_url=model_server.url)

    with pytest.raises(ProviderError, match=f"over the {MAX_RESPONSE_BYTES} bytes allowed"):
        await agent.decide(step_input())


async def test_ollama_oversized_declared_body_is_refused_before_reading_it(
    model_server: Any,
) -> None:
    model_server.answer(chat_answer({"content": "x" * 5000}))
    agent = OllamaAgent("m", base_url=model_server.url, max_response_bytes=1000)

    with pytest.raises(ProviderError, match="over the 1000 allowed"):
        await agent.decide(step_input())


async def test_ollama_body_that_is_not_json_is_refused(model_server: Any) -> None:
    model_server.answer(raw=b'{"message": {"content": "a"}, "message": {"content": "b"}}')
    agent = OllamaAgent("m", base_url=model_server.url)

    with pytest.raises(ProviderError, match="repeated"):
        await agent.decide(step_input())


async def test_ollama_unreachable_server_is_a_provider_error_naming_it() -> None:
    # Port 9 on loopback: nothing listens there in a test environment.
    agent = OllamaAgent("m", base_url="http://127.0.0.1:9", retry=NO_RETRY)

    with pytest.raises(ProviderError, match="could not be reached"):
        await agent.decide(step_input())


async def test_ollama_slow_server_hits_the_deadline(model_server: Any) -> None:
    model_server.answer(chat_answer({"content": "late"}), delay=2.0)
    agent = OllamaAgent("m", base_url=model_server.url, timeout=0.3, retry=NO_RETRY)

    with pytest.raises(ProviderError, match=r"did not answer within 0\.3 s"):
        await agent.decide(step_input())


def test_ollama_host_variable_sets_the_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_HOST", "0.0.0.0:4321")
    assert OllamaAgent("m").endpoint.base_url == "http://127.0.0.1:4321"
    monkeypatch.delenv("OLLAMA_HOST")
    assert OllamaAgent("m").endpoint.base_url == "http://127.0.0.1:11434"
    assert ollama_base_url("[::1]:8080") == "http://[::1]:8080"
    assert ollama_base_url("https://ollama.example") == "https://ollama.example:443"


def test_ollama_key_is_refused_over_plain_http_to_another_host() -> None:
    with pytest.raises(ProviderError, match="refusing to send an API key over plain http"):
        OllamaAgent("m", base_url="http://ollama.example:11434", api_key="secret")


def test_ollama_request_body_is_plain_json(model_server: Any) -> None:
    agent = OllamaAgent("m", base_url=model_server.url, options={"temperature": 0})
    body = agent.request_body(step_input())
    assert json.loads(json.dumps(body))["options"] == {"temperature": 0, "num_predict": 4096}


async def test_ollama_compressed_body_is_bounded_by_its_decoded_size(model_server: Any) -> None:
    import gzip

    inflated = json.dumps(chat_answer({"content": "z" * (MAX_RESPONSE_BYTES + 1)})).encode()
    compressed = gzip.compress(inflated)
    assert len(compressed) < MAX_RESPONSE_BYTES // 100
    # Sent compressed although the adapter asked for the plain body.
    model_server.answer(raw=compressed, headers={"Content-Encoding": "gzip"}, chunked=True)
    agent = OllamaAgent("m", base_url=model_server.url)

    with pytest.raises(ProviderError, match=f"over the {MAX_RESPONSE_BYTES} bytes allowed"):
        await agent.decide(step_input())

    assert model_server.requests[0].headers["Accept-Encoding"] == "identity"
