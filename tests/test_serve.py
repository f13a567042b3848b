"""`seed-tot serve` as a client sees it: one real server process on 127.0.0.1 (a tiny float32 target and
draft, seed mode, fixed draft chains), driven by the official `openai` client and by raw HTTP in the
legacy request shape. Each test names the property it proves; the references come from an engine over
the same saved models in this process."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import torch

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from seed_tot import Engine, SamplingParams  # noqa: E402

from serve_fixtures import ServerProcess, save_models  # noqa: E402

PROMPTS = ["The cat", "Once upon a time", "2+2=", "Hello world, this is"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    target, draft = save_models(root)
    server = ServerProcess(["--target", target, "--draft", draft, "--device", "cpu", "--dtype", "float32",
                            "--draft-policy", "fixed", "--served-model-name", "tiny", "--max-running", "8",
                            "--max-waiting", "32"], root / "serve.log")
    server.target, server.draft = target, draft
    yield server
    server.stop()


@pytest.fixture(scope="module")
def engine(served):
    return Engine.from_pretrained(target=served.target, draft=served.draft, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=120)


def greedy(engine, prompt, max_tokens: int, stop=()) -> str:
    """The target alone (ar), the prompt alone: what every served greedy answer must equal."""
    params = SamplingParams(max_new_tokens=max_tokens, temperature=0, stop=stop)
    return engine.generate([prompt], params, mode="ar")[0]


def test_health_and_models_list_the_served_name(served, client):
    assert httpx.get(served.base + "/health").json() == {"status": "ok"}
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_greedy_completions_equal_the_target_alone(client, engine):
    """Several prompts in one request (the legacy list form): each choice equals Engine.generate of that
    prompt alone in ar mode, token for token, whatever shares the server's forwards."""
    out = client.completions.create(model="tiny", prompt=PROMPTS, max_tokens=12, temperature=0)
    assert [c.index for c in out.choices] == list(range(len(PROMPTS)))
    for prompt, choice in zip(PROMPTS, out.choices):
        ref = greedy(engine, prompt, 12)
        assert choice.text == ref.text
        assert choice.finish_reason == ("length" if ref.finish_reason == "length" else "stop")
    assert out.usage.prompt_tokens == sum(len(p) for p in PROMPTS)  # char tokenizer: a token per char
    assert out.usage.completion_tokens == sum(len(greedy(engine, p, 12).token_ids) for p in PROMPTS)


def test_greedy_chat_equals_the_target_alone_on_the_chat_template(client, engine):
    out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi there"}],
                                         max_tokens=10, temperature=0)
    ref = greedy(engine, engine.render_prompt("hi there"), 10)
    assert out.choices[0].message.content == ref.text
    assert out.choices[0].message.role == "assistant"
    assert out.usage.completion_tokens == len(ref.token_ids)
    # max_completion_tokens is max_tokens' newer name
    newer = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi there"}],
                                           max_completion_tokens=10, temperature=0)
    assert newer.choices[0].message.content == ref.text


def test_continue_final_message_extends_the_assistant_turn(client, engine):
    """vLLM's continue_final_message: the prompt ends inside the assistant's message, no new turn."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, "}]
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0,
                                         extra_body={"continue_final_message": True, "add_generation_prompt": False})
    rendered = engine.tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert rendered.endswith("Sure, ")
    assert out.choices[0].message.content == greedy(engine, rendered, 8).text


def test_decoding_settings_in_the_body_keep_greedy_output(client, engine):
    """mode, k_config, draft_policy and the batch settings go as extra body fields (the CLI's names);
    every mode's greedy output is the target's."""
    ref = greedy(engine, PROMPTS[1], 10).text
    for extra in ({"mode": "parallel"}, {"mode": "ar"}, {"mode": "sd", "k_config": [1, 1]},
                  {"mode": "seed", "k_config": "2,1", "verify_batch": 1, "draft_batch": "all", "n_workers": 1},
                  {"draft_policy": "lookup"}):
        out = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=10, temperature=0, extra_body=extra)
        assert out.choices[0].text == ref, extra


def test_n_seeded_samples_are_the_engines_rows_whatever_runs_beside(client, engine):
    """n choices are n rows of one engine call: with a seed, choice i is the engine's row i of
    [prompt] * n with that seed (its own generator), so the answer is reproducible."""
    kwargs = dict(model="tiny", prompt=PROMPTS[0], max_tokens=10, temperature=1.0, top_p=0.9, n=5, seed=11)
    first = client.completions.create(**kwargs, extra_body={"top_k": 40})
    again = client.completions.create(**kwargs, extra_body={"top_k": 40})
    params = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.9, top_k=40, seed=11)
    refs = engine.generate([PROMPTS[0]] * 5, params, mode="seed", draft_policy="fixed")
    assert [c.text for c in first.choices] == [r.text for r in refs]
    assert [c.text for c in again.choices] == [r.text for r in refs]
    assert len({r.text for r in refs}) > 1  # the choices are samples, not one greedy answer five times


def test_top_k_1_and_a_tiny_top_p_sample_the_greedy_token(client, engine):
    ref = greedy(engine, PROMPTS[2], 10).text
    for extra in ({"top_k": 1}, {"top_p": 1e-6}):
        top_p = extra.pop("top_p", None)
        out = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=10, temperature=1.0, n=3, seed=3,
                                        **({"top_p": top_p} if top_p else {}), extra_body=extra)
        assert [c.text for c in out.choices] == [ref] * 3


def test_stop_strings_end_the_choice_and_are_cut_from_the_text(client, engine):
    full = greedy(engine, PROMPTS[3], 16).text
    stop = full[5:7]
    out = client.completions.create(model="tiny", prompt=PROMPTS[3], max_tokens=16, temperature=0, stop=[stop, "@@@"])
    assert out.choices[0].text == full[: full.find(stop)]
    assert out.choices[0].finish_reason == "stop"
    single = client.completions.create(model="tiny", prompt=PROMPTS[3], max_tokens=16, temperature=0, stop=stop)
    assert single.choices[0].text == out.choices[0].text


def _reassemble(chunks, chat: bool):
    texts, finish, usage = {}, {}, None
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            piece = (choice.delta.content if chat else choice.text) or ""
            texts[choice.index] = texts.get(choice.index, "") + piece
            if choice.finish_reason is not None:
                finish[choice.index] = choice.finish_reason
    return texts, finish, usage


@pytest.mark.parametrize("chat", [False, True])
def test_streamed_answer_reassembled_equals_the_non_streamed(client, engine, chat):
    """n=3 seeded samples with a stop string: the streamed pieces of each choice (by index) join to the
    non-streamed text, finish_reason and usage; the usage chunk comes with include_usage."""
    stop = greedy(engine, PROMPTS[0], 12).text[3:5]
    common = dict(model="tiny", max_tokens=24, temperature=0.8, n=3, seed=5, stop=[stop])
    if chat:
        call = lambda **kw: client.chat.completions.create(messages=[{"role": "user", "content": "tell"}], **common, **kw)  # noqa: E731
    else:
        call = lambda **kw: client.completions.create(prompt=PROMPTS[0], **common, **kw)  # noqa: E731
    whole = call()
    texts, finish, usage = _reassemble(call(stream=True, stream_options={"include_usage": True}), chat)
    assert texts == {c.index: (c.message.content if chat else c.text) for c in whole.choices}
    assert finish == {c.index: c.finish_reason for c in whole.choices}
    assert usage is not None and usage.model_dump() == whole.usage.model_dump()


def test_prompt_logprobs_equal_the_targets_log_softmax(client, engine, served):
    """echo + logprobs with max_tokens 0 (a RAP reward's call): the prompt's own token log-probabilities,
    the target's log-softmax at temperature 1; the first token has none."""
    text = "The quick brown fox"
    out = client.completions.create(model="tiny", prompt=text, max_tokens=0, echo=True, logprobs=2, temperature=0)
    lp = out.choices[0].logprobs
    assert out.choices[0].text == text
    assert lp.tokens == list(text) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    ids = engine.encode([text])[0]
    with torch.no_grad():
        ref = torch.log_softmax(engine.target(torch.tensor([ids])).logits[0, :-1].float(), -1)
    expected = ref.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(lp.token_logprobs[1:]), expected, atol=1e-5)
    best = ref.max(-1).values
    assert torch.allclose(torch.tensor([max(d.values()) for d in lp.top_logprobs[1:]]), best, atol=1e-5)
    assert lp.text_offset == list(range(len(text)))


def test_generated_logprobs_are_the_targets_at_temperature_one(client, engine):
    """Sampled at temperature 0.7, the reported log-probabilities are still the target's raw
    distribution (OpenAI's and vLLM's definition), for completions and chat alike."""
    out = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=8, temperature=0.7, seed=2, logprobs=3)
    choice = out.choices[0]
    ids = engine.encode([PROMPTS[1]])[0] + engine.encode([choice.text])[0]
    with torch.no_grad():
        ref = torch.log_softmax(engine.target(torch.tensor([ids])).logits[0, :-1].float(), -1)
    n = len(PROMPTS[1])
    expected = ref.gather(1, torch.tensor(ids[1:])[:, None])[:, 0][n - 1:]
    assert torch.allclose(torch.tensor(choice.logprobs.token_logprobs), expected, atol=1e-5)
    assert all(len(d) == 3 for d in choice.logprobs.top_logprobs)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                          temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert "".join(t.token for t in content) == chat.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.logprob == pytest.approx(t.top_logprobs[0].logprob, abs=1e-6)
               for t in content)  # greedy: the chosen token is the likeliest


def test_streamed_logprobs_match_the_non_streamed(client):
    kwargs = dict(model="tiny", prompt=PROMPTS[2], max_tokens=6, temperature=0, logprobs=1, n=2)
    whole = client.completions.create(**kwargs)
    chunks = [c for c in client.completions.create(**kwargs, stream=True) if c.choices]
    streamed = {c.choices[0].index: c.choices[0].logprobs for c in chunks if c.choices[0].logprobs}
    assert {i: lp.token_logprobs for i, lp in streamed.items()} == \
           {c.index: c.logprobs.token_logprobs for c in whole.choices}


def test_legacy_request_shape_over_raw_http(served, engine):
    """The 0.x clients' JSON (Completion.create / ChatCompletion.create) posted as-is."""
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0, "stop": "\n", "n": 1,
            "user": "someone", "presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {}}
    r = httpx.post(served.url + "/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "text_completion" and data["choices"][0]["text"] == greedy(engine, PROMPTS[0], 8, ("\n",)).text
    assert set(data["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    chat = httpx.post(served.url + "/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 5, "temperature": 0, "n": 2})
    assert chat.status_code == 200, chat.text
    assert [c["index"] for c in chat.json()["choices"]] == [0, 1]
    # a prompt of token ids
    ids = httpx.post(served.url + "/completions", timeout=60,
                     json={"model": "tiny", "prompt": engine.encode([PROMPTS[0]])[0], "max_tokens": 8, "temperature": 0})
    assert ids.json()["choices"][0]["text"] == greedy(engine, PROMPTS[0], 8).text


BAD = [  # (endpoint, body, status, param, words of the message)
    ("/completions", {"model": "nope", "prompt": "a"}, 404, "model", "not served"),
    ("/completions", {"prompt": "a"}, 400, "model", "missing"),
    ("/completions", {"model": "tiny"}, 400, "prompt", "missing"),
    ("/completions", {"model": "tiny", "prompt": 5}, 400, "prompt", "prompt"),
    ("/completions", {"model": "tiny", "prompt": "a", "n": 0}, 400, "n", "greater than"),
    ("/completions", {"model": "tiny", "prompt": "a", "n": 1000}, 400, "n", "less than"),
    ("/completions", {"model": "tiny", "prompt": "a", "max_tokens": -1}, 400, "max_tokens", "greater than"),
    ("/completions", {"model": "tiny", "prompt": "a", "max_tokens": "ten"}, 400, "max_tokens", "integer"),
    ("/completions", {"model": "tiny", "prompt": "a", "max_tokens": 100000}, 400, "max_tokens", "context"),
    ("/completions", {"model": "tiny", "prompt": "a" * 600}, 400, "prompt", "context"),
    ("/completions", {"model": "tiny", "prompt": [[1, 2], [10 ** 6]]}, 400, "prompt", "vocabulary"),
    ("/completions", {"model": "tiny", "prompt": []}, 400, "prompt", "empty"),
    ("/completions", {"model": "tiny", "prompt": "a", "temperature": -0.5}, 400, "temperature", "greater than"),
    ("/completions", {"model": "tiny", "prompt": "a", "top_p": 0}, 400, "top_p", "greater than"),
    ("/completions", {"model": "tiny", "prompt": "a", "stop": [""]}, 400, "stop", "non-empty"),
    ("/completions", {"model": "tiny", "prompt": "a", "logprobs": 50}, 400, "logprobs", "less than"),
    ("/completions", {"model": "tiny", "prompt": "a", "presence_penalty": 0.5}, 400, "presence_penalty", "not supported"),
    ("/completions", {"model": "tiny", "prompt": "a", "logit_bias": {"5": 3}}, 400, "logit_bias", "not supported"),
    ("/completions", {"model": "tiny", "prompt": "a", "best_of": 3}, 400, "best_of", "not supported"),
    ("/completions", {"model": "tiny", "prompt": "a", "mode": "warp"}, 400, "mode", "unknown mode"),
    ("/completions", {"model": "tiny", "prompt": "a", "k_config": "0,1"}, 400, "k_config", "positive"),
    ("/completions", {"model": "tiny", "prompt": "a", "draft_policy": "magic"}, 400, "draft_policy", "unknown"),
    ("/completions", {"model": "tiny", "prompt": "a", "verify_batch": "lots"}, 400, "verify_batch", "verify_batch"),
    ("/chat/completions", {"model": "tiny", "messages": []}, 400, "messages", "at least 1"),
    ("/chat/completions", {"model": "tiny", "messages": [{"role": "bot", "content": "x"}]}, 400, "messages[0].role", "bot"),
    ("/chat/completions", {"model": "tiny", "messages": [{"content": "x"}]}, 400, "messages[0].role", "missing"),
    ("/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
     400, "top_logprobs", "logprobs"),
    ("/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
     400, "max_tokens", "greater than"),
    ("/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                           "tools": [{"type": "function"}]}, 400, "tools", "not supported"),
]


def test_each_bad_input_gets_its_status_and_a_message_naming_the_field(served):
    with httpx.Client(base_url=served.url, timeout=60) as http:
        for endpoint, body, status, param, words in BAD:
            r = http.post(endpoint, json=body)
            assert r.status_code == status, (body, r.text)
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["param"] == param, (body, error)
            assert words.lower() in error["message"].lower(), (body, error)
        for raw, what in ((b"{not json", "not valid JSON"), (b"[1, 2]", "object")):
            r = http.post("/completions", content=raw, headers={"content-type": "application/json"})
            assert r.status_code == 400 and what.lower() in r.json()["error"]["message"].lower(), r.text
        assert http.get("/nowhere").status_code == 404
        # the server still answers
        ok = http.post("/completions", json={"model": "tiny", "prompt": "a", "max_tokens": 2, "temperature": 0})
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 1


def test_the_openai_client_raises_its_own_error_types(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="a", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt="a", max_tokens=2, frequency_penalty=1.0)
    assert err.value.body["param"] == "frequency_penalty"


def test_32_concurrent_mixed_requests_are_all_exact_and_share_forwards(served, engine):
    """32 requests at once, of mixed n, lengths and stream flags, greedy or sampled with a seed: every
    greedy answer equals the target alone, every seeded one the engine's rows of that request alone,
    and the server's counters show more than one row per target forward (rows of different requests
    and choices in one forward)."""
    before = served.metrics()
    client = openai.AsyncOpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=300)
    cases = [(PROMPTS[i % 4], 4 + (i * 5) % 17, 1 + i % 3, i % 2 == 1) for i in range(32)]

    def temperature(n, max_tokens):
        return 0.8 if (n + max_tokens) % 4 == 0 else 0.0  # a quarter of the requests sample

    async def one(prompt, max_tokens, n, stream):
        kwargs = dict(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=temperature(n, max_tokens),
                      n=n, seed=max_tokens)
        if not stream:
            out = await client.completions.create(**kwargs)
            return {c.index: c.text for c in out.choices}
        texts: dict[int, str] = {}
        async for chunk in await client.completions.create(**kwargs, stream=True):
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
        return texts

    async def all_of():
        try:
            return await asyncio.gather(*(one(*case) for case in cases))
        finally:
            await client.close()

    answers = asyncio.run(all_of())
    assert any(temperature(n, m) for _, m, n, _ in cases) and not all(temperature(n, m) for _, m, n, _ in cases)
    for (prompt, max_tokens, n, _), answer in zip(cases, answers):
        if temperature(n, max_tokens):
            params = SamplingParams(max_new_tokens=max_tokens, temperature=0.8, seed=max_tokens)
            refs = engine.generate([prompt] * n, params, mode="seed", draft_policy="fixed")
            assert answer == {i: r.text for i, r in enumerate(refs)}
        else:
            assert answer == {i: greedy(engine, prompt, max_tokens).text for i in range(n)}
    after = served.metrics()
    rows = after["seed_tot_target_rows_total"] - before["seed_tot_target_rows_total"]
    forwards = after["seed_tot_target_forwards_total"] - before["seed_tot_target_forwards_total"]
    assert rows / forwards > 1.5
    assert after["seed_tot_requests_finished_total"] - before["seed_tot_requests_finished_total"] == 32


def test_single_choice_requests_share_forwards_across_requests(served):
    """n=1 requests alone: any row beyond one per forward belongs to another request."""
    before = served.metrics()

    async def go():
        async with httpx.AsyncClient(base_url=served.url, timeout=300) as http:
            bodies = [{"model": "tiny", "prompt": p, "max_tokens": 24, "temperature": 0} for p in PROMPTS * 2]
            return await asyncio.gather(*(http.post("/completions", json=b) for b in bodies))

    assert all(r.status_code == 200 for r in asyncio.run(go()))
    after = served.metrics()
    rows = after["seed_tot_target_rows_total"] - before["seed_tot_target_rows_total"]
    forwards = after["seed_tot_target_forwards_total"] - before["seed_tot_target_forwards_total"]
    assert rows / forwards > 1.2


def _wait_for(served, condition, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = served.metrics()
        if condition(metrics) or time.monotonic() > deadline:
            return metrics
        time.sleep(0.2)


def test_a_closed_stream_stops_its_rows_and_frees_their_kv_slots(served, engine):
    """A client that reads two chunks of a 400-token stream of n=4 and hangs up: the engine drops its rows
    at its next step (no call left, the cancelled counter up), their KV lines return to the pool, and a
    request running beside it finishes with the right answer."""
    idle = _wait_for(served, lambda m: m["seed_tot_engine_calls_active"] == 0)
    body = {"model": "tiny", "prompt": PROMPTS[3], "max_tokens": 400, "temperature": 0.9, "seed": 1, "n": 4,
            "stream": True}

    async def go():
        async with httpx.AsyncClient(base_url=served.url, timeout=300) as http:
            beside = asyncio.ensure_future(http.post("/completions", json={
                "model": "tiny", "prompt": PROMPTS[0], "max_tokens": 30, "temperature": 0}))
            async with http.stream("POST", "/completions", json=body) as stream:
                seen = 0
                async for line in stream.aiter_lines():
                    seen += line.startswith("data: ")
                    if seen == 6:
                        break
            # closed with 400 tokens of budget left; the server must notice
            return await beside

    beside = asyncio.run(go())
    assert beside.json()["choices"][0]["text"] == greedy(engine, PROMPTS[0], 30).text
    after = _wait_for(served, lambda m: m["seed_tot_engine_calls_active"] == 0
                      and m["seed_tot_kv_lines_used"] <= idle["seed_tot_kv_lines_used"] + 2, timeout_s=10)
    assert after["seed_tot_engine_calls_active"] == 0
    assert after["seed_tot_requests_cancelled_total"] == idle["seed_tot_requests_cancelled_total"] + 1
    assert after["seed_tot_requests_running"] == 0
    # the 4 rows' lines are back (the prompts' kept stretches may hold a line each: the +2 above)
    assert after["seed_tot_kv_lines_used"] <= idle["seed_tot_kv_lines_used"] + 2
    # far fewer tokens than the abandoned 4 x 400 were generated
    assert after["seed_tot_completion_tokens_total"] - idle["seed_tot_completion_tokens_total"] < 400


def test_past_the_queue_requests_get_429_with_retry_after_and_the_rest_succeed(served):
    """--max-running 8 and --max-waiting 32: of 60 requests at once, those past 40 are refused with
    429 and Retry-After, the others answered; the server then answers again."""
    async def go():
        async with httpx.AsyncClient(base_url=served.url, timeout=300,
                                     limits=httpx.Limits(max_connections=100)) as http:
            body = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 48, "temperature": 0}
            return await asyncio.gather(*(http.post("/completions", json=body) for _ in range(60)))

    responses = asyncio.run(go())
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 429}
    refused = [r for r in responses if r.status_code == 429]
    assert refused, "60 requests at once fit in 8 running + 32 waiting"
    assert all(r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "queue_full" for r in refused)
    assert codes.count(200) >= 40
    ok = httpx.post(served.url + "/completions", json={"model": "tiny", "prompt": "a", "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200


def test_bounded_loopback_load_has_no_errors(served):
    """A fixed number of requests (96) from 8 concurrent clients over loopback, ending by itself: every
    one answered 200 with a whole answer, and the server holds no request afterwards."""
    async def worker(http, k):
        codes = []
        for j in range(12):
            body = {"model": "tiny", "prompt": PROMPTS[(k + j) % 4], "max_tokens": 6, "temperature": 0.5,
                    "seed": j, "n": 1 + j % 2}
            r = await http.post("/completions", json=body)
            codes.append((r.status_code, len(r.json().get("choices", []))))
        return codes

    async def go():
        async with httpx.AsyncClient(base_url=served.url, timeout=300) as http:
            return await asyncio.gather(*(worker(http, k) for k in range(8)))

    results = [c for codes in asyncio.run(go()) for c in codes]
    assert len(results) == 96
    assert all(status == 200 for status, _ in results)
    assert all(choices == 1 + j % 2 for j, (_, choices) in enumerate(results[:12]))
    assert _wait_for(served, lambda m: m["seed_tot_requests_running"] == 0)["seed_tot_requests_running"] == 0


def test_metrics_are_prometheus_text(served):
    text = httpx.get(served.base + "/metrics").text
    names = [line.split()[0] for line in text.splitlines() if line and not line.startswith("#")]
    for name in ("requests_running", "requests_waiting", "prompt_tokens_total", "completion_tokens_total",
                 "acceptance_rate", "target_forwards_total", "draft_forwards_total", "rows_per_target_forward",
                 "tokens_per_target_forward", "target_busy_fraction"):
        assert f"seed_tot_{name}" in names
        assert f"# TYPE seed_tot_{name} " in text
    assert json.dumps(served.metrics())  # every value parses as a number


def test_a_client_that_drops_a_non_streamed_request_stops_its_rows(served):
    """A non-streamed request whose client gives up after half a second (a 4 x 400-token job): the
    server sees the connection close, cancels the engine call and frees the rows' KV lines."""
    idle = _wait_for(served, lambda m: m["seed_tot_engine_calls_active"] == 0)
    body = {"model": "tiny", "prompt": PROMPTS[2], "max_tokens": 400, "temperature": 0.9, "seed": 4, "n": 4}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(served.url + "/completions", json=body, timeout=httpx.Timeout(60, read=0.5))
    after = _wait_for(served, lambda m: m["seed_tot_requests_cancelled_total"] > idle["seed_tot_requests_cancelled_total"]
                      and m["seed_tot_engine_calls_active"] == 0
                      and m["seed_tot_kv_lines_used"] <= idle["seed_tot_kv_lines_used"] + 2, timeout_s=10)
    assert after["seed_tot_requests_cancelled_total"] == idle["seed_tot_requests_cancelled_total"] + 1
    assert after["seed_tot_engine_calls_active"] == 0 and after["seed_tot_requests_running"] == 0
    assert after["seed_tot_kv_lines_used"] <= idle["seed_tot_kv_lines_used"] + 2
