"""`seed-tot serve` streaming, as a client sees it (one real server process on 127.0.0.1: serve_fixtures.py):
streamed answers reassemble to the non-streamed ones, and a client that hangs up, streamed or not, stops
its rows and frees their KV slots."""
from __future__ import annotations

import asyncio

import httpx
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from serve_fixtures import PROMPTS, client, engine, greedy, served, wait_for  # noqa: E402,F401 (fixtures)


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


def test_streamed_logprobs_match_the_non_streamed(client):
    kwargs = dict(model="tiny", prompt=PROMPTS[2], max_tokens=6, temperature=0, logprobs=1, n=2)
    whole = client.completions.create(**kwargs)
    chunks = [c for c in client.completions.create(**kwargs, stream=True) if c.choices]
    streamed = {c.choices[0].index: c.choices[0].logprobs for c in chunks if c.choices[0].logprobs}
    assert {i: lp.token_logprobs for i, lp in streamed.items()} == \
           {c.index: c.logprobs.token_logprobs for c in whole.choices}


def test_echo_puts_the_prompt_before_the_completion_streamed_or_not(client, engine):
    kwargs = dict(model="tiny", prompt=PROMPTS[1], max_tokens=7, temperature=0, echo=True, n=2)
    whole = client.completions.create(**kwargs)
    assert [c.text for c in whole.choices] == [PROMPTS[1] + greedy(engine, PROMPTS[1], 7).text] * 2
    texts, finish, _ = _reassemble(client.completions.create(**kwargs, stream=True), chat=False)
    assert texts == {c.index: c.text for c in whole.choices}
    assert finish == {c.index: c.finish_reason for c in whole.choices}


def test_a_closed_stream_stops_its_rows_and_frees_their_kv_slots(served, engine):
    """A client that reads two chunks of a 400-token stream of n=4 and hangs up: the engine drops its rows
    at its next step (no call left, the cancelled counter up), their KV lines return to the pool, and a
    request running beside it finishes with the right answer."""
    idle = wait_for(served, lambda m: m["seed_tot_engine_calls_active"] == 0)
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
    after = wait_for(served, lambda m: m["seed_tot_engine_calls_active"] == 0
                      and m["seed_tot_kv_lines_used"] <= idle["seed_tot_kv_lines_used"] + 2, timeout_s=10)
    assert after["seed_tot_engine_calls_active"] == 0
    assert after["seed_tot_requests_cancelled_total"] == idle["seed_tot_requests_cancelled_total"] + 1
    assert after["seed_tot_requests_running"] == 0
    # the 4 rows' lines are back (the prompts' kept stretches may hold a line each: the +2 above)
    assert after["seed_tot_kv_lines_used"] <= idle["seed_tot_kv_lines_used"] + 2
    # far fewer tokens than the abandoned 4 x 400 were generated
    assert after["seed_tot_completion_tokens_total"] - idle["seed_tot_completion_tokens_total"] < 400


def test_a_client_that_drops_a_non_streamed_request_stops_its_rows(served):
    """A non-streamed request whose client gives up after half a second (a 4 x 400-token job): the
    server sees the connection close, cancels the engine call and frees the rows' KV lines."""
    idle = wait_for(served, lambda m: m["seed_tot_engine_calls_active"] == 0)
    body = {"model": "tiny", "prompt": PROMPTS[2], "max_tokens": 400, "temperature": 0.9, "seed": 4, "n": 4}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(served.url + "/completions", json=body, timeout=httpx.Timeout(60, read=0.5))
    after = wait_for(served, lambda m: m["seed_tot_requests_cancelled_total"] > idle["seed_tot_requests_cancelled_total"]
                      and m["seed_tot_engine_calls_active"] == 0
                      and m["seed_tot_kv_lines_used"] <= idle["seed_tot_kv_lines_used"] + 2, timeout_s=10)
    assert after["seed_tot_requests_cancelled_total"] == idle["seed_tot_requests_cancelled_total"] + 1
    assert after["seed_tot_engine_calls_active"] == 0 and after["seed_tot_requests_running"] == 0
    assert after["seed_tot_kv_lines_used"] <= idle["seed_tot_kv_lines_used"] + 2
