"""The DraftPolicy seam: a policy plans one sequence's draft round step by step.

The interface is a small state machine so that a driver owns every model forward:

    policy.plan_batch(seqs, rows)                      # batched drivers: once per round, before begin
    round = policy.begin(seq, params, vocab_size)      # per sequence, per round
    feed = round.first_feed()                          # None: draft nothing this round
    while feed is not None:
        logits = seq.draft.forward(runtime, feed.tokens, feed.parents)  # a scheduler may batch rows
        feed = round.step(logits, hidden)              # hidden: final hidden states if round.needs_hidden
    tree, node_entry = round.finish()
    ... verify ...
    policy.observe(seq, tree, acceptance)

`run_draft` below is the single-sequence driver; a batched scheduler runs the same loop for many
rows with one forward per draft step. A round never touches the target and keeps no threads.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..draft_tree import DETERMINISTIC, UNREAD, DraftTree
from ..hidden_capture import HiddenCapture  # noqa: F401  (policies and training import it from here)
from ..params import SamplingParams
from ..sampling import process_logits

# round records a policy keeps (`DraftPolicy.records`): the latest ones, between this many and twice it
MAX_RECORDS = 4096


@dataclass
class Feed:
    """Entries to feed the draft model: tokens and their parents as `KVCache.forward` takes them."""

    tokens: "list[int] | torch.Tensor"  # a tensor: picks still on the device (token_rows.py)
    parents: list[int]
    keep: int = 0  # only the last `keep` entries' logits are read (0: all); a batched forward may return all
    features: torch.Tensor | None = None  # target hidden states of the first entries (target_features.py)


class DraftRound:
    """One sequence's draft round. Subclasses implement `first_feed`, `step` and `finish`."""

    needs_hidden = False  # SpecDec++ reads the draft's final hidden states

    def first_feed(self) -> Feed | None:
        raise NotImplementedError

    def step(self, logits: torch.Tensor, hidden: torch.Tensor | None) -> Feed | None:
        raise NotImplementedError

    @classmethod
    def step_rows(cls, rounds: list["DraftRound"], logits: list[torch.Tensor],
                  hidden: list[torch.Tensor | None]) -> list[Feed | None]:
        """`step` for several rounds of this class that shared a draft forward. A class may read what
        its rounds need from the device once for all of them (one transfer per draft step, not one per
        row: each is a host sync on a GPU); each row's result must be what its `step` alone gives."""
        return [r.step(row_logits, row_hidden) for r, row_logits, row_hidden in zip(rounds, logits, hidden)]

    def finish(self) -> tuple[DraftTree, dict[int, int]]:
        raise NotImplementedError


def option(policy: str, key: str, value, kind: type, low: float | None = None, words: tuple[str, ...] = (),
           high: float | None = None):
    """One policy option (a string from the command line, or a number from Python) as `kind`; a value
    in `words` (e.g. opt-tree's n=auto) is kept as it is."""
    if value in words:
        return value
    try:
        out = kind(value)
    except (TypeError, ValueError):
        also = "".join(f" or {w}" for w in words)
        raise ValueError(f"draft policy {policy!r}: option {key}={value!r} is not a{'n' if kind is int else ''} "
                         f"{kind.__name__}{also}") from None
    if low is not None and out < low:
        raise ValueError(f"draft policy {policy!r}: option {key}={value!r} must be >= {low:g}")
    if high is not None and out > high:
        raise ValueError(f"draft policy {policy!r}: option {key}={value!r} must be <= {high:g}")
    return out


def choice_option(policy: str, key: str, value, choices: tuple[str, ...]) -> str:
    """An option that must be one of `choices` (e.g. prefill=priced|free), checked."""
    if value not in choices:
        raise ValueError(f"draft policy {policy!r}: option {key}={value!r} must be one of {', '.join(choices)}")
    return value


FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def flag_option(policy: str, key: str, value) -> bool:
    """An on/off option: a bool from Python, a string from the command line. A word outside FLAGS is
    refused rather than read as off, so a typo does not silently turn a setting off."""
    text = str(value).lower()
    if text not in FLAGS:
        raise ValueError(f"draft policy {policy!r}: option {key}={value!r} must be one of true, false (or 1, 0, yes, "
                         f"no, on, off)")
    return FLAGS[text]


# A row planned alone (its tree must not depend on what shares its forwards: an ordinarily sampled
# row under load=greedy) prices its round as if this many rows like it shared the forward: a
# constant, so its draft depends on nothing beside it, while its tokens pay for what they add to a
# loaded forward. Priced as one row on a CPU, whose first tokens cost almost nothing, every draft
# looks free; 8 measured best of 1, 4 and 8 (docs/benchmarks.md, "The cost cut becomes the default").
# The calibration times a round of as many rows (cost_model.LOADED_ROWS) for `choose` to price it with.
SAMPLED_ROWS = 8


def priced_rows(params, sampled_rows: int) -> int:
    """The rows a round planned alone is priced at: a greedy row (sd, load=off) as the one row it is,
    a sampled one as `sampled_rows` rows like it."""
    return 1 if params.greedy else sampled_rows


LOADS = ("greedy", "all", "off")
_LOAD_ALIASES = {"true": "greedy", "1": "greedy", "yes": "greedy", "on": "greedy", "false": "off", "0": "off", "no": "off"}


def load_option(policy: str, value) -> str:
    """Option load= of the policies that price a batched round by what shares its forwards: greedy
    (the default: rows whose tokens a draft cannot change -- greedy ones, and sampled ones with
    draft_invariant -- plan together, other sampled rows alone, so their tree and thus their sample
    for a given seed never depend on the batch), all (every sampled row too: still exact in
    distribution, but a sample then depends on what shared its forwards), off. true/false mean
    greedy/off."""
    text = _LOAD_ALIASES.get(str(value).lower(), str(value).lower())
    if text not in LOADS:
        raise ValueError(f"draft policy {policy!r}: option load={value!r} must be one of {', '.join(LOADS)}")
    return text


def reads_others(params, load: str) -> bool:
    """Whether a row with these params may be planned from what other rows saw or share with it,
    under a policy's option `load` (`load_option`)."""
    return load == "all" or (load == "greedy" and params.deterministic)


def planned_together(seqs: list, load: str) -> list:
    """The rows a policy with option `load` plans jointly in a batched round."""
    return [s for s in seqs if reads_others(s.rule.params, load)]


class DraftPolicy:
    """Turns a sequence's draft state into rounds; keeps per-sequence estimates between rounds."""

    name = "policy"
    capture = None  # a HiddenCapture when rounds need the draft's hidden states
    # False: rounds never feed the draft model (prompt lookup), so its rows need no draft cache
    uses_draft_model = True
    # whether rounds may draft a tree (siblings, scored under a 4D tree mask): the engine refuses such a
    # policy before any forward on a model that cannot take those masks (ALiBi). True unless a policy
    # knows its rounds are chains, so a policy that says nothing is checked rather than failing mid-call
    drafts_trees = True
    # whether `drafts_call` reads its prefill count: the engine counts the prompt tokens (a scan of the
    # prompts and the draft's prefix store) only for a policy that prices them
    prices_prefill = False

    @classmethod
    def parse_options(cls) -> dict:
        """The policy's options, given as keywords (strings from the command line or values from Python),
        checked and converted without an engine, so that a command refuses a bad one before it loads
        models (policies.check_policy_options). Its keywords are the options the policy takes, and
        `from_options` builds from what it returns. A policy with options overrides it; this one takes none."""
        return {}

    @classmethod
    def may_draft_trees(cls, engine, k_config: tuple[int, ...], options: dict) -> bool:
        """`drafts_trees` of the policy `from_options` would build from these options (as `parse_options`
        returns them), read without building it: building may calibrate costs (engine/cost_model.py),
        and calibrating runs forwards."""
        return cls.drafts_trees

    def begin(self, seq, params: SamplingParams, vocab_size: int) -> DraftRound:
        raise NotImplementedError

    def drafts_call(self, prefill_tokens: int, rows: int, params: SamplingParams, load: int | None = None) -> bool:
        """Whether a call of `rows` sequences drafts at all, before any forward: drafting first costs the
        draft's prefill of `prefill_tokens` prompt tokens. `load`: how many of its rows share a forward
        (None: all). False: the call runs plain target steps (no draft cache, no draft forward), which
        is lossless trivially. Default: always draft."""
        return True

    def declined(self) -> "DraftPolicy | None":
        """What a call runs when `drafts_call` declines the draft model's prefill: None, plain target
        steps; or a policy whose rounds never feed the draft model (`uses_draft_model` False), so the
        call drafts from sources that need no draft cache (choose.py: its suffix source)."""
        return None

    def call_finished(self, params: SamplingParams, new_tokens: list[int], cost=None) -> None:
        """Called once a call this policy priced (`prices_prefill`) has finished, drafted or declined,
        with each row's count of new tokens and what its decode cost (call_pricing.CallCost: whether it
        ran the draft model, its new tokens and seconds after the prefill); default: nothing to learn."""

    def plan_batch(self, seqs: list, rows: int) -> None:
        """Called before a batched draft round with this policy's sequences in it and the round's
        size (`rows`, every call's rows): a policy that prices its drafts by what shares the forwards
        plans them here (default: each row plans alone)."""

    def clear_text(self) -> None:
        """Forget the text kept from earlier calls (the suffix source's scopes), so that a benchmark run
        starts as cold as a fresh engine (Engine.clear_prefix_cache); default: none kept."""

    @property
    def owner(self) -> "DraftPolicy":
        """The policy whose estimates this one's rounds feed (itself; a `declined()` policy may share its
        owner's), so that the scheduler reports each forward to each owner once."""
        return self

    def observe_forward(self, rows: int, tokens: int, seconds: float) -> None:
        """Called once per verification forward that verified rows of this policy's calls: its rows,
        query tokens and seconds from launch to the decisions read back (what a round costs at the
        run's load: load_costs.py). Default: nothing to learn."""

    def observe_draft_forward(self, tokens: int, seconds: float) -> None:
        """Called once per draft forward on the CPU that fed rows of this policy's calls: the entries it
        fed (every row's) and its seconds, the round's picks from its logits included (what a draft
        step costs at the run's load: load_costs.py). Default: nothing to learn."""

    def observe(self, seq, tree: DraftTree, acceptance) -> None:
        """Called after each verification with what the target accepted (default: nothing to learn)."""
        records = self.records
        records.append(round_record(seq, tree, acceptance))
        if len(records) > 2 * MAX_RECORDS:  # the policy lives as long as its engine: keep the latest only
            del records[:-MAX_RECORDS]

    @property
    def records(self) -> list[dict]:
        """Per round: sequence, nodes, depth, E(A) where the policy estimates it, tokens realized
        (the latest MAX_RECORDS rounds at least, at most twice that)."""
        if not hasattr(self, "_records"):
            self._records: list[dict] = []
        return self._records


def round_record(seq, tree: DraftTree, acceptance) -> dict:
    return {"seq": seq.index, "drafted": len(tree), "depth": tree.depth(), "expected_tokens": tree.expected_tokens(),
            "tokens": len(acceptance.tokens), "accepted": len(acceptance.path)}


class TreeBuilder:
    """Bookkeeping shared by the rounds: the tree so far, its q rows and which node sits at which
    draft-cache entry. The first feed is the tokens the draft cache has not seen (entries
    base..base+n_pending-1, a chain); the root's children hang off the last of them."""

    def __init__(self, seq, params: SamplingParams, vocab_size: int):
        self.seq, self.params, self.vocab_size = seq, params, vocab_size
        self.parents: list[int] = []
        self.tokens: list[int] = []
        self.q_index: list[int] = []
        self.q_rows: list[torch.Tensor] = []
        self.path_probs: list[float] = []
        self.node_entry: dict[int, int] = {}
        self.device_levels: list[torch.Tensor] = []  # the tokens of nodes added by `add_picked`, in order
        self.next_entry = len(seq.draft.parents) if seq.draft is not None else 0
        self.root_entry = -1
        self.remaining = params.max_new_tokens - len(seq.generated)

    def pending_feed(self) -> Feed:
        seq = self.seq
        pending = seq.pending(seq.draft)
        base = self.next_entry
        parents = [base + i - 1 if i else -1 for i in range(len(pending))]  # a chain off the prefix
        self.root_entry = base + len(pending) - 1
        self.next_entry = base + len(pending)
        features, log = None, getattr(seq, "features", None)
        if log is not None:  # the drafter reads f_{p-1} at each pending token x_p
            end = len(seq.tokens)
            features = log.slots(end - len(pending), end)
            log.drop_before(end - 1)  # the next round's first pending token reads f_{end-1}
        return Feed(pending, parents, features=features)

    def add(self, parent: int, token: int, q: torch.Tensor | None, path_prob: float = 0.0) -> int:
        """A node; q is the row it was sampled from (the same tensor object for siblings), None if picked."""
        if q is None:
            self.q_index.append(DETERMINISTIC)
        else:
            if not self.q_rows or self.q_rows[-1] is not q:
                self.q_rows.append(q)
            self.q_index.append(len(self.q_rows) - 1)
        self.parents.append(parent)
        self.tokens.append(token)
        self.path_probs.append(path_prob)
        return len(self.tokens) - 1

    def add_picked(self, parents: list[int], picks: torch.Tensor, qs: list[torch.Tensor] | None = None) -> list[int]:
        """Nodes whose tokens (`picks`, 1-D, one per parent given) stay on the device until the tree
        is verified, so no read waits for the draft forward that chose them: picked (qs None) or
        drawn, node i from qs[i] (siblings drawn from one q give the same tensor object)."""
        if len(self.device_levels) == 0 and self.tokens:
            raise RuntimeError("a tree's tokens are all on the device or all on the host")
        self.device_levels.append(picks)
        return [self.add(parent, UNREAD, None if qs is None else q) for parent, q in zip(parents, qs or parents)]

    def feed_nodes(self, nodes: list[int], tokens: torch.Tensor | None = None) -> Feed:
        """Feed `nodes` to the draft model; tokens: theirs on the device (from `add_picked`)."""
        parents = [self.node_entry.get(self.parents[n], self.root_entry) for n in nodes]
        for n in nodes:
            self.node_entry[n] = self.next_entry
            self.next_entry += 1
        return Feed([self.tokens[n] for n in nodes] if tokens is None else tokens, parents)

    def tree(self, nodes: list[int] | None = None, with_path_probs: bool = False,
             ordered: bool = False) -> tuple[DraftTree, dict[int, int]]:
        """The tree (optionally only `nodes`, a parent-closed subset, renumbered in order; ordered: in
        the order given, which puts parents first)."""
        if self.device_levels and nodes is not None:
            raise RuntimeError("a tree whose tokens are on the device is kept whole")
        keep = list(range(len(self.tokens))) if nodes is None else list(nodes) if ordered else sorted(nodes)
        new = {old: i for i, old in enumerate(keep)}
        rows = sorted({self.q_index[o] for o in keep if self.q_index[o] != DETERMINISTIC})
        row_of = {r: i for i, r in enumerate(rows)}
        probs = (torch.stack([self.q_rows[r] for r in rows]) if rows
                 else torch.empty(0, self.vocab_size))
        tree = DraftTree([new[self.parents[o]] if self.parents[o] >= 0 else -1 for o in keep],
                         [self.tokens[o] for o in keep], probs, True,
                         [row_of.get(self.q_index[o], DETERMINISTIC) for o in keep],
                         [self.path_probs[o] for o in keep] if with_path_probs else None,
                         torch.cat(self.device_levels) if self.device_levels else None)
        entries = {new[o]: e for o, e in self.node_entry.items() if o in new}
        return tree, entries

    def q(self, logits: torch.Tensor) -> torch.Tensor:
        return process_logits(logits, self.params, self.vocab_size)
