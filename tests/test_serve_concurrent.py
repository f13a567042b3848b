"""`seed-tot serve` under many requests at once (one real server process on 127.0.0.1: serve_fixtures.py):
concurrent answers stay exact, rows of different requests share forwards, past the queue requests get
429, and the metrics read as Prometheus text."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from seed_tot import SamplingParams  # noqa: E402

from serve_fixtures import PROMPTS, client, engine, greedy, served, wait_for  # noqa: E402,F401 (fixtures)


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
    assert wait_for(served, lambda m: m["seed_tot_requests_running"] == 0)["seed_tot_requests_running"] == 0


def test_metrics_are_prometheus_text(served):
    text = httpx.get(served.base + "/metrics").text
    names = [line.split()[0] for line in text.splitlines() if line and not line.startswith("#")]
    for name in ("requests_running", "requests_waiting", "prompt_tokens_total", "completion_tokens_total",
                 "acceptance_rate", "target_forwards_total", "draft_forwards_total", "rows_per_target_forward",
                 "tokens_per_target_forward", "target_busy_fraction"):
        assert f"seed_tot_{name}" in names
        assert f"# TYPE seed_tot_{name} " in text
    assert json.dumps(served.metrics())  # every value parses as a number


def test_the_n_choices_of_a_request_share_one_scoring_of_its_prompt(served, client):
    """n=8 rows of one prompt: the target scores the prompt in one prefill forward, not eight (and the
    prompt counts once, as in usage)."""
    before = served.metrics()
    out = client.completions.create(model="tiny", prompt="Zebras graze quietly at dawn", max_tokens=3,
                                    temperature=1.0, n=8, seed=9)
    assert len(out.choices) == 8
    after = served.metrics()
    # each choice carries its row's engine counters: their prefill shares sum to the one forward too
    assert sum(c.model_extra["stats"]["target_prefills"] for c in out.choices) == pytest.approx(1.0)
    assert [c.model_extra["stats"]["new_tokens"] for c in out.choices] == [3] * 8
    assert after["seed_tot_target_prefills_total"] - before["seed_tot_target_prefills_total"] == pytest.approx(1.0)
    assert after["seed_tot_prompt_tokens_total"] - before["seed_tot_prompt_tokens_total"] == out.usage.prompt_tokens
