"""A call's prompt prefill on an engine: each model scores the call's prompts once per shared stretch
(shared_prefill.py), timed for the call's timeline, and the draft's share priced beforehand for
policies that weigh it against what drafting saves (`DraftPolicy.prices_prefill`)."""
from __future__ import annotations

import time

from .params import SamplingParams
from .policies.call_pricing import CallCost
from .sequence import Sequence
from .shared_prefill import prefill_prompts, tokens_to_score
from .target_features import FeatureLog


def draft_prefill_tokens(engine, seqs: list[Sequence]) -> int:
    """The prompt tokens `prefill_call` would score through the draft for these sequences."""
    store = engine.prefix_stores["draft"] if engine.target_hidden is None else None  # as prefill_call reads it
    return tokens_to_score(engine.draft_runtime, [seq.prompt for seq in seqs], store)


def prefill_call(engine, seqs: list[Sequence], with_draft: bool) -> list[dict]:
    """Prefill each model once per shared stretch of the prompts (shared_prefill.py): copies of a
    prompt share its whole prefix KV, prompts with a long common beginning share that, and a
    beginning scored by an earlier call is forked from the model's PrefixStore. Returns when each
    model scored them ({"model", "start", "end"}, time.perf_counter()): the scheduler puts them in
    the call's timeline, so a trace draws prompt scoring with its real duration."""
    prompts = [seq.prompt for seq in seqs]
    reads_features = with_draft and engine.target_hidden is not None
    marks = [{"model": "target", "start": time.perf_counter()}]
    if reads_features:  # the drafter's prefill reads the target's hidden states of the prompt
        caches, costs, hidden = prefill_prompts(engine.target_runtime, prompts, hidden=engine.target_hidden)
    else:
        caches, costs = prefill_prompts(engine.target_runtime, prompts, store=engine.prefix_stores["target"])
    marks[-1]["end"] = time.perf_counter()
    for seq, kv, cost in zip(seqs, caches, costs):
        seq.target = kv
        seq.stats.target_busy_s += cost.busy_s
        seq.stats.target_prefill_s += cost.busy_s
        seq.stats.target_prefills += cost.forwards
        seq.stats.target_prefill_tokens += cost.tokens
    features = None
    if reads_features:
        features = []
        for seq, prompt_hidden in zip(seqs, hidden):
            seq.features = FeatureLog(engine.draft.feature_size)
            if prompt_hidden is not None:
                seq.features.put(0, prompt_hidden)
            features.append(seq.features.slots(0, len(seq.prompt) - 1))
            seq.features.drop_before(len(seq.prompt) - 2)  # the first round's pending token reads f_{P-2}
    if with_draft:
        marks.append({"model": "draft", "start": time.perf_counter()})
        caches, costs = prefill_prompts(engine.draft_runtime, prompts, features=features,
                                        store=engine.prefix_stores["draft"])
        marks[-1]["end"] = time.perf_counter()
        for seq, kv, cost in zip(seqs, caches, costs):
            seq.draft = kv
            seq.stats.draft_prefills += cost.forwards
            seq.stats.draft_prefill_s += cost.busy_s
    else:
        for seq in seqs:
            seq.draft = None
    return marks


def report_lengths(future, policy, params: SamplingParams, seqs: list[Sequence], drafted: bool) -> None:
    """A priced call's output lengths and decode cost to its policy, once it has finished (not when
    failed or cancelled): what this call outputs and costs prices the next one of its kind."""
    if not future.cancelled() and future.exception() is None:
        policy.call_finished(params, [len(seq.generated) for seq in seqs], CallCost.of(seqs, drafted))
