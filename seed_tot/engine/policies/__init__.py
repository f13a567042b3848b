"""Draft policies: how each sequence's draft tree is planned, round by round.

    fixed     the k_config shapes (the default of sd, a chain of len(k_config), mcsd, seed with a tree or on a GPU)
    opt-tree  OPT-Tree's adaptive tree: the n nodes of largest path probability, grown until a
              layer adds less than delta to the expected accepted length (opt_tree.py)
    specdec   SpecDec++: a chain that stops once a trained head predicts a rejection is likely
              enough (specdec.py; the head: head.py, trained by `seed-tot train-head`)
    auto      cost-aware: calibrated forward costs and a running acceptance estimate choose the
              draft length that maximizes tokens per second, including no draft at all; in a
              batched round, of the whole round's rows together (load-aware, auto.py); a call
              whose budget cannot repay the draft's prefill decodes without the draft (the default
              of seed on a CPU with a draft model and a chain k_config: default_policy_name)
    parallelspec  one forward of a ParallelSpec drafter ([MASK] tokens) drafts a chain of up to k+1
              or a tree whose depth-t nodes come from q_t (parallelspec.py; engine/drafters/)
              and keeps the levels that pay for their verification (level_cut.py)
    lookup    no draft model: the tokens that followed the last earlier occurrence of the context's
              last n tokens (prompt lookup decoding; prompt_lookup.py)
    suffix    no draft model: what followed the longest match in the row's, its search's and the
              run's text, scored by branch counts (SuffixDecoding; suffix.py, engine/suffix_index.py)
    choose    per row and round, the draft model's chain, the suffix draft, both grafted or none: the
              most expected accepted tokens per unit of step cost (choose.py)

The interface (base.py), designed so that a batched scheduler can drive many rows at once:
    cls.parse_options(**options) -> dict                     the options read and checked without an engine
                                                             (check_policy_options: a command's up-front check)
    policy.drafts_call(prefill_tokens, rows, params, load) -> bool  before a call: False runs it without the draft
                                                             (asked only where policy.prices_prefill)
    policy.call_finished(params, new_tokens, cost)           after such a call: each row's new tokens, and
                                                             what its decode cost (call_pricing.CallCost)
    policy.plan_batch(seqs, rows)                            before a batched round: its rows, the round's size
    policy.begin(seq, params, vocab_size) -> DraftRound      one sequence, one round
    round.first_feed() -> Feed | None                        entries for the draft (None: no draft)
    round.step(logits, hidden) -> Feed | None                after each draft forward; the next feed
    round.finish() -> (DraftTree, node_entry)                 the tree to verify and, per node fed to
                                                             the draft, its draft-cache entry
    policy.observe(seq, tree, acceptance)                     after verification (estimates, records)
A round never calls a model: the one driver (speculative.draft_rows) puts every active row's feed
into one draft forward per step, a row alone being a batch of one. `round.needs_hidden` asks for the
draft's final hidden states of the fed entries (`policy.capture`, a thread-local lm_head pre-hook,
provides them row by row).
Per-sequence state lives in the policy keyed by the sequence object and is dropped when the
sequence is done; nothing here starts threads or holds locks.

Picked (not sampled) candidates are marked deterministic in the DraftTree, and the verifier uses
the rule that is exact for them (verify.py), so every policy is lossless.
"""
from __future__ import annotations

import inspect

from .base import DraftPolicy, DraftRound, Feed, TreeBuilder
from .fixed import FixedPolicy

from ..decode_spec import POLICIES  # the names are a decoding setting, checked without torch

__all__ = ["POLICIES", "DraftPolicy", "DraftRound", "Feed", "FixedPolicy", "TreeBuilder", "check_policy_options",
           "default_policy_name", "make_policy", "may_draft_trees", "parse_policy_options"]

# seed's policy where no call, engine or drafter names one, by the target's device type (any other: fixed).
# On a CPU, seed's fixed chains lose to parallel at a ToT step's load; choose drafts each row's round from
# the draft model, the search's own text, both or neither, whichever its load repays, and declines a draft
# that does not pay as auto does (docs/benchmarks.md, "seed drafts only where it pays, 2026-11-27
# (e6feac8)", and "The Qwen pair's default becomes choose, 2026-11-29"). A model pair that cannot score
# trees (ALiBi) gets auto, which drafts chains only. On a GPU the per-round plan is host work (it grows
# with rows) whose worth no device has measured yet, so CUDA keeps fixed chains until a run on a GPU
# compares them.
SEED_DEFAULTS = {"cpu": "choose"}
CHAIN_DEFAULTS = {"choose": "auto"}  # the default where the models cannot score trees: the same pricing, chains only


def default_policy_name(mode: str, k_config: tuple[int, ...], device_type: str, trees: bool = True) -> str:
    """The policy a drafting call runs when neither it, its engine nor its drafter names one: seed's
    default on this device for a chain k_config (trees: whether the models can score tree masks), else
    fixed (sd and mcsd are the papers' baselines, and a tree k_config is a shape asked for)."""
    if mode == "seed" and all(k == 1 for k in k_config):
        name = SEED_DEFAULTS.get(device_type, "fixed")
        return name if trees else CHAIN_DEFAULTS.get(name, name)
    return "fixed"


def parse_policy_options(pairs) -> dict[str, str]:
    """KEY=VALUE strings (the command line's --policy-option) -> a dict; values stay strings."""
    options: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = str(pair).partition("=")
        if not sep or not key.strip():
            raise ValueError(f"policy option {pair!r} is not KEY=VALUE")
        options[key.strip().replace("-", "_")] = value.strip()
    return options


def _policy_class(name: str):
    if name == "fixed":
        return FixedPolicy
    if name == "opt-tree":
        from .opt_tree import OptTreePolicy
        return OptTreePolicy
    if name == "specdec":
        from .specdec import SpecDecPolicy
        return SpecDecPolicy
    if name == "auto":
        from .auto import AutoPolicy
        return AutoPolicy
    if name == "parallelspec":
        from .parallelspec import ParallelSpecPolicy
        return ParallelSpecPolicy
    if name == "lookup":
        from .prompt_lookup import PromptLookupPolicy
        return PromptLookupPolicy
    if name == "suffix":
        from .suffix import SuffixPolicy
        return SuffixPolicy
    if name == "choose":
        from .choose import ChoosePolicy
        return ChoosePolicy
    raise ValueError(f"unknown draft policy {name!r}; expected one of {', '.join(POLICIES)}")


def _checked_options(cls, name: str, options: dict | None) -> dict:
    """The options as a dict; an unknown key is an error naming the keys the policy takes (the keywords
    of its parse_options, which from_options reads its options through)."""
    options = dict(options or {})
    accepted = list(inspect.signature(cls.parse_options).parameters)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"draft policy {name!r} has no option {', '.join(unknown)}; "
                         f"it takes {', '.join(accepted) or 'no options'}")
    return options


def check_policy_options(name: str, options: dict | None) -> dict:
    """The options of the named policy checked and converted without an engine or a model: an unknown
    policy, an option it does not take, or a value it cannot read (wrong type, out of range, a word it
    does not know) is a ValueError naming the policy, the option and what it accepts. A command calls
    this before it loads models; make_policy's from_options checks the same again for Python callers."""
    cls = _policy_class(name)
    return cls.parse_options(**_checked_options(cls, name, options))


def make_policy(name: str, options: dict | None, engine, k_config: tuple[int, ...], params) -> DraftPolicy:
    """Build a named policy for `engine`. Options come from policy_options / --policy-option."""
    cls = _policy_class(name)
    return cls.from_options(engine=engine, k_config=k_config, params=params, **_checked_options(cls, name, options))


def may_draft_trees(name: str, options: dict | None, engine, k_config: tuple[int, ...]) -> bool:
    """Whether the policy `make_policy` would build may draft trees (DraftPolicy.drafts_trees), decided
    without building it: building may calibrate, and a model that cannot score trees is refused before
    any forward."""
    return _policy_class(name).may_draft_trees(engine, k_config, check_policy_options(name, options))
