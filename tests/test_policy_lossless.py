"""Every draft policy keeps the target's distribution (TV test of test_sampling_lossless) in sd, mcsd and seed."""
from __future__ import annotations

from collections import Counter

import pytest

from test_sampling_lossless import PROMPT, SAMPLES, SETTINGS, exact_distribution, pair, tv, tv_bound  # noqa: F401 (pair: a fixture)
from seed_tot import Engine
from seed_tot.engine.policies.auto import AutoPolicy, Costs
from seed_tot.engine.policies.base import HiddenCapture
from seed_tot.engine.policies.opt_tree import OptTreePolicy
from seed_tot.engine.policies.specdec import SpecDecPolicy
from test_specdec import ConstantHead


def _policy(name: str, draft):
    if name == "opt-tree":  # picked candidates: the one-hot verifier rule
        return OptTreePolicy(n=4, delta=0.0, max_depth=2)
    if name == "specdec":
        return SpecDecPolicy(ConstantHead(0.6), h=0.5, min_len=1, max_len=2, capture=HiddenCapture(draft))
    if name == "auto-load":  # batched seed at 8 rows: flat up to 15 tokens, so rows draft 0, 1 or 2
        return AutoPolicy(Costs(0.1, 0.0, 0.001, ((1, 0.1), (15, 0.1), (64, 1.0)), ((1, 0.001), (32, 0.002))), max_len=2,
                          load="all", prefill="free")  # sampled rows planned together too
    if name == "choose":  # the draft model's chain and the suffix source's, grafted where both pay (flat costs)
        from seed_tot.engine.policies.choose import ChoosePolicy
        from seed_tot.engine.policies.suffix import SuffixSource
        return ChoosePolicy(Costs(0.1, 0.0, 0.001), SuffixSource(depth=2, factor=2, share="all"), max_len=2,
                            costs_at="calibrated")
    if name == "choose-loaded":  # sampled rows priced at the calibration's loaded round: some rounds draft, some not
        from seed_tot.engine.policies.choose import ChoosePolicy
        from seed_tot.engine.policies.suffix import SuffixSource
        loaded = ((0, 0.8), (1, 0.85), (2, 0.86), (8, 0.9))
        return ChoosePolicy(Costs(0.1, 0.0, 0.001, (), (), loaded), SuffixSource(depth=2, factor=2, share="all"),
                            max_len=2, prefill="free")
    # prefill=free: these calls must draft (a call that declines runs parallel's steps, tested apart)
    return AutoPolicy(Costs(0.1, 0.001, 0.01), max_len=2, prefill="free")


CASES = ([("opt-tree", "sd", setting) for setting in SETTINGS] + [("opt-tree", "seed", "top_k")]
         + [("specdec", "seed", "top_p"), ("auto", "sd", "temperature"), ("auto-load", "seed", "temperature")]
         # sd with SpecDec++'s head and mcsd with OPT-Tree's trees (gaps in the 2026-11-26 (d92b9b3) entry's audit of the matrix)
         + [("specdec", "sd", "temperature"), ("opt-tree", "mcsd", "temperature")]
         # choose: its suffix nodes read every earlier row's output (share=all), picked before the model's draws
         + [("choose", "sd", "temperature"), ("choose", "seed", "top_p"), ("choose-loaded", "seed", "temperature")])


@pytest.mark.parametrize("name,mode,setting", CASES)
def test_policy_samples_follow_the_target_distribution(pair, name, mode, setting):
    target, draft = pair
    params = SETTINGS[setting]
    exact = exact_distribution(target, params)
    results = Engine(target, draft).generate([PROMPT] * SAMPLES, params, mode=mode, draft_policy=_policy(name, draft),
                                             n_workers=8)
    assert sum(r.stats.accepted for r in results) > 0.05 * SAMPLES  # drafts were really accepted
    assert tv(Counter(tuple(r.token_ids) for r in results), exact, SAMPLES) < tv_bound(exact, SAMPLES)
