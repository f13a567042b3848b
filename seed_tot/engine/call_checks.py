"""What an engine refuses of a call before any forward: masks a model cannot take exactly, prompts
past a learned position table, policies that need a draft model or features it does not have.
A refusal here costs nothing; the same failure inside the step loop would come after prefill."""
from __future__ import annotations

from .decode_spec import DRAFTING_MODES
from .masks import UnsupportedAttention
from .params import SamplingParams

# the named policies that never run a draft model: an engine without one serves them
MODEL_FREE_POLICIES = ("lookup", "suffix")


def runs_draft_model(mode: str, policy) -> bool:
    """Whether a call runs the draft model: a drafting mode whose policy feeds it (policy None there:
    a caller that has not built one yet, which drafts with the model)."""
    return mode in DRAFTING_MODES and (policy is None or policy.uses_draft_model)


def needs_draft(mode: str) -> ValueError:
    return ValueError(f"mode {mode!r} needs a draft model (or draft_policy='lookup', which drafts by prompt "
                      f"lookup without one)")


def check_attention(engine, mode: str, k_config: tuple[int, ...], verify_batch: int | str | None,
                    draft_batch: int | str | None = 1, with_draft: bool = True) -> None:
    """Refuse a setting whose 4D masks a model of `engine` cannot take exactly."""
    tree = mode in ("mcsd", "seed") and any(k > 1 for k in k_config)
    if tree:
        what = f"mode {mode} with the tree k_config {','.join(map(str, k_config))}"
        engine.target_runtime.layout.check_tree_masks(what)
        if with_draft:
            engine.draft_runtime.layout.check_tree_masks(what)
    if mode == "seed" and verify_batch != 1:
        engine.target_runtime.layout.check_tree_masks(f"seed with verify_batch={verify_batch}")
    if mode == "seed" and draft_batch != 1 and with_draft:
        engine.draft_runtime.layout.check_tree_masks(f"seed with draft_batch={draft_batch}")


def check_context(engine, encoded: list[list[int]], params: SamplingParams, with_draft: bool) -> None:
    """Models with learned absolute positions (GPT-2, OPT) cannot go past their table: say so up front.
    Rotary models keep going past max_position_embeddings, as they do in transformers' generate."""
    longest = max(len(ids) for ids in encoded) + params.max_new_tokens
    runtimes = [(engine.target_runtime, engine.target_name)]
    if with_draft:
        runtimes.append((engine.draft_runtime, engine.draft_name))
    for runtime, name in runtimes:
        limit = runtime.layout.max_positions
        if limit is not None and longest > limit:
            raise ValueError(f"{name} has learned position embeddings for {limit} positions, but the longest "
                             f"prompt ({longest - params.max_new_tokens} tokens) + max_new_tokens "
                             f"({params.max_new_tokens}) needs {longest}: shorten the prompt or lower max_new_tokens")


def check_tree_policy(engine, name: str, drafts_trees: bool, uses_draft_model: bool) -> None:
    """Refuse a policy whose rounds may draft trees on a model that cannot score them exactly
    (ALiBi): its first tree would fail mid-call, after prefill, and in seed mode inside a worker.
    k_config's trees are checked in `check_attention`."""
    if not drafts_trees:
        return
    what = f"draft policy {name!r}, whose rounds may draft trees,"
    try:
        engine.target_runtime.layout.check_tree_masks(what)
        if uses_draft_model and engine.draft is not None:
            engine.draft_runtime.layout.check_tree_masks(what)
    except UnsupportedAttention as err:
        raise UnsupportedAttention(f"{str(err).rstrip('.')}. Policies that draft chains are exact for it too: fixed with a "
                                   f"chain k_config, auto, specdec, lookup, opt-tree with n=1, parallelspec "
                                   f"with a chain k_config and passes=1, lookup=0") from None


def check_feature_policy(engine, name: str) -> None:
    if engine.target_hidden is not None and name not in ("parallelspec", "choose", *MODEL_FREE_POLICIES):
        raise ValueError(f"draft policy {name!r} feeds the drafter its own drafted tokens, but this drafter reads "
                         f"the target's hidden states, which drafted tokens do not have: use the "
                         f"'choose' policy (the default for it) or 'parallelspec'")
