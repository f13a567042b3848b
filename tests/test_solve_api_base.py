"""`solve --api-base`: the ToT layer on an OpenAI-compatible endpoint (search/endpoint.py), driven
against a real `seed-tot serve` subprocess on 127.0.0.1 with a tiny model: greedy predictions equal
the in-process solve's, with the chat template applied by the server (chat) or no template (text);
resume; run.json names the endpoint; a bad URL, an unknown model and a refused request end in one
clear line with the records written so far kept."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("openai")
pytest.importorskip("fastapi")

from seed_tot.cli import main  # noqa: E402
from seed_tot.engine import Engine  # noqa: E402
from seed_tot.search import apply_overrides, load_settings, solve_dataset  # noqa: E402
from seed_tot.search.endpoint import EndpointConfig, EndpointEngine, EndpointError  # noqa: E402
from seed_tot.search.protocol import Example, Prompt, State  # noqa: E402
from serve_fixtures import ServerProcess, free_port, save_models  # noqa: E402
from short_task import ShortTask  # noqa: E402

SHORT_TASK = f"{Path(__file__).with_name('short_task.py')}:ShortTask"
QUESTIONS = ["apples", "pens", "pages"]


class PrefixTask(ShortTask):
    """ShortTask whose value and answer calls start the assistant's reply (an assistant prefix, as
    gsm8k's and creative_writing's do), with trailing space the server must keep."""

    def value_prompt(self, example: Example, state: State) -> Prompt:
        return Prompt(user=f"rate {example.data['question']}:{'/'.join(state.thoughts)}",
                      assistant_prefix="Rating: ", max_new_tokens=3)

    def answer_prompt(self, example: Example, state: State) -> Prompt:
        return Prompt(user=f"answer {example.data['question']}", assistant_prefix="So ", max_new_tokens=4)


@contextmanager
def serve_subprocess(*args: str, log_dir: Path):
    """`seed-tot serve ARGS` on a free loopback port (the server tests' launcher) until the block ends."""
    server = ServerProcess(list(args), Path(log_dir) / "serve.log")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny target whose tokenizer has a chat template that keeps the assistant's text as given
    (the in-process engine and the server both render prompts with it)."""
    target, _ = save_models(tmp_path_factory.mktemp("chat"))
    return target


@pytest.fixture(scope="module")
def server(chat_model):
    with serve_subprocess("--target", chat_model, "--device", "cpu", "--mode", "parallel",
                          log_dir=Path(chat_model).parent) as url:
        yield url


@pytest.fixture(scope="module")
def local_engine(chat_model):
    return Engine.from_pretrained(target=chat_model, device="cpu", load_draft=False)


@pytest.fixture()
def data(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": "1"}) + "\n" for q in QUESTIONS))
    return str(path)


def _records(out: Path) -> dict[str, dict]:
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len({r["id"] for r in records}) == len(records)
    return {r["id"]: r for r in records}


def _solve(engine, task, data, out: Path, algorithm: str = "bfs", **kw) -> dict[str, dict]:
    settings = apply_overrides(load_settings(None, base=task.config), mode="parallel", temperature=0.0)
    solve_dataset(engine, task, task.load(data), settings=settings, output_dir=out, algorithm=algorithm, **kw)
    return _records(out)


def _same_search(ours: dict[str, dict], theirs: dict[str, dict]) -> None:
    assert set(ours) == set(theirs) == {str(i) for i in range(len(QUESTIONS))}
    for key in ours:
        assert ours[key]["prediction"] == theirs[key]["prediction"], key
        assert ours[key]["steps"] == theirs[key]["steps"], key  # every thought and value alike


@pytest.mark.parametrize("algorithm", ["bfs", "dfs"])
def test_chat_prompts_on_the_server_give_the_in_process_greedy_search(server, local_engine, data, tmp_path, algorithm):
    """The server applies the chat template the in-process engine applies, continuing the assistant
    prefix (trailing space kept): every thought, value and prediction of the greedy search is equal."""
    task = PrefixTask()
    here = _solve(local_engine, task, data, tmp_path / "here", algorithm)
    with EndpointEngine(EndpointConfig(base_url=server, prompt_format="chat")) as engine:
        there = _solve(engine, task, data, tmp_path / "there", algorithm, concurrency=2)
    _same_search(here, there)
    # the counters came from the responses' usage: every generated token counted once
    for key, record in there.items():
        assert record["stats"]["thought"]["new_tokens"] > 0
        assert record["stats"]["value"]["new_tokens"] > 0


def test_text_prompts_on_the_server_give_the_in_process_greedy_search_of_a_model_without_template(
        server, local_engine, data, tmp_path, monkeypatch):
    """Text prompts go to /v1/completions as written: what the in-process engine renders for a
    tokenizer without a chat template (user + assistant prefix)."""
    task = PrefixTask()
    monkeypatch.setattr(local_engine.tokenizer, "chat_template", None)
    here = _solve(local_engine, task, data, tmp_path / "here")
    with EndpointEngine(EndpointConfig(base_url=server, prompt_format="text")) as engine:
        there = _solve(engine, task, data, tmp_path / "there")
    _same_search(here, there)


def test_the_chat_and_text_formats_differ_on_a_templated_model(server, data, tmp_path):
    """The two formats are not the same requests (else the tests above could not tell them apart)."""
    task = PrefixTask()
    with EndpointEngine(EndpointConfig(base_url=server, prompt_format="chat")) as engine:
        chat = _solve(engine, task, data, tmp_path / "chat")
    with EndpointEngine(EndpointConfig(base_url=server, prompt_format="text")) as engine:
        text = _solve(engine, task, data, tmp_path / "text")
    assert any(chat[k]["steps"] != text[k]["steps"] for k in chat)


def test_cli_solve_api_base_records_the_endpoint_resumes_and_writes_the_tree_page(server, local_engine, data,
                                                                                  tmp_path, monkeypatch):
    """The command line: a partial run, then --resume, gives one record per problem, the in-process
    predictions, and run.json naming the endpoint and model but not the key."""
    monkeypatch.setenv("SERVE_TEST_KEY", "sk-secret-123")
    out = tmp_path / "out"
    common = ["solve", SHORT_TASK, "--data", data, "--temperature", "0", "--mode", "parallel", "--output", str(out),
              "--api-base", server, "--api-key-env", "SERVE_TEST_KEY"]
    first = CliRunner().invoke(main, [*common, "--limit", "1"])
    assert first.exit_code == 0, first.output
    assert len(_records(out)) == 1
    second = CliRunner().invoke(main, [*common, "--resume", "--view"])
    assert second.exit_code == 0, second.output
    there = _records(out)
    here = _solve(local_engine, ShortTask(), data, tmp_path / "here")
    _same_search(here, there)
    run = json.loads((out / "run.json").read_text())
    assert run["endpoint"]["base_url"] == server and run["endpoint"]["model"] == run["models"]["target"]
    assert run["endpoint"]["decoding_sent"] == ["mode"]  # --mode was given: the requests carried it
    summary = json.loads((out / "summary.json").read_text())
    work = summary["endpoint"].pop("server_work")
    assert summary["endpoint"] == run["endpoint"] and summary["n"] == len(QUESTIONS)
    # the server's /metrics counted this run's requests (the resumed part's: the engine connected then)
    assert work["requests_finished_total"] > 0 and work["target_forwards_total"] > 0
    assert work["rows_per_target_forward"] >= 1
    assert (out / "tree.html").is_file()
    assert not any("sk-secret-123" in p.read_text() for p in out.iterdir() if p.suffix in (".json", ".jsonl"))


def test_unreachable_endpoint_is_one_line_and_writes_nothing(data, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["solve", SHORT_TASK, "--data", data, "--output", str(out),
                                       "--api-base", f"http://127.0.0.1:{free_port()}/v1"])
    assert result.exit_code == 1
    assert "cannot reach http://127.0.0.1:" in result.output and "Traceback" not in result.output
    assert not (out / "results.jsonl").exists() and not (out / "run.json").exists()


def test_unknown_model_name_is_refused_naming_the_served_ones(server, data, tmp_path):
    result = CliRunner().invoke(main, ["solve", SHORT_TASK, "--data", data, "--output", str(tmp_path / "out"),
                                       "--api-base", server, "--api-model", "no-such-model"])
    assert result.exit_code == 1
    assert "does not serve model 'no-such-model'" in result.output and "Traceback" not in result.output


class LongSecondProblem(ShortTask):
    """Problem 1's prompt is longer than the tiny model's context (512 positions): the server refuses it."""

    def thought_prompt(self, example: Example, state: State) -> Prompt:
        prompt = super().thought_prompt(example, state)
        return Prompt(user=prompt.user * (200 if example.id == "1" else 1))


def test_a_refused_request_ends_the_run_in_one_line_and_keeps_the_records_before_it(server, data, tmp_path):
    task = LongSecondProblem()
    out = tmp_path / "out"
    with EndpointEngine(EndpointConfig(base_url=server, prompt_format="text")) as engine:
        with pytest.raises(EndpointError, match=r"refused POST /completions with 4\d\d: ") as err:
            _solve(engine, task, data, out)
    assert "\n" not in str(err.value)
    assert list(_records(out)) == ["0"]  # the problem before the refusal, whole
    assert (out / "run.json").is_file()


def test_options_that_load_models_here_do_not_combine_with_api_base(data, tmp_path):
    result = CliRunner().invoke(main, ["solve", SHORT_TASK, "--data", data, "--output", str(tmp_path / "o"),
                                       "--api-base", "http://127.0.0.1:1/v1", "--target", "x", "--device", "cpu"])
    assert result.exit_code == 2 and "--target, --device do not apply" in result.output
    result = CliRunner().invoke(main, ["solve", SHORT_TASK, "--data", data, "--output", str(tmp_path / "o"),
                                       "--api-base", "http://127.0.0.1:1/v1", "--attention", "pool", "--compile", "on"])
    assert result.exit_code == 2 and "--attention, --compile do not apply" in result.output
    result = CliRunner().invoke(main, ["solve", SHORT_TASK, "--data", data, "--output", str(tmp_path / "o"),
                                       "--api-model", "m"])
    assert result.exit_code == 2 and "--api-model only apply with --api-base" in result.output


def test_a_url_without_scheme_is_refused():
    with pytest.raises(ValueError, match="http:// or https://"):
        EndpointConfig(base_url="127.0.0.1:8000/v1")


def test_sampled_search_on_the_server_draws_the_in_process_samples(server, local_engine, data, tmp_path):
    """Sampling (temperature 0.8): each request is seeded with the seed the in-process engine gives its
    first sequence, and the server seeds choice j with seed + j, so the thoughts drawn, and with them
    the whole search, are the in-process run's."""
    task = PrefixTask()
    settings = apply_overrides(load_settings(None, base=task.config), mode="parallel", temperature=0.8)
    solve_dataset(local_engine, task, task.load(data), settings=settings, output_dir=tmp_path / "here")
    with EndpointEngine(EndpointConfig(base_url=server)) as engine:
        solve_dataset(engine, task, task.load(data), settings=settings, output_dir=tmp_path / "there")
    here, there = _records(tmp_path / "here"), _records(tmp_path / "there")
    _same_search(here, there)
    thoughts = [t for r in here.values() for step in r["steps"] for t in step["thoughts"]]
    assert len(set(map(str, thoughts))) > 1  # samples, not one greedy answer repeated


def test_chat_prompts_to_a_model_without_template_name_the_text_format(tiny_model_dirs, data, tmp_path):
    """The server refuses chat messages for a tokenizer without a chat template; the run ends in one
    line that names the server's reason and the flag that sends such a model's prompts as text."""
    target, _ = tiny_model_dirs
    with serve_subprocess("--target", target, "--device", "cpu", "--mode", "parallel", log_dir=tmp_path) as url:
        result = CliRunner().invoke(main, ["solve", SHORT_TASK, "--data", data, "--output", str(tmp_path / "out"),
                                           "--api-base", url])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "refused POST /chat/completions with 400" in result.output
    assert "no chat template" in result.output and "--api-prompt text" in result.output


def test_server_counters_are_none_without_a_seed_tot_metrics_page():
    from seed_tot.search.endpoint import server_counters

    assert server_counters(f"http://127.0.0.1:{free_port()}/v1") is None


def test_a_busy_server_s_429_is_retried_until_every_problem_is_solved(tiny_model_dirs, data, tmp_path):
    """A server that takes one request at a time and queues none answers the others 429 with
    Retry-After; the client waits and retries, so three searches at once still all finish, with
    the predictions of the in-process run."""
    from seed_tot.search.endpoint import server_counters

    target, _ = tiny_model_dirs
    with serve_subprocess("--target", target, "--device", "cpu", "--mode", "parallel", "--max-running", "1",
                          "--max-waiting", "0", log_dir=tmp_path) as url:
        with EndpointEngine(EndpointConfig(base_url=url, prompt_format="text")) as engine:
            there = _solve(engine, ShortTask(), data, tmp_path / "there", concurrency=3)
        rejected = server_counters(url)["requests_rejected_total"]
    assert rejected > 0  # the server did refuse some: the retries were needed
    here = Engine.from_pretrained(target=target, device="cpu", load_draft=False)
    _same_search(_solve(here, ShortTask(), data, tmp_path / "here"), there)
