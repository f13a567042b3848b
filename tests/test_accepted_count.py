"""The accepted-draft counter counts only drafts that are output: a draft accepted past the stop
(here EOS) is dropped with the rest of the round, so accepted never exceeds new_tokens."""
from __future__ import annotations

import torch

from conftest import tiny_model
from seed_tot import Engine, SamplingParams

PROMPT = [3, 17, 42, 8]


def test_drafts_accepted_past_eos_are_not_counted_as_accepted():
    probe = tiny_model("llama", seed=4)
    with torch.no_grad():
        ids = torch.tensor([PROMPT])
        greedy = []
        for _ in range(3):
            nxt = int(probe(ids).logits[0, -1].argmax())
            greedy.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
    target = tiny_model("llama", seed=4, eos=greedy[1])  # the same weights, EOS at the second token
    draft = tiny_model("llama", seed=4, eos=greedy[1])  # drafts exactly what the target says
    result = Engine(target, draft).generate([PROMPT], SamplingParams(max_new_tokens=16, temperature=0),
                                            mode="sd", k_config=(1, 1, 1, 1))[0]
    assert result.token_ids == greedy[:2] and result.finish_reason == "eos"
    assert result.stats.draft_depth == 4  # one round: the whole chain drafted and accepted by the target
    assert result.stats.accepted == 2 == result.stats.new_tokens
