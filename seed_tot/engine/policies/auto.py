"""`auto`: the cost-aware policy -- each round, the draft length that maximizes tokens per second.

Costs come from a short calibration on the running hardware (`calibrate`: target forward time at
1, 2, 3, 4, 6, 8, 12 and 16 tokens verified, read piecewise-linearly between them, and draft time
per step), cached per target/draft architecture and shapes, dtype, device and machine (`cache_key`)
in $SEED_TOT_CACHE_DIR (default ~/.cache/seed-tot)/calibration.json. Piecewise, not a + b * tokens:
on a CPU a forward is nearly flat up to ~3 tokens and then grows (issue 10's table: 232, 238, 455 ms
for 1, 2, 4 tokens), and a straight line through 1 and 16 tokens overstates short chains, so auto
drafted 1 token where 2 pay. The acceptance estimate is a running, decayed per-token acceptance rate
of each sequence, starting from a prior. For a chain of K drafted tokens with per-token acceptance alpha:
    tokens(K) = (1 - alpha^(K+1)) / (1 - alpha)        time(K) = K * t_draft + t_target(K + 1)
and K = 0 (a plain target step, no draft forward at all) competes with the rest, so a draft that
hardly ever agrees costs nothing but the occasional probe: when K = 0 wins, a one-token probe is
drafted after `probe_every` plain rounds, and the gap doubles after each failed probe (up to 64),
so a 2% draft runs at about ar's speed while a draft that starts to agree is picked up again.

Load-aware (batched SEED; option load=greedy|all|off, base.load_option): rows drafted in one batched round share
its draft steps and its verification forward, so the length that pays for a row alone is not the
one that pays in a crowd. Before each batched round `plan_batch` picks every row's length for the
most expected tokens per second of the whole round (`plan_lengths`, `batch_time`):
    tokens = sum_i tokens(K_i)        time = sum_s t_draft(rows drafting >= s tokens) + t_target(sum_i (K_i + 1))
On a CPU, where a forward's cost grows with its tokens past a few, 16 rows plan K = 0 (plain target
steps: what `parallel` pays) while one row keeps its chain; on a GPU, flat to many tokens, every
row keeps its chain. Costs are keyed by query tokens (rows x entries), calibrated up to 64 target
and 32 draft tokens (fewer on a model with a shorter learned position table: `calibration_plan`).
A row whose own best length is 0 keeps the probing above. By default only
greedy rows plan together: a sampled row's length then depends on its own history alone, so its
sample for a seed is the one it gets alone.

With a SpecDec++ head (option head=DIR, `--head`), the running estimate still decides whether to
draft at all, but how far is decided token by token from the head's P̂ (specdec.py's round): with
n tokens drafted, the first n-1 judged (survivals S_j, last P̂ = a, S = S_{n-1}),
    E(n) = 1 + sum_j S_j + S * a        E(n+1) = E(n) + S * a^2
and drafting goes on while E(n+1) / time(n+1) > E(n) / time(n): a cost-aware stopping rule in
place of SpecDec++'s fixed threshold h.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..draft_tree import DraftTree
from ..params import SamplingParams
from .base import DraftPolicy, DraftRound, HiddenCapture, TreeBuilder, load_option, option, planned_together
from .fixed import FixedRound
from .head import accept_probability

log = logging.getLogger(__name__)
MAX_PROBE_GAP = 64


# up to 64: a batched verification carries rows x (draft length + 1) tokens
CALIBRATION_TOKENS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
DRAFT_CALIBRATION_TOKENS = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Costs:
    """Seconds. One target forward of n query tokens costs, where `target_points` holds measured
    (tokens, seconds) pairs, their piecewise-linear interpolation (the last segment's slope past the
    end); otherwise target_fixed_s + target_per_token_s * n. One draft step of one row costs
    draft_step_s; a batched draft step of n tokens (rows x fed entries) `draft(n)`, read from
    `draft_points` the same way (flat at draft_step_s without them).

    A forward's cost is keyed by its query tokens, not by how they split into rows: the weights'
    matmuls see rows x tokens as one dimension, and the attention over a few hundred cached entries
    is small beside them (issue 10's table: 6 rows x 1 token 477 ms, 1 row x 4 tokens 455 ms)."""

    target_fixed_s: float
    target_per_token_s: float
    draft_step_s: float
    target_points: tuple[tuple[int, float], ...] = ()
    draft_points: tuple[tuple[int, float], ...] = ()

    def target(self, tokens: int) -> float:
        if len(self.target_points) < 2:
            return self.target_fixed_s + self.target_per_token_s * tokens
        return _piecewise(self.target_points, tokens)

    def draft(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        return _piecewise(self.draft_points, tokens) if len(self.draft_points) >= 2 else self.draft_step_s

    def extra_token(self, tokens: int) -> float:
        """What verifying tokens + 1 instead of `tokens` adds."""
        return self.target(tokens + 1) - self.target(tokens)


def _piecewise(points: tuple[tuple[int, float], ...], tokens: int) -> float:
    # the segment whose right end is the first measured size >= tokens (the end segments extrapolate)
    i = min(max(bisect.bisect_left([n for n, _ in points], tokens), 1), len(points) - 1)
    (n0, t0), (n1, t1) = points[i - 1], points[i]
    return max(t0 + (t1 - t0) * (tokens - n0) / (n1 - n0), 0.0)


def expected_tokens(alpha: float, k: int) -> float:
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_length(alpha: float, costs: Costs, max_len: int) -> int:
    """The chain length (0 = no draft) with the most expected tokens per second."""
    rates = [expected_tokens(alpha, k) / (k * costs.draft_step_s + costs.target(k + 1)) for k in range(max_len + 1)]
    return max(range(max_len + 1), key=lambda k: (rates[k], -k))


def batch_time(lengths: list[int], pending: list[int], costs: Costs, other_tokens: int = 0) -> float:
    """Seconds of one batched round: draft step s feeds every row drafting >= s tokens (step 1 also
    its pending tokens; a row drafting 0 skips the draft), then one target forward verifies every
    row's draft + 1 and `other_tokens` more from rows planned elsewhere."""
    steps = max(lengths, default=0)
    draft = costs.draft(sum(p for k, p in zip(lengths, pending) if k >= 1))
    draft += sum(costs.draft(sum(k >= s for k in lengths)) for s in range(2, steps + 1))
    return draft + costs.target(sum(lengths) + len(lengths) + other_tokens)


def plan_lengths(alphas: list[float], pending: list[int], costs: Costs, max_len: int, other_tokens: int = 0) -> list[int]:
    """Chain lengths for rows drafted and verified together: the most expected tokens per second of
    the whole round, not of each row alone. A batched forward's cost grows with its tokens, so the
    more rows share it, the less a speculative token is worth (at a compute-bound load: nothing),
    while a row alone keeps its long chain. The search: the best common length, then one pass
    setting each row (surest first) to its best length given the others', repeated while it changes."""
    def rate(lengths: list[int]) -> float:
        tokens = sum(expected_tokens(a, k) for a, k in zip(alphas, lengths)) + other_tokens
        return tokens / batch_time(lengths, pending, costs, other_tokens)

    n = len(alphas)
    plan = max(([d] * n for d in range(max_len + 1)), key=lambda ls: (rate(ls), -ls[0]))
    for _ in range(3):  # passes until nothing changes (rarely more than two)
        before = list(plan)
        for i in sorted(range(n), key=lambda i: -alphas[i]):
            plan[i] = max(range(max_len + 1), key=lambda k: (rate(plan[:i] + [k] + plan[i + 1:]), -k))
        if plan == before:
            break
    return plan


def derive_opt_tree_options(costs: Costs) -> dict:
    """OPT-Tree settings from measured costs: delta = t_draft / t_target (the paper's lower end of
    [t_draft/t_target, 1]); n = the widest tree whose verification costs at most 25% more than one token's."""
    delta = min(1.0, max(0.01, costs.draft_step_s / costs.target(1)))
    n = 2
    while n < 64 and costs.target(2 * n + 1) <= 1.25 * costs.target(1):
        n *= 2
    return {"n": n, "delta": delta}


def cache_path() -> Path:
    root = os.environ.get("SEED_TOT_CACHE_DIR") or Path.home() / ".cache" / "seed-tot"
    return Path(root) / "calibration.json"


# config entries that name a model or restate what the key holds otherwise (class, parameter dtypes), and
# that differ between a model built in code and the same model saved and loaded: neither splits its costs
_NAME_KEYS = ("_name_or_path", "name_or_path", "_commit_hash", "architectures", "dtype", "torch_dtype")


def _model_signature(model) -> dict:
    """What a model's forward cost depends on: its class, config and parameter shapes and dtypes.
    The weights' values do not matter, so a noisy copy or a fine-tune of a model shares its costs.
    Not the attention implementation (to_dict leaves it out): the engine may install its own on a
    model in use, and the key must not change under a model between two calls."""
    config = getattr(model, "config", None)
    settings = config.to_dict() if hasattr(config, "to_dict") else {}
    settings = {k: v for k, v in settings.items() if k not in _NAME_KEYS}
    params = [(name, tuple(p.shape), str(p.dtype)) for name, p in model.named_parameters()]
    first = next(model.parameters(), None)
    return {"class": type(model).__name__, "config": settings, "params": params,
            "device": str(first.device) if first is not None else "cpu"}


def _machine(device: torch.device) -> str:
    """The hardware and threads a forward runs on (a cache directory may be shared between machines)."""
    where = f"{platform.node()}/{platform.machine()}/{os.cpu_count()}cpus/{torch.get_num_threads()}threads"
    if device.type == "cuda":
        where += f"/{torch.cuda.get_device_name(device)}"
    return where


def cache_key(engine) -> str:
    """The calibration cache's key for `engine`: what determines its forward costs (each model's
    architecture and shapes, dtype and device, and the machine), never the names the engine was given,
    which `Engine(model, draft)` sets to "target"/"draft" for every pair. Readable in front, exact in
    the digest: different models never share an entry, and the same model always does."""
    target, draft = engine.target, engine.draft
    signature = json.dumps([_model_signature(target), _model_signature(draft) if draft is not None else None],
                           sort_keys=True, default=str)
    digest = hashlib.sha256(signature.encode("utf-8")).hexdigest()[:24]
    names = f"{type(target).__name__}+{type(draft).__name__ if draft is not None else '-'}"
    return f"{names}|{target.device}|{target.dtype}|{_machine(target.device)}|{digest}"


def calibration_plan(engine, context: int = 64, sizes: tuple[int, ...] = CALIBRATION_TOKENS,
                     draft_sizes: tuple[int, ...] = DRAFT_CALIBRATION_TOKENS) -> tuple[int, tuple, tuple]:
    """The prefix length and the target and draft query sizes to time, within the models' limits: a
    model with learned positions (GPT-2, OPT) has none past its table, so there the prefix shrinks to
    half of it and the sizes that would not fit after it are left out (`Costs` extrapolates past them)."""
    from ..kv_cache import layout_of

    limits = [layout_of(m).max_positions for m in (engine.target, engine.draft) if m is not None]
    limit = min((n for n in limits if n is not None), default=None)
    if limit is not None:
        if limit < 2:
            raise ValueError(f"a model with learned position embeddings for {limit} position(s) leaves no room "
                             f"to calibrate forward costs")
        context = min(context, limit // 2)
    room = float("inf") if limit is None else limit - context
    return (context, tuple(n for n in sorted(set(sizes) | {1}) if n <= room),
            tuple(n for n in sorted(set(draft_sizes) | {1}) if n <= room))


@torch.inference_mode()
def calibrate(engine, repeats: int = 3, context: int = 64, sizes: tuple[int, ...] = CALIBRATION_TOKENS,
              draft_sizes: tuple[int, ...] = DRAFT_CALIBRATION_TOKENS) -> Costs:
    """Time target forwards of each of `sizes` tokens and draft forwards of each of `draft_sizes`
    after a `context`-token prefix (the best of `repeats`, after a warm-up), within the models'
    position limits (`calibration_plan`)."""
    from ..kv_cache import KVCache
    from ..speculative import prefill

    context, sizes, draft_sizes = calibration_plan(engine, context, sizes, draft_sizes)
    prompt = [i % engine.vocab_size for i in range(1, context + 1)]

    def timed(model, n_new: int) -> float:
        kv = KVCache()
        prefill(model, kv, prompt)
        best = float("inf")
        for _ in range(repeats + 1):  # the first is a warm-up
            start = time.perf_counter()
            kv.forward(model, prompt[:n_new], [i - 1 for i in range(n_new)])
            best = min(best, time.perf_counter() - start)
            kv.commit([])
        return best

    points = tuple((n, timed(engine.target, n)) for n in sizes)
    draft_points = tuple((n, timed(engine.draft, n)) for n in draft_sizes)
    (n0, one), (n1, many) = points[0], points[-1]
    per_token = max(0.0, (many - one) / max(n1 - n0, 1))  # the straight line, kept for reading the cache
    return Costs(max(one - per_token * n0, 1e-6), per_token, draft_points[0][1], points, draft_points)


def _current(entry: dict, largest: int) -> bool:
    """Whether this version measured the entry up to `largest` target tokens (the most this engine's
    models hold, `calibration_plan`): older ones hold a line only, or single-row sizes up to 16 tokens
    and no batched draft steps. Those are measured again."""
    sizes = [n for n, _ in entry.get("target_points", ())]
    return "draft_points" in entry and max(sizes, default=0) >= largest


def load_costs(engine, recalibrate: bool = False) -> Costs:
    """This engine's costs from the cache, measured (and cached) when missing. Entries under keys of
    other versions (display names, before `cache_key`) are left in the file and never read."""
    path, key = cache_path(), cache_key(engine)
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        cached = {}
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: unreadable calibration cache ({err}); delete it to recalibrate") from None
    if not isinstance(cached, dict):
        raise ValueError(f"{path}: unreadable calibration cache (not a JSON object); delete it to recalibrate")
    entry = cached.get(key, {})
    if _current(entry, calibration_plan(engine)[1][-1]) and not recalibrate:
        return Costs(**{**entry, **{k: tuple((int(n), float(t)) for n, t in entry[k])
                                    for k in ("target_points", "draft_points")}})
    costs = calibrate(engine)
    log.info("calibrated %s: %s", key, costs)
    cached[key] = asdict(costs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cached, indent=2) + "\n", encoding="utf-8")
    return costs


def _flag(value) -> bool:
    """An on/off option: a bool from Python, a string from the command line."""
    return str(value).lower() in ("1", "true", "yes", "on")


@dataclass
class _SeqState:
    hits: float  # decayed accepted draft tokens
    trials: float  # decayed draft tokens the target judged (accepted + the first rejected)
    plain_rounds: int = 0
    probe_gap: int = 0


class AutoPolicy(DraftPolicy):
    name = "auto"
    drafts_trees = False  # a chain of the chosen length, or SpecDec++'s chain with a head

    def __init__(self, costs: Costs, max_len: int = 8, prior: float = 0.5, prior_weight: float = 2.0,
                 decay: float = 0.9, probe_every: int = 8, head=None, eos_ids=frozenset(),
                 capture: HiddenCapture | None = None, load: str = "greedy"):
        if not 0 <= prior <= 1 or max_len < 1 or probe_every < 1 or not 0 < decay <= 1:
            raise ValueError("auto needs 0 <= prior <= 1, max_len >= 1, probe_every >= 1 and 0 < decay <= 1")
        if head is not None and capture is None:
            raise ValueError("auto with a head needs a HiddenCapture of the draft model")
        self.costs, self.max_len, self.prior, self.prior_weight = costs, max_len, prior, prior_weight
        self.decay, self.probe_every = decay, probe_every
        self.head, self.eos_ids, self.capture = head, frozenset(eos_ids), capture
        self._state: dict[int, _SeqState] = {}
        self.load = load_option(self.name, load)
        self._planned: dict[int, int] = {}  # id(seq) -> the length its batch's plan gave it

    @classmethod
    def from_options(cls, engine, k_config, params, max_len=8, prior=0.5, probe_every=8, recalibrate="false",
                     head=None, load="greedy") -> "AutoPolicy":
        head_model = None
        if head is not None:
            from .specdec import load_checked_head
            head_model = load_checked_head(head, engine, params)
        return cls(load_costs(engine, recalibrate=_flag(recalibrate)),
                   option(cls.name, "max_len", max_len, int, 1), option(cls.name, "prior", prior, float, 0),
                   probe_every=option(cls.name, "probe_every", probe_every, int, 1), head=head_model,
                   eos_ids=engine.eos_ids, capture=HiddenCapture.of(engine.draft) if head_model is not None else None,
                   load=load)

    def predict(self, hidden: torch.Tensor) -> float:
        """P̂ for the token whose entry produced `hidden` (one vector)."""
        return accept_probability(self.head, hidden)

    def enough(self, n: int, rnd) -> bool:
        """Stop after n drafted tokens once one more is not expected to raise tokens per second."""
        # before the head has judged a token, the sequence's running estimate stands in for P̂
        a = rnd.last_p if rnd.last_p is not None else self.alpha(rnd.b.seq)
        e_now = 1.0 + rnd.survival_sum + rnd.survival * a
        e_next = e_now + rnd.survival * a * a
        t_now = n * self.costs.draft_step_s + self.costs.target(n + 1)
        t_next = t_now + self.costs.draft_step_s + self.costs.extra_token(n + 1)
        return e_next / t_next <= e_now / t_now

    def _seq(self, seq) -> _SeqState:
        return self._state.setdefault(id(seq), _SeqState(0.0, 0.0, 0, self.probe_every))

    def alpha(self, seq) -> float:
        s = self._seq(seq)
        return (s.hits + self.prior * self.prior_weight) / (s.trials + self.prior_weight)

    def plan_batch(self, seqs: list, rows: int) -> None:
        """Plan this policy's rows of one batched draft round of `rows` rows in all. Rows planned
        elsewhere (other calls; here, sampled rows under load=greedy) count at their own best length,
        other calls' at one verified token each. Unplanned rounds (a row drafted alone, `sd`) use
        the row's own best length."""
        together = planned_together(seqs, self.load)
        if rows <= 1 or not together:
            return
        planned = {id(s) for s in together}
        alone = sum(best_length(self.alpha(s), self.costs, self.max_len) + 1 for s in seqs if id(s) not in planned)
        lengths = plan_lengths([self.alpha(s) for s in together], [len(s.pending(s.draft)) for s in together],
                               self.costs, self.max_len, rows - len(seqs) + alone)
        self._planned.update({id(s): k for s, k in zip(together, lengths)})

    def choose(self, seq) -> int:
        s = self._seq(seq)
        k = best_length(self.alpha(seq), self.costs, self.max_len)
        planned = self._planned.pop(id(seq), None)
        if k > 0:  # worth drafting alone; how far depends on what shares the forwards
            return k if planned is None else planned
        s.plain_rounds += 1
        if s.plain_rounds >= s.probe_gap:  # look again: the draft may have started to agree
            s.plain_rounds = 0
            return 1
        return 0

    def begin(self, seq, params: SamplingParams, vocab_size: int) -> DraftRound:
        k = self.choose(seq)
        if not k:
            return _NoDraft(vocab_size)
        builder = TreeBuilder(seq, params, vocab_size)
        if self.head is not None:
            from .specdec import SpecDecRound
            return SpecDecRound(builder, self)
        return FixedRound(builder, (1,) * k)

    def observe(self, seq, tree: DraftTree, acceptance) -> None:
        super().observe(seq, tree, acceptance)
        depth = tree.depth()
        if depth:
            s = self._seq(seq)
            accepted = len(acceptance.path)
            s.hits = self.decay * s.hits + accepted
            s.trials = self.decay * s.trials + accepted + (accepted < depth)
            if best_length(self.alpha(seq), self.costs, self.max_len) == 0:  # a failed probe: wait longer
                s.probe_gap = min(MAX_PROBE_GAP, 2 * s.probe_gap)
            else:
                s.probe_gap = self.probe_every
        if seq.done:
            self._state.pop(id(seq), None)
            self._planned.pop(id(seq), None)


class _NoDraft(DraftRound):
    """A plain target step: no draft forward; the draft cache catches up when drafting resumes."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def first_feed(self):
        return None

    def finish(self):
        return DraftTree.empty(self.vocab_size), {}
