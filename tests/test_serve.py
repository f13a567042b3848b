"""`seed-tot serve` as a client sees it: one real server process on 127.0.0.1 (serve_fixtures.py), driven
by the official `openai` client and by raw HTTP in the legacy request shape: each answer equals the
engine's, and bad input gets its status and a message naming the field. Each test names the property it
proves; the references come from an engine over the same saved models in this process. Streaming:
test_serve_streaming.py; many requests at once: test_serve_concurrent.py."""
from __future__ import annotations

import httpx
import pytest
import torch

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from seed_tot import SamplingParams  # noqa: E402

from serve_fixtures import PROMPTS, client, engine, greedy, served  # noqa: E402,F401 (fixtures)


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
    ("/completions", {"model": "tiny", "prompt": "a", "seed": 2 ** 70}, 400, "seed", "less than"),
    ("/completions", {"model": "tiny", "prompt": ["a", "b", "c"], "n": 50}, 400, "prompt", "at most 128"),
    ("/completions", {"model": "tiny", "prompt": "a", "logprobs": 50}, 400, "logprobs", "less than"),
    ("/completions", {"model": "tiny", "prompt": "a", "presence_penalty": 0.5}, 400, "presence_penalty", "not supported"),
    ("/completions", {"model": "tiny", "prompt": "a", "logit_bias": {"5": 3}}, 400, "logit_bias", "not supported"),
    ("/completions", {"model": "tiny", "prompt": "a", "best_of": 3}, 400, "best_of", "not supported"),
    ("/completions", {"model": "tiny", "prompt": "a", "mode": "warp"}, 400, "mode", "unknown mode"),
    ("/completions", {"model": "tiny", "prompt": "a", "k_config": "0,1"}, 400, "k_config", "positive"),
    ("/completions", {"model": "tiny", "prompt": "a", "draft_policy": "magic"}, 400, "draft_policy", "unknown"),
    ("/completions", {"model": "tiny", "prompt": "a", "verify_batch": "lots"}, 400, "verify_batch", "verify_batch"),
    ("/completions", {"model": "tiny", "prompt": "a", "mode": "ar", "draft_policy": "opt-tree"}, 400, "draft_policy",
     "takes no draft policy"),
    ("/completions", {"model": "tiny", "prompt": "a", "mode": "ar", "draft_policy": "opt-tree", "stream": True}, 400,
     "draft_policy", "takes no draft policy"),
    ("/completions", {"model": "tiny", "prompt": "a", "draft_policy": "fixed", "policy_options": {"bogus": 1}}, 400,
     "draft_policy", "bogus"),
    ("/chat/completions", {"model": "tiny", "messages": []}, 400, "messages", "at least 1"),
    ("/chat/completions", {"model": "tiny", "messages": [{"role": "bot", "content": "x"}]}, 400, "messages[0].role", "bot"),
    ("/chat/completions", {"model": "tiny", "messages": [{"content": "x"}]}, 400, "messages[0].role", "missing"),
    ("/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
     400, "top_logprobs", "logprobs"),
    ("/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
     400, "max_tokens", "greater than"),
    ("/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                           "tools": [{"type": "function"}]}, 400, "tools", "not supported"),
    ("/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                           "functions": [{"name": "f"}]}, 400, "functions", "not supported"),
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


def test_draft_invariant_samples_are_the_same_in_every_mode(client, engine):
    """extra_body draft_invariant: a seed's n choices are the engine's keyed rows whatever the mode."""
    kwargs = dict(model="tiny", prompt=PROMPTS[0], max_tokens=10, temperature=1.0, n=3, seed=5)
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=5, draft_invariant=True)
    refs = [r.text for r in engine.generate([PROMPTS[0]] * 3, params, mode="ar")]
    for extra in ({"mode": "parallel"}, {"mode": "seed", "k_config": "2,1"}, {"draft_policy": "lookup"}):
        out = client.completions.create(**kwargs, extra_body={"draft_invariant": True, **extra})
        assert [c.text for c in out.choices] == refs, extra
    assert len(set(refs)) > 1
