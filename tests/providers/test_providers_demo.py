"""`agentrt demo` end to end: the real filesystem MCP server over stdio, a real
SQLite file, the real `agentrt` command deciding from another process."""

from __future__ import annotations

import io
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentrt.accounting import AttemptOutcome, list_attempts
from agentrt.canonical import canonical_json, parse_json
from agentrt.demo import (
    INPUT_FILE,
    OUTPUT_FILE,
    DemoPaths,
    default_example_dir,
    default_state_dir,
    run_demo,
    summary_of,
)
from agentrt.errors import StoreError
from agentrt.store import RunStatus, open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

EXAMPLE_DIR = default_example_dir()
AGENTRT = str(Path(sys.executable).parent / "agentrt")


def needs_the_server() -> None:
    if not DemoPaths(Path("."), EXAMPLE_DIR).server_script.is_file():
        pytest.fail("the demo's filesystem server is not installed (make demo installs it)")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def event_types(database: Path, run_id: str) -> list[str]:
    with open_store(database, read_only=True) as store:
        return [event.type for event in store.list_events(run_id)]


def runs_of(database: Path) -> list[Any]:
    with open_store(database, read_only=True) as store:
        return store.list_runs()


async def test_demo_runs_the_whole_story_with_the_real_filesystem_server(tmp_path: Path) -> None:
    needs_the_server()
    state = tmp_path / "state"
    out = io.StringIO()

    status = await run_demo(state_dir=state, out=out)

    text = out.getvalue()
    assert status == 0, text
    paths = DemoPaths(state, EXAMPLE_DIR)
    # The write executed exactly as approved.
    readme = (paths.sandbox / INPUT_FILE).read_text()
    assert (paths.sandbox / OUTPUT_FILE).read_text() == summary_of(readme)
    # State is private: the directory 0700, the manifest and the database 0600.
    assert mode(state) == 0o700
    assert mode(paths.manifest) == 0o600
    assert mode(paths.database) == 0o600
    (run,) = runs_of(paths.database)
    assert run.status is RunStatus.COMPLETED
    types = event_types(paths.database, run.run_id)
    assert types.index("approval_requested") < types.index("approval_granted")
    assert types.count("tool_finished") == 2
    with open_store(paths.database, read_only=True) as store:
        assert store.verify_chain().ok
        (write_step,) = [s for s in store.list_steps(run.run_id) if s.tool == "fs_write_file"]
        approval = store.latest_approval(run.run_id)
    assert approval is not None and approval.args == write_step.args
    assert parse_json(write_step.args)["content"] == summary_of(readme)
    # What the operator was shown.
    assert text.startswith("agent: scripted")
    assert "write_file" in text and "destructiveHint=true" in text
    assert "hint mismatch allowed: classified local_mutation" in text
    assert text.count("fs: unclassified ") == 9
    assert f"path       {paths.sandbox.resolve() / OUTPUT_FILE}" in text
    assert "lines      9" in text and "    | # Summary of README.md" in text
    assert f"hash       {approval.approval_hash}" in text
    assert "chain intact" in text
    assert f"agentrt --db {paths.database} events {run.run_id}" in text


async def test_demo_runs_twice_with_a_fresh_run_and_a_rewritten_sandbox(tmp_path: Path) -> None:
    needs_the_server()
    state = tmp_path / "state"
    assert await run_demo(state_dir=state, out=io.StringIO()) == 0
    paths = DemoPaths(state, EXAMPLE_DIR)
    (paths.sandbox / INPUT_FILE).write_text("# tampered\n")
    (paths.sandbox / OUTPUT_FILE).write_text("stale\n")

    out = io.StringIO()
    assert await run_demo(state_dir=state, out=out) == 0, out.getvalue()

    runs = runs_of(paths.database)
    assert len(runs) == 2 and {run.status for run in runs} == {RunStatus.COMPLETED}
    assert runs[0].run_id != runs[1].run_id
    readme = (paths.sandbox / INPUT_FILE).read_text()
    assert readme != "# tampered\n"
    assert (paths.sandbox / OUTPUT_FILE).read_text() == summary_of(readme)


async def test_demo_refuses_rules_that_others_can_write_before_any_run(tmp_path: Path) -> None:
    needs_the_server()
    example = tmp_path / "example"
    example.mkdir()
    (example / "node_modules").symlink_to(EXAMPLE_DIR / "node_modules")
    rules = example / "rules.json"
    rules.write_bytes((EXAMPLE_DIR / "rules.json").read_bytes())
    rules.chmod(0o666)
    state = tmp_path / "state"
    out = io.StringIO()

    status = await run_demo(state_dir=state, example_dir=example, out=out)

    assert status == 1
    assert (
        f"refusing to read {rules}: its mode 0666 lets group or others write it" in out.getvalue()
    )
    assert not (state / "agentrt.db").exists()
    assert not (state / "sandbox" / OUTPUT_FILE).exists()


async def test_demo_refuses_rules_with_an_unknown_field(tmp_path: Path) -> None:
    needs_the_server()
    example = tmp_path / "example"
    example.mkdir()
    (example / "node_modules").symlink_to(EXAMPLE_DIR / "node_modules")
    (example / "rules.json").write_text(
        '{"write_file": {"side_effect": "local_mutation", "allow_hint_mismach": true}}'
    )
    out = io.StringIO()

    status = await run_demo(state_dir=tmp_path / "state", example_dir=example, out=out)

    assert status == 1
    assert "allow_hint_mismach" in out.getvalue()
    assert not (tmp_path / "state" / "agentrt.db").exists()


async def test_demo_refuses_a_state_dir_that_is_a_symbolic_link(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "state"
    link.symlink_to(target)
    out = io.StringIO()

    status = await run_demo(state_dir=link, out=out)

    assert status == 1
    assert f"refusing to use {link}: it is a symbolic link" in out.getvalue()
    assert list(target.iterdir()) == []


async def test_demo_refuses_a_state_dir_owned_by_another_account(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a directory another account owns needs root")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, 4242, 4242)
    out = io.StringIO()

    status = await run_demo(state_dir=state, out=out)

    assert status == 1
    assert "is owned by uid 4242, not by you" in out.getvalue()
    assert list(state.iterdir()) == []


async def test_demo_tightens_its_own_state_dir_to_owner_only(tmp_path: Path) -> None:
    needs_the_server()
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)

    assert await run_demo(state_dir=state, out=io.StringIO()) == 0

    assert mode(state) == 0o700 and mode(state / "sandbox") == 0o700


async def test_demo_with_an_unknown_model_is_a_usage_error(tmp_path: Path) -> None:
    out = io.StringIO()

    assert await run_demo(model="gpt-4", state_dir=tmp_path / "s", out=out) == 2

    assert "--model 'gpt-4' must be ollama:NAME, openai:NAME or anthropic:NAME" in out.getvalue()
    assert not (tmp_path / "s").exists()
    out = io.StringIO()
    assert await run_demo(base_url="http://127.0.0.1:9", state_dir=tmp_path / "s", out=out) == 2
    assert "--base-url names a model endpoint, so it needs --model" in out.getvalue()
    assert not (tmp_path / "s").exists()


def test_state_dir_follows_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_state_dir() == tmp_path / "agentrt"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert default_state_dir() == Path.home() / ".cache" / "agentrt"


async def wait_for_pending_approval(database: Path) -> str:
    with anyio.fail_after(30):
        while True:
            try:
                with open_store(database, read_only=True) as store:
                    for run in store.list_runs():
                        if store.waiting_approval(run.run_id) is not None:
                            return run.run_id
            except StoreError:
                pass  # not created, or not yet migrated, by the demo
            await anyio.sleep(0.1)


async def decide_from_another_process(
    database: Path, *words: str
) -> subprocess.CompletedProcess[str]:
    return await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [AGENTRT, "--db", str(database), *words],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    )


async def test_interactive_demo_waits_for_agentrt_approve_in_another_process(
    tmp_path: Path,
) -> None:
    needs_the_server()
    state = tmp_path / "state"
    paths = DemoPaths(state, EXAMPLE_DIR)
    out = io.StringIO()
    statuses: list[int] = []

    async def demo() -> None:
        statuses.append(await run_demo(state_dir=state, interactive=True, out=out))

    async with anyio.create_task_group() as group:
        group.start_soon(demo)
        run_id = await wait_for_pending_approval(paths.database)
        # Nothing is written while the run waits for the person.
        assert not (paths.sandbox / OUTPUT_FILE).exists()
        decided = await decide_from_another_process(
            paths.database, "approve", run_id, "--yes", "--by", "tester"
        )
        assert decided.returncode == 0, decided.stderr

    assert statuses == [0], out.getvalue()
    text = out.getvalue()
    assert f"agentrt --db {paths.database} approve {run_id}" in text
    assert "approved by tester" in text
    readme = (paths.sandbox / INPUT_FILE).read_text()
    assert (paths.sandbox / OUTPUT_FILE).read_text() == summary_of(readme)


async def test_interactive_demo_rejected_in_another_process_writes_nothing(
    tmp_path: Path,
) -> None:
    needs_the_server()
    state = tmp_path / "state"
    paths = DemoPaths(state, EXAMPLE_DIR)
    out = io.StringIO()
    statuses: list[int] = []

    async def demo() -> None:
        statuses.append(await run_demo(state_dir=state, interactive=True, out=out))

    async with anyio.create_task_group() as group:
        group.start_soon(demo)
        run_id = await wait_for_pending_approval(paths.database)
        decided = await decide_from_another_process(
            paths.database, "reject", run_id, "--yes", "--note", "not today"
        )
        assert decided.returncode == 0, decided.stderr

    assert statuses == [1]
    assert "the approval is rejected; the write does not run" in out.getvalue()
    assert not (paths.sandbox / OUTPUT_FILE).exists()
    (run,) = runs_of(paths.database)
    assert run.status is RunStatus.CANCELLED
    with open_store(paths.database, read_only=True) as store:
        assert store.verify_chain().ok


@pytest.mark.timeout(120)
async def test_ctrl_c_stops_between_steps_and_prints_the_resume_command_that_works(
    tmp_path: Path,
) -> None:
    needs_the_server()
    state = tmp_path / "state"
    paths = DemoPaths(state, EXAMPLE_DIR)
    script = (
        "import sys, anyio\n"
        "from pathlib import Path\n"
        "from agentrt.demo import run_demo\n"
        "sys.exit(anyio.run(lambda: run_demo(state_dir=Path(sys.argv[1]), interactive=True)))\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        run_id = await wait_for_pending_approval(paths.database)
        # The demo prints "waiting" just after the approval is recorded.
        await anyio.sleep(0.5)
        process.send_signal(signal.SIGINT)
        output, _ = await anyio.to_thread.run_sync(lambda: process.communicate(timeout=30))
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, output
    assert "stopped by Ctrl-C while waiting for the decision" in output
    assert "second Ctrl-C" not in output
    resume_line = f"agentrt demo --state-dir {state} --interactive --resume {run_id}"
    assert resume_line in output
    assert not (paths.sandbox / OUTPUT_FILE).exists()
    (run,) = runs_of(paths.database)
    assert run.status is RunStatus.WAITING_FOR_APPROVAL

    # The printed command continues the same run (approved here without --interactive).
    out = io.StringIO()
    assert await run_demo(state_dir=state, resume=run_id, out=out) == 0, out.getvalue()

    (run,) = runs_of(paths.database)
    assert run.status is RunStatus.COMPLETED
    readme = (paths.sandbox / INPUT_FILE).read_text()
    assert (paths.sandbox / OUTPUT_FILE).read_text() == summary_of(readme)


def openai_call(name: str, arguments: str) -> dict[str, Any]:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }
    return {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}


def openai_text(text: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": text}
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


async def test_demo_with_an_openai_compatible_model_runs_the_same_story(
    tmp_path: Path, model_server: Any
) -> None:
    needs_the_server()
    state = tmp_path / "state"
    sandbox = (state / "sandbox").resolve()
    written = "The sandbox README explains the demo.\n"
    model_server.answer(openai_call("fs_read_text_file", f'{{"path": "{sandbox / INPUT_FILE}"}}'))
    model_server.answer(
        openai_call(
            "fs_write_file",
            f'{{"path": "{sandbox / OUTPUT_FILE}", "content": "{written.strip()}\\n"}}',
        )
    )
    model_server.answer(openai_text("I wrote SUMMARY.md."))
    out = io.StringIO()

    status = await run_demo(
        model="openai:local-model", base_url=model_server.url + "/v1", state_dir=state, out=out
    )

    assert status == 0, out.getvalue()
    assert out.getvalue().startswith(
        f"agent: OpenAI-compatible model local-model at {model_server.url}/v1"
    )
    assert (sandbox / OUTPUT_FILE).read_text() == written
    second, third = model_server.requests[1].json(), model_server.requests[2].json()
    assert "# The agentrt demo sandbox" in second["messages"][-1]["content"]
    assert "Successfully wrote to" in third["messages"][-1]["content"]
    # The model was shown only the five classified tools.
    assert sorted(t["function"]["name"] for t in second["tools"]) == [
        "fs_get_file_info",
        "fs_list_directory",
        "fs_read_text_file",
        "fs_search_files",
        "fs_write_file",
    ]


async def test_demo_with_an_ollama_model_runs_the_same_story(
    tmp_path: Path, model_server: Any
) -> None:
    needs_the_server()
    state = tmp_path / "state"
    sandbox = (state / "sandbox").resolve()

    def ollama_call(name: str, arguments: dict[str, str]) -> dict[str, Any]:
        message = {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": name, "arguments": arguments}}
        ]}  # fmt: skip
        return {"model": "qwen3", "message": message, "done": True}

    model_server.answer(ollama_call("fs_read_text_file", {"path": str(sandbox / INPUT_FILE)}))
    model_server.answer(
        ollama_call("fs_write_file", {"path": str(sandbox / OUTPUT_FILE), "content": "short\n"})
    )
    model_server.answer({"model": "qwen3", "message": {"role": "assistant", "content": "done"}})
    out = io.StringIO()

    status = await run_demo(
        model="ollama:qwen3:30b-a3b", base_url=model_server.url, state_dir=state, out=out
    )

    assert status == 0, out.getvalue()
    assert out.getvalue().startswith("agent: Ollama model qwen3:30b-a3b")
    assert (sandbox / OUTPUT_FILE).read_text() == "short\n"
    assert [r.path for r in model_server.requests] == ["/api/chat"] * 3


async def test_model_arguments_that_are_not_json_are_recorded_verbatim_as_invalid(
    tmp_path: Path, model_server: Any
) -> None:
    needs_the_server()
    state = tmp_path / "state"
    broken = '{"path": "SUMMARY.md", "content": "never closed'
    model_server.answer(openai_call("fs_write_file", broken))
    model_server.answer(openai_text("I could not write it."))
    out = io.StringIO()

    status = await run_demo(model="openai:m", base_url=model_server.url, state_dir=state, out=out)

    assert status == 0, out.getvalue()
    database = state / "agentrt.db"
    (run,) = runs_of(database)
    with open_store(database, read_only=True) as store:
        (step,) = store.list_steps(run.run_id)
        assert store.latest_approval(run.run_id) is None
    assert (step.status, step.tool, step.args) == ("invalid", "fs_write_file", broken)
    told = model_server.requests[1].json()["messages"]
    assert told[-2]["tool_calls"][0]["function"]["arguments"] == broken
    assert told[-1]["content"].startswith("The call was not run because it was invalid: ")
    assert not (state / "sandbox" / OUTPUT_FILE).exists()


async def test_demo_model_endpoint_failure_keeps_the_run_and_prints_how_to_resume(
    tmp_path: Path, model_server: Any
) -> None:
    needs_the_server()
    state = tmp_path / "state"
    model_server.answer({"error": {"message": "model not found"}}, status=404)
    out = io.StringIO()

    status = await run_demo(model="openai:m", base_url=model_server.url, state_dir=state, out=out)

    assert status == 1
    text = out.getvalue()
    assert "answered 404: model not found" in text
    (run,) = runs_of(state / "agentrt.db")
    assert run.status is RunStatus.RUNNING
    expected = (
        f"agentrt demo --state-dir {state} --model openai:m --base-url {model_server.url}"
        f" --resume {run.run_id}"
    )
    assert expected in text


@pytest.mark.timeout(60)
async def test_ctrl_c_while_the_model_thinks_stops_at_once_without_a_step(
    tmp_path: Path, model_server: Any
) -> None:
    needs_the_server()
    state = tmp_path / "state"
    model_server.answer(openai_text("too late"), delay=30.0)
    script = (
        "import sys, anyio\n"
        "from pathlib import Path\n"
        "from agentrt.demo import run_demo\n"
        "sys.exit(anyio.run(lambda: run_demo(state_dir=Path(sys.argv[1]),"
        " model='openai:m', base_url=sys.argv[2])))\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(state), model_server.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        with anyio.fail_after(30):
            while not model_server.requests:
                await anyio.sleep(0.05)
        process.send_signal(signal.SIGINT)
        output, _ = await anyio.to_thread.run_sync(lambda: process.communicate(timeout=10))
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, output
    assert "stopped by Ctrl-C while the model was deciding" in output
    (run,) = runs_of(state / "agentrt.db")
    assert run.status is RunStatus.RUNNING
    with open_store(state / "agentrt.db", read_only=True) as store:
        assert store.list_steps(run.run_id) == []
        # The request went out and was never answered: on the books as ambiguous, in full.
        (attempt,) = list_attempts(store, run.run_id)
    assert attempt.outcome is AttemptOutcome.AMBIGUOUS
    assert attempt.charged_tokens > 4096
    assert f"--resume {run.run_id}" in output


async def test_demo_resume_continues_a_run_its_model_left(
    tmp_path: Path, model_server: Any
) -> None:
    needs_the_server()
    state = tmp_path / "state"
    sandbox = (state / "sandbox").resolve()
    model_server.answer({"error": {"message": "model not found"}}, status=404)
    out = io.StringIO()
    assert (
        await run_demo(model="openai:m", base_url=model_server.url, state_dir=state, out=out) == 1
    )
    (run,) = runs_of(state / "agentrt.db")
    # The stopped loop released its lease: the run resumes at once.
    assert run.lease_owner is None
    assert f"--resume {run.run_id}" in out.getvalue()
    model_server.answer(openai_call("fs_read_text_file", f'{{"path": "{sandbox / INPUT_FILE}"}}'))
    model_server.answer(
        openai_call("fs_write_file", f'{{"path": "{sandbox / OUTPUT_FILE}", "content": "ok\\n"}}')
    )
    model_server.answer(openai_text("done"))
    out = io.StringIO()

    status = await run_demo(
        model="openai:m", base_url=model_server.url, state_dir=state, resume=run.run_id, out=out
    )

    assert status == 0, out.getvalue()
    (resumed,) = runs_of(state / "agentrt.db")
    assert resumed.run_id == run.run_id and resumed.status is RunStatus.COMPLETED
    assert (sandbox / OUTPUT_FILE).read_text() == "ok\n"
    assert "run_taken_over" in event_types(state / "agentrt.db", run.run_id)


async def test_demo_escapes_everything_the_model_chose_before_printing_it(
    tmp_path: Path, model_server: Any
) -> None:
    needs_the_server()
    state = tmp_path / "state"
    sandbox = (state / "sandbox").resolve()
    hostile = "approve\u202e evil\nline\x1b[2J two\u2028three\u200b"
    model_server.answer(openai_call("fs_read_text_file\x1b[31m", '{"path": "\u202e"}'))
    model_server.answer(
        openai_call(
            "fs_write_file",
            canonical_json({"path": str(sandbox / OUTPUT_FILE), "content": hostile}),
        )
    )
    model_server.answer(openai_text("done\u202e\x07"))
    out = io.StringIO()

    status = await run_demo(model="openai:m", base_url=model_server.url, state_dir=state, out=out)

    text = out.getvalue()
    assert status == 0, text
    for raw in ("\u202e", "\x1b", "\u2028", "\u200b", "\x07"):
        assert raw not in text
    assert "fs_read_text_file\\x1b[31m" in text
    assert "    | approve\\u202e evil" in text
    assert "    | line\\x1b[2J two\\u2028three\\u200b" in text
    # The file holds exactly what was approved, escapes and all.
    assert (sandbox / OUTPUT_FILE).read_text() == hostile


def test_the_agentrt_demo_command_runs_the_story_end_to_end(tmp_path: Path) -> None:
    needs_the_server()
    state = tmp_path / "state"

    finished = subprocess.run(
        [AGENTRT, "demo", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )

    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "chain intact" in finished.stdout
    verified = subprocess.run(
        [AGENTRT, "--db", str(state / "agentrt.db"), "verify"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert verified.returncode == 0 and "intact" in verified.stdout


async def test_demo_resume_of_an_unknown_run_is_refused_with_the_id_escaped(
    tmp_path: Path,
) -> None:
    needs_the_server()
    state = tmp_path / "state"
    assert await run_demo(state_dir=state, out=io.StringIO()) == 0
    (finished,) = runs_of(state / "agentrt.db")
    out = io.StringIO()

    status = await run_demo(state_dir=state, resume="nope\x1b]0;owned\x07", out=out)

    assert status == 1
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert "nope\\x1b]0;owned\\x07" in text
    (still,) = runs_of(state / "agentrt.db")
    assert still == finished
