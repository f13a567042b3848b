"""Static-tree pipeline decoding (stpp) samples the target's distribution: the TV test of
test_sampling_lossless through the single-process simulation. (pipedec and pp are proven by
coupling instead: with one seed they sample exactly what ar samples, test_pipeline_ticks; stpp
verifies drafted trees, so its samples differ from ar's and only their law can be compared.)"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from conftest import noisy_copy, tiny_model
from seed_tot.engine.pipeline import PipelineConfig, simulate
from test_sampling_lossless import PROMPT, SETTINGS, VOCAB, exact_distribution, tv, tv_bound

# every sample is a whole simulated pipeline run (a draft role and two stages, one prompt at a time):
# half test_sampling_lossless's samples keep the test a few seconds and still flag a TV of about 0.15
SAMPLES = 400


def test_sampled_stpp_follows_the_target_distribution():
    setting, k_config = "top_p", (2, 2)  # a tree: sibling groups drawn without replacement
    target = tiny_model("llama", seed=21, vocab=VOCAB, layers=2)
    draft = noisy_copy(target, 0.6, seed=22)
    params = replace(SETTINGS[setting], seed=0)  # simulate gives prompt i the seed 0 + i
    exact = exact_distribution(target, params)
    bound = tv_bound(exact, SAMPLES)
    draft_law = exact_distribution(draft, params)
    assert tv(Counter({s: p * SAMPLES for s, p in draft_law.items()}), exact, SAMPLES) > bound
    outs = simulate(target, draft, [PROMPT] * SAMPLES, params,
                    PipelineConfig(mode="stpp", n_stages=2, k_config=k_config), VOCAB)
    drafted = sum(o.stats.hits for o in outs)
    assert 0.05 * SAMPLES < drafted < sum(o.stats.tokens for o in outs)  # drafts accepted and rejected
    assert tv(Counter(tuple(o.result.token_ids) for o in outs), exact, SAMPLES) < bound
