"""`parallelspec`: a whole draft in ONE forward of a ParallelSpec drafter (engine/drafters/).

The round feeds the tokens the drafter's cache has not seen followed by MASK_1..MASK_m (a chain,
m = depth - 1). The output at the last real token is q_1 and the output at MASK_j is q_{j+1};
depth-t nodes of the tree are drawn from q_t (sampled: each sibling group draws `width` tokens, or
as many as q_t holds, without replacement from q_t, the verifier gets that q_t; greedy: the
top-`width` tokens of q_t, deterministic candidates). q_t does not depend on which depth-(t-1) token was drafted, which is
what makes one forward enough; the verifier needs only that each candidate was drawn from the q it
is given, so the round is lossless. A one-pass round's levels are drawn on the device for every row
of the batch at once and read back with one transfer (`_draw_levels`): the cut below weighs them on
the host, so that read stays, but it is one per draft round, not one per node.

No tree node is fed to the drafter, so `finish` reports no node entries and the verifier's commit
keeps just the pending real tokens: the mask entries never stay in the drafter's cache (accepted
tokens are fed as real tokens at the start of the next round).

Option passes=P (default 1) trades draft forwards for acceptance: a mask guesses x_{t+j+1} without
seeing the drafted x_{t+1}.., so after the first forward draws level 1, pass 2 feeds each level-1
node as a real token followed by masks, and that node's children and deeper levels are drawn from
the q's that have seen it (its output and its masks'); pass 3 does the same for level 2, and so on.
Levels below the last fed one come from the last pass's masks. A fed node is laid out exactly as the
same token fed as pending in the next round (position, parent chain, no masks before it), so when
the target accepts it its entry stays in the drafter's cache (node entries, as autoregressive
policies report them) and the cache equals a fresh prefill; rejected nodes and every mask leave.
Each node is still drawn from the q the verifier gets, so the round stays lossless. A drafter that
reads the target's hidden states refuses passes > 1 (a drafted token has no f yet).

Shape: `depth` levels (at most k+1, the drafter's reach; default: the "depth" its drafter.json
names, else k+1), width k_config[d] at depth
d+1 and 1 past the end of k_config, so sd (all ones) and the default seed k_config draft a chain of
k+1; `--k-config 2,2` gives a tree whose first two levels branch.

Option cut=cost (the default a drafter.json may name as "cut"): the forward has already given every
q_t, so the round keeps only the levels that pay for their verification. With p̂ = the product along
a node's path of an estimate of each level's acceptance (OPT-Tree's: greedy, the drafter's plain
softmax at the picked token) and the calibrated target cost of engine/cost_model.py (`load_costs`),
the round keeps levels 1..d for the d that maximizes
    E(d) / time(d),   E(d) = 1 + sum of p̂ over nodes at depth <= d,   time(d) = t_draft + t_target(nodes(d) + 1)
so a guess the drafter is unsure of is neither verified nor counted. A sampled level may not be
judged by its own draws: keeping level t only when its drawn token has a high q_t would propose
q_t's likely tokens more often than q_t says, and the verifier, which assumes a draw from q_t,
would be biased (q_t = (.6, .4) against p = (.5, .5), kept only for the first token, emits it
70% of the time). So a sampled node's estimate is its level's expected q, sum_x q_t(x)^2, a
function of q_t alone, and a sampled row's cut goes level by level, keeping level t only while it
raises the rate, so that whether a level is verified depends on nothing drawn at or below it (with
passes > 1, deeper q_t have seen the nodes fed before them). Greedy levels are deterministic
candidates, exact under any cut. cut=none keeps every level.

In a batched round (batched SEED) the rows share one verification forward, so the cut is made for
all of them at once (`joint_cut`): each row keeps its first level, then the level with the most p̂
per verified token anywhere in the round joins while it raises the round's expected tokens per
second. At a load where the forward's cost grows with every token (a CPU past a few), that keeps
only the surest guesses; with a flat forward (a GPU) it keeps everything. Option load=greedy (the
default) cuts greedy rows jointly and sampled rows alone: a sampled row's tree then depends only on
its own draws, so its sample is the one `sd` gives for the same seed whatever shares its forwards.
Alone, a sampled row is priced as if `sampled_rows` rows like it shared the forward (option
sampled_rows=R, default 8): a constant, so its tree still depends on nothing but its own draws, while
its levels pay for the tokens they add to a loaded forward. Priced alone (R=1) on a CPU, whose forward
costs about the same up to a dozen tokens, every level looks free and the cut changes nothing; the
default R=8 is the measured best of 1, 4 and 8 (docs/benchmarks.md, "The cost cut becomes the default").
Greedy rows cut alone (sd; load=off) are priced as one row.
load=all cuts sampled rows jointly too (still exact in distribution: the cut reads only draft-side
outputs, never the target's), load=off cuts every row alone (base.load_option). A joint cut prices
its round at the load the run measures (option costs=measured, the default: load_costs.py's fit of
the verification forwards, for rows whose drafts cannot change their tokens); costs=calibrated
keeps the calibration.

Option lookup=N (the default a drafter.json may name as "lookup"; 0: off) grafts a prompt-lookup
guess beside the drafter's tree (prompt_lookup.py): the tokens that followed the last occurrence of
the context's last N (down to 1) tokens, up to the round's depth, sharing the drafted nodes on its
path. It is picked, not sampled, so the verifier tries it first in its sibling group and then the
drafter's draws against the residual (verify.py): exact at any temperature. It is added after the
cut, so it is never priced away: one more chain of verified tokens per round.

Option suffix=true grafts the suffix source's chain the same way (suffix.py: what followed the longest
match in the row's, its search's and the run's text, scored by branch counts), beside the lookup's
guess where both are on.
"""
from __future__ import annotations

import torch

from ..draft_tree import DETERMINISTIC
from ..params import SamplingParams
from ..host_to_device import to_device
from ..keyed_draws import level_uniform
from ..sampling import draw_without_replacement, multinomial, process_by_params
from ..cost_model import Costs, load_costs
from ..load_costs import COST_PRICING, LoadCosts
from .base import (SAMPLED_ROWS, DraftPolicy, DraftRound, Feed, TreeBuilder, choice_option, flag_option, load_option,
                   option, planned_together, priced_rows)
from .level_cut import JointCut, row_cut
from .prompt_lookup import graft_chain, lookup_continuation, picked_first

CUTS = ("none", "cost")


def _default_depth(drafter) -> int:
    """A drafter directory may name the depth it drafts best at ("depth" in drafter.json); else k+1."""
    return getattr(drafter, "default_depth", None) or getattr(drafter, "n_masks", 0) + 1


def _default_lookup(drafter, lookup):
    """The lookup option as given, else the one a drafter directory names ("lookup" in drafter.json), else off."""
    return (getattr(drafter, "default_lookup", None) or 0) if lookup is None else lookup


def _drafts_trees(widths, passes: int, lookup: int) -> bool:
    """Whether rounds may hold siblings for the target (a level wider than 1, or a lookup guess grafted
    beside the drafted chain) or feed the drafter a node off the root after its masks (passes > 1)."""
    return any(w > 1 for w in widths) or passes > 1 or lookup > 0


class ParallelSpecPolicy(DraftPolicy):
    name = "parallelspec"

    def __init__(self, drafter, k_config=(1,), depth: int | None = None, costs: Costs | None = None,
                 load: str = "greedy", passes: int = 1, lookup: int = 0, sampled_rows: int = SAMPLED_ROWS,
                 suffix: "SuffixSource | None" = None, load_costs: LoadCosts | None = None):
        n_masks = getattr(drafter, "n_masks", 0)
        if not n_masks:
            raise ValueError("draft policy 'parallelspec' needs a ParallelSpec drafter with [MASK] tokens as the draft "
                             "model: pass --draft DIR (Engine.from_pretrained(draft=DIR)) with a directory from "
                             "`seed-tot train-drafter --method parallelspec`")
        self.mask_ids = [drafter.mask_id(j) for j in range(1, n_masks + 1)]
        if depth is None:
            depth = _default_depth(drafter)
        self.depth = depth
        if not 1 <= self.depth <= n_masks + 1:
            raise ValueError(f"draft policy 'parallelspec': depth={depth} must be in 1..{n_masks + 1} "
                             f"(this drafter has k={n_masks} masks)")
        self.widths = tuple(k_config[d] if d < len(k_config) else 1 for d in range(self.depth))
        self.costs = costs  # None: keep every level (cut=none)
        # a jointly planned round (rows whose drafts cannot change their tokens) is cut at the load the
        # run measures (load_costs.py); None: at the calibration (costs=calibrated). choose.py shares its own.
        self.load_costs = load_costs
        self.load = load_option(self.name, load)
        if passes < 1:
            raise ValueError(f"draft policy 'parallelspec': passes={passes} must be >= 1")
        if passes > 1 and getattr(drafter, "uses_target_features", False):
            raise ValueError("draft policy 'parallelspec': passes > 1 feeds drafted tokens back to the drafter, and this "
                             "drafter reads the target's hidden states, which a drafted token does not have yet: "
                             "use passes=1 with it")
        self.passes = passes
        if lookup < 0:
            raise ValueError(f"draft policy 'parallelspec': lookup={lookup} must be >= 0 (0: no prompt lookup)")
        self.lookup = lookup
        if sampled_rows < 1:
            raise ValueError(f"draft policy 'parallelspec': sampled_rows={sampled_rows} must be >= 1")
        self.sampled_rows = sampled_rows
        self._joint: dict[int, JointCut] = {}  # id(seq) -> the cut its batched round shares
        self.suffix = suffix  # grafted beside the drafter's tree as the lookup's guess is
        self.drafts_trees = _drafts_trees(self.widths, passes, lookup) or suffix is not None

    @classmethod
    def may_draft_trees(cls, engine, k_config, options) -> bool:
        depth = _default_depth(engine.draft) if options["depth"] is None else options["depth"]
        return (_drafts_trees(k_config[:depth], options["passes"], _default_lookup(engine.draft, options["lookup"]))
                or options["suffix"])

    @classmethod
    def parse_options(cls, depth=None, cut=None, recalibrate="false", load="greedy", passes=1, lookup=None,
                      sampled_rows=SAMPLED_ROWS, suffix="false", costs="measured") -> dict:
        """depth, cut and lookup left out (None) take the drafter's defaults when the policy is built."""
        if cut and cut not in CUTS:
            raise ValueError(f"draft policy {cls.name!r}: option cut={cut!r} must be one of {', '.join(CUTS)}")
        return {"depth": None if depth is None else option(cls.name, "depth", depth, int, 1), "cut": cut or None,
                "recalibrate": flag_option(cls.name, "recalibrate", recalibrate), "load": load_option(cls.name, load),
                "passes": option(cls.name, "passes", passes, int, 1),
                "lookup": None if lookup is None else option(cls.name, "lookup", lookup, int, 0),
                "sampled_rows": option(cls.name, "sampled_rows", sampled_rows, int, 1),
                "suffix": flag_option(cls.name, "suffix", suffix), "costs": choice_option(cls.name, "costs", costs, COST_PRICING)}

    @classmethod
    def from_options(cls, engine, k_config, params, **options) -> "ParallelSpecPolicy":
        o = cls.parse_options(**options)
        cut = o["cut"] or getattr(engine.draft, "default_cut", None) or "none"
        costs = load_costs(engine, recalibrate=o["recalibrate"]) if cut == "cost" else None
        measured = LoadCosts(costs) if costs is not None and o["costs"] == "measured" else None
        policy = cls(engine.draft, k_config, o["depth"], costs, o["load"], o["passes"],
                     _default_lookup(engine.draft, o["lookup"]), o["sampled_rows"], load_costs=measured)
        if o["suffix"]:
            from .suffix import SuffixSource
            policy.suffix = SuffixSource(depth=policy.depth)
            policy.drafts_trees = True
        return policy

    def plan_batch(self, seqs: list, rows: int) -> None:
        # a fresh map per plan, a plan that cuts nothing jointly too: a row planned for a round that
        # failed before its `begin`, or that a policy wrapping this one (choose.py) drafted without the
        # model, must not leave its cut under an id a later row may reuse; a cut already made would
        # not know that row (draft_rows plans and begins one round at a time)
        self._joint = {}
        jointly = planned_together(seqs, self.load)
        if self.costs is None or rows <= 1 or not jointly:
            return
        costs = self.costs if self.load_costs is None else self.load_costs.at(rows)
        cut = JointCut(costs, rows - len(jointly), self.passes)  # the other rows: one verified token each at least
        self._joint = {id(s): cut for s in jointly}

    def observe_forward(self, rows: int, tokens: int, seconds: float) -> None:
        if self.load_costs is not None:
            self.load_costs.observe(rows, tokens, seconds)

    def observe_draft_forward(self, tokens: int, seconds: float) -> None:
        if self.load_costs is not None:
            self.load_costs.observe_draft(tokens, seconds)

    def begin(self, seq, params: SamplingParams, vocab_size: int) -> DraftRound:
        builder = TreeBuilder(seq, params, vocab_size)
        rnd = ParallelSpecRound(builder, self.widths, self.mask_ids, self.costs, self._joint.pop(id(seq), None),
                                self.passes, self.lookup, priced_rows(params, self.sampled_rows))
        if self.suffix is not None:
            rnd.suffix_chain = [n.token for n in self.suffix.draft(seq, min(builder.remaining, len(self.widths)))]
        return rnd

    def clear_text(self) -> None:
        if self.suffix is not None:
            self.suffix.clear()

    def observe(self, seq, tree, acceptance) -> None:
        super().observe(seq, tree, acceptance)
        if self.suffix is not None:
            self.suffix.observe(seq)


class ParallelSpecRound(DraftRound):
    def __init__(self, builder: TreeBuilder, widths: tuple[int, ...], mask_ids: list[int], costs: Costs | None = None,
                 joint: "JointCut | None" = None, passes: int = 1, lookup: int = 0, priced_rows: int = 1):
        self.b = builder
        self.priced_rows = priced_rows  # a cut alone prices the forward as this many rows like this one
        self.joint = joint
        self.widths = widths[: max(1, builder.remaining)]  # no point drafting past the budget
        self.mask_ids = mask_ids[: len(self.widths) - 1]
        self.costs = costs
        self.passes, self.passes_run = passes, 0
        self.lookup = lookup
        self.suffix_chain: list[int] = []  # the suffix source's chain to graft (ParallelSpecPolicy.suffix)
        self.levels: list[list[tuple[int, int, torch.Tensor | None, float]]] = []  # (parent slot, token, q, p̂)
        self.level_nodes: list[list[int]] = []  # the builder's node ids, level by level
        # per node of the newest level (the root at first): the drafter rows its children's levels are
        # drawn from (its nearest fed ancestor's outputs), that ancestor's level, and the node's p̂
        self.frontier: list[tuple[torch.Tensor, int, float]] = []
        # a one-pass round's draws, made together with its batch's (`_draw_levels`): per level, per
        # frontier slot, its picks (token, q or None, p)
        self.drawn: list[list[list[tuple]]] | None = None

    def first_feed(self) -> Feed:
        feed = self.b.pending_feed()
        # the masks continue the chain after the last pending token, at the positions of the tokens they predict
        first = self.b.next_entry
        parents = ([self.b.root_entry] + [first + j for j in range(len(self.mask_ids) - 1)]) if self.mask_ids else []
        self.b.next_entry += len(self.mask_ids)
        # only q_1.. are read: the LM head (most of a small drafter's forward) skips the earlier pending tokens
        features = feed.features
        if features is not None and self.mask_ids:  # each mask reads its anchor's f, as in training
            features = torch.cat([features, features[-1:].expand(len(self.mask_ids), -1)])
        return Feed(feed.tokens + self.mask_ids, feed.parents + parents, keep=len(self.widths), features=features)

    def step(self, logits: torch.Tensor, hidden: torch.Tensor | None) -> Feed | None:
        if self.passes == 1 and self.drawn is None:  # alone: the draws step_rows makes for it among other rows
            type(self)._draw_levels([self], [logits])
        done = len(self.levels)
        if not done:  # q_1 (after the last real token), then q_2.. (after each mask)
            self.frontier = [(logits[-len(self.widths):], 0, 1.0)]
        else:  # per fed node of level `done`: q of its children at the node, deeper levels at its masks
            per = len(self.widths) - done
            self.frontier = [(logits[i * per:(i + 1) * per], done, pp) for i, (_, _, pp) in enumerate(self.frontier)]
        self.passes_run += 1
        while len(self.levels) < len(self.widths):
            self._grow()
            if self.passes_run < self.passes and len(self.levels) < len(self.widths):
                return self._feed_newest_level()
        if self.joint is not None:  # cut in finish(), once every row of the round has its levels
            self.joint.levels[id(self.b.seq)] = self.levels
        return None

    def _grow(self) -> None:
        """Draw the next level: each frontier node's children from q_t of its anchor's rows."""
        b, params, depth = self.b, self.b.params, len(self.levels)
        level, frontier, nodes = [], [], []
        parent_nodes = self.level_nodes[-1] if self.level_nodes else [-1]
        for slot, slot_frontier in enumerate(self.frontier):
            if slot_frontier is None:  # a dead node: its children's slots are dead too (the layout stays whole)
                nodes += [None] * self.widths[depth]
                frontier += [None] * self.widths[depth]
                continue
            rows, anchor, pp = slot_frontier
            row = rows[depth - anchor]
            if self.drawn is not None:
                picks = self.drawn[depth][slot]
            elif params.greedy:  # deterministic candidates: q_t's top tokens (p̂ from the drafter's plain softmax)
                probs = torch.softmax(row[: b.vocab_size].float(), -1)
                top = torch.topk(probs, self.widths[depth])
                picks = [(tok, None, p) for tok, p in zip(top.indices.tolist(), top.values.tolist())]
            else:  # each sibling group is its own draw from q_t (what the verifier assumes)
                q = b.q(row)
                n = min(self.widths[depth], int((q > 0).sum()))
                expected = float((q * q).sum())  # the level's expected q: never its own draws (module doc)
                picks = [(tok, q, expected) for tok in multinomial(q, n, b.seq.generator).tolist()]
            for pick in picks:
                if pick is None:  # dead: never accepted, so neither it nor its subtree is verified; its
                    nodes.append(None)  # slot stays, so every level's groups keep `_groups`' positions
                    frontier.append(None)
                    continue
                tok, q, p = pick
                level.append((slot, tok, q, pp * p))
                nodes.append(b.add(parent_nodes[slot], tok, q, pp * p))
                frontier.append((rows, anchor, pp * p))
        self.levels.append(level)
        self.level_nodes.append(nodes)
        self.frontier = frontier

    @classmethod
    def step_rows(cls, rounds: list["ParallelSpecRound"], logits: list[torch.Tensor],
                  hidden: list[torch.Tensor | None]) -> list[Feed | None]:
        """One-pass rounds draw every level of every row together, reading the device once for all of
        them (`_draw_levels`); rounds of several passes draw node by node."""
        one_pass = [i for i, r in enumerate(rounds) if r.passes == 1 and r.drawn is None]
        if one_pass:
            cls._draw_levels([rounds[i] for i in one_pass], [logits[i] for i in one_pass])
        return [r.step(x, h) for r, x, h in zip(rounds, logits, hidden)]

    @staticmethod
    def _draw_levels(rounds: list["ParallelSpecRound"], logits: list[torch.Tensor]) -> None:
        """Every level of one-pass rounds, drawn on the device and read back with one transfer (tokens
        and their p, which the cut weighs on the host). Level t has one sibling group per node of level
        t-1, each width_t tokens from q_t: greedy, q_t's top tokens (p from the drafter's plain
        softmax); sampled, drawn without replacement by inverse CDF at float64 uniforms the row draws
        from its own generator (q processed together per params; p the level's expected q), so a row's
        draws depend on nothing but the row. A group that asks for more tokens than q_t holds draws,
        once q is spent, tokens of no mass; the transfer brings each group's support size too, and
        those draws are dropped with their subtrees (the verifier would always reject them, so the
        output is the same, and the round neither prices nor scores them)."""
        vocab = rounds[0].b.vocab_size  # one engine's rows: one vocabulary
        q_rows = [x[-len(r.widths):] for r, x in zip(rounds, logits)]  # per round: q_1.. after its masks
        greedy = [j for j, r in enumerate(rounds) if r.b.params.greedy]
        sampled = [j for j, r in enumerate(rounds) if not r.b.params.greedy]
        parts: list[torch.Tensor] = []
        by_width: dict[int, list[int]] = {}  # one top-k per k: torch.topk orders ties differently for another k
        for j in greedy:
            by_width.setdefault(max(rounds[j].widths), []).append(j)
        for g_width, members in by_width.items():
            top = torch.topk(torch.softmax(torch.cat([q_rows[j] for j in members])[:, :vocab].float(), -1), g_width)
            parts += [top.indices.double().flatten(), top.values.double().flatten()]
        if sampled:
            q, at_order = process_by_params([q_rows[j] for j in sampled], [rounds[j].b.params for j in sampled], vocab)
            order = [sampled[i] for i in at_order]  # q_t of every round in `order`, stacked
            s_width = max(max(rounds[j].widths) for j in sampled)
            index: list[int] = []  # per sibling group: its q row
            uniforms: list[torch.Tensor] = []
            first = 0
            for j in order:
                widths = rounds[j].widths
                groups = _groups(widths)
                draws = torch.rand(sum(n * w for n, w in zip(groups, widths)), dtype=torch.float64,
                                   generator=rounds[j].b.seq.generator)
                at = 0
                for d, (n, w) in enumerate(zip(groups, widths)):
                    keyed = level_uniform(rounds[j].b.seq, d) if rounds[j].b.params.draft_invariant else None
                    for _ in range(n):
                        if keyed is not None:  # a group's first draw at the target's keyed uniform (keyed_draws.py)
                            draws[at] = keyed
                        index.append(first + d)
                        uniforms.append(torch.nn.functional.pad(draws[at: at + w], (0, s_width - w)))
                        at += w
                first += len(widths)
            q_groups = q.index_select(0, to_device(index, q.device))
            u = to_device(torch.stack(uniforms), q.device)  # every row's uniforms in one copy
            tokens = draw_without_replacement(q_groups, u)
            # p̂: the level's expected q, never its own draws (module doc), for every node of a group
            ps = (q_groups * q_groups).sum(-1, keepdim=True).expand(-1, s_width)
            support = (q_groups > 0).sum(-1)  # a group's draws past it are tokens of no mass
            parts += [tokens.double().flatten(), ps.double().flatten(), support.double()]
        values = (torch.cat(parts) if len(parts) > 1 else parts[0]).tolist()  # the one transfer
        at = 0
        for g_width, members in by_width.items():
            n = sum(len(rounds[j].widths) for j in members) * g_width
            picked, p = values[at: at + n], values[at + n: at + 2 * n]
            at, row = at + 2 * n, 0
            for j in members:
                levels = []
                for n_slots, w in zip(_groups(rounds[j].widths), rounds[j].widths):
                    picks = [(int(picked[row * g_width + c]), None, p[row * g_width + c]) for c in range(w)]
                    levels.append([picks] * n_slots)  # every node's children: q_t's top tokens
                    row += 1
                rounds[j].drawn = levels
        if sampled:
            n = len(index) * s_width
            drawn, p, support = values[at: at + n], values[at + n: at + 2 * n], values[at + 2 * n:]
            group, first = 0, 0
            for j in order:
                widths, levels = rounds[j].widths, []
                for d, (n_slots, w) in enumerate(zip(_groups(widths), widths)):
                    q_t = q[first + d]  # one object per level: its groups share one q row in the tree
                    level = []
                    for _ in range(n_slots):
                        # draws past q_t's support (the group's last ones) are dead: None (`_grow`)
                        level.append([(int(drawn[group * s_width + c]), q_t, p[group * s_width + c])
                                      if c < support[group] else None for c in range(w)])
                        group += 1
                    levels.append(level)
                rounds[j].drawn = levels
                first += len(widths)

    def _feed_newest_level(self) -> Feed:
        """Another pass: each node of the newest level as a real token, followed by the masks for the
        levels below its children, so its subtree is drawn from q's that have seen it."""
        b, n_masks = self.b, len(self.widths) - len(self.levels) - 1
        tokens, parents = [], []
        for node in self.level_nodes[-1]:
            entry = b.next_entry
            b.node_entry[node] = entry  # kept in the drafter's cache if the target accepts it
            tokens += [b.tokens[node]] + self.mask_ids[:n_masks]
            parents += [b.node_entry.get(b.parents[node], b.root_entry)] + [entry + j for j in range(n_masks)]
            b.next_entry += 1 + n_masks
        return Feed(tokens, parents)

    def model_chain(self) -> list[int]:
        """The drafter's most probable chain this round (each kept level's first node), once finished:
        what a policy that grafts text beside it judges the drafter by (choose.py)."""
        chain = []
        for level in self.level_nodes[: getattr(self, "kept", len(self.level_nodes))]:
            if not level or level[0] is None:
                break
            chain.append(self.b.tokens[level[0]])
        return chain

    def _cut(self, levels, rows: int = 1, level_by_level: bool = False) -> int:
        """Levels this round keeps alone, in a forward of `rows` rows that each draft like it (level_cut.py)."""
        return row_cut(levels, self.costs, rows, self.passes_run, level_by_level)

    def finish(self):
        levels, b = self.levels, self.b
        if self.joint is not None:
            kept = self.joint.kept(id(b.seq))
        else:
            kept = (self._cut(levels, self.priced_rows, level_by_level=not b.params.greedy)
                    if self.costs is not None else len(levels))
        self.kept = kept
        # nodes fed past the cut stay out of the tree; the commit keeps only fed nodes on the accepted path
        nodes = [n for level in self.level_nodes[:kept] for n in level if n is not None]
        if self.lookup or self.suffix_chain:
            # it shares only kept picked nodes: never one the cut dropped, never a sampled one (prompt_lookup.py)
            picked = [n for n in nodes if b.q_index[n] == DETERMINISTIC]
            for chain in ((lookup_continuation(b.seq.tokens, self.lookup, len(self.widths)) if self.lookup else []),
                          self.suffix_chain):
                added = graft_chain(b, chain, picked)
                nodes += added
                picked += added
            return b.tree(picked_first(b.parents, b.q_index, nodes), ordered=True)
        return b.tree() if kept == len(levels) else b.tree(nodes)


def _groups(widths: tuple[int, ...]) -> list[int]:
    """Sibling groups per level of a one-pass round: one per node of the level above."""
    groups = [1]
    for w in widths[:-1]:
        groups.append(groups[-1] * w)
    return groups
