"""Forward costs on the running hardware: what the cost-aware policies (auto, parallelspec's cut,
opt-tree's derived settings) weigh a drafted token against.

A short calibration (`calibrate`) times target forwards at 1, 2, 3, 4, 6, 8, 12 ... 64 query tokens
after a 64-token prefix, and batched draft steps at 1 ... 32 tokens and one prompt-sized 128; `Costs` reads between the
measured sizes piecewise-linearly. Piecewise, not a + b * tokens: on a CPU a forward is nearly flat
for the first few tokens and then grows, so a straight line through 1 and 64 tokens overstates short
chains and a policy drafts fewer tokens than pay (docs/benchmarks.md, "Figures behind the code's
design choices", has the table that showed it). The sizes are timed round by round (a busy
stretch of the machine then costs one repeat of several sizes, which the best of the repeats drops),
and read through their monotone fit (a forward of more tokens never costs less: a dip is noise).

Costs are cached per target/draft architecture and shapes, dtype, device and machine (`cache_key`)
in $SEED_TOT_CACHE_DIR (default ~/.cache/seed-tot)/calibration.json, so a machine calibrates once.
Not a calibration taken while the machine was busy (`contention`: other processes used the cores,
or repeats of one forward spread widely): that one serves the run that took it, with a warning, and
the next run measures again (or `--policy-option recalibrate=true` once the machine is quiet).

It also times a loaded round (`loaded_points`): LOADED_ROWS rows forked from one prompt (as a
thought call's rows are), each with tokens of its own after it, scoring one token each, and the
same round with one row scoring 1, 2, 4 or 8 tokens more. A row that plans its round alone (`choose`'s sampled rows) prices its drafted tokens
with it (`Costs.at_load`): what one row's draft adds to a forward of rows with long histories is
not what a one-row forward's tokens cost (on a CPU a drafting row sets its queries' attention apart,
row_attention.RowSplit, a cost of its own), and these are calibrated, not wall-clock seconds of the
run, so a sample for a seed still depends on nothing beside it.
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
from tqdm import tqdm

log = logging.getLogger(__name__)


# up to 64: a batched verification carries rows x (draft length + 1) tokens
CALIBRATION_TOKENS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
DRAFT_CALIBRATION_TOKENS = (1, 2, 4, 8, 16, 32, 128)  # 128: what a prompt prefill costs (auto prices it)
# the loaded round: its rows (as many as a sampled row's round is priced at, policies/base.SAMPLED_ROWS),
# their shared prompt and each row's own tokens after it, and the tokens one row scores beyond its one
# (0: the plain round)
LOADED_ROWS = 8
LOADED_CONTEXT, LOADED_OWN = 256, 32
LOADED_EXTRA = (0, 1, 2, 4, 8)
# how a cached entry was timed: every size once per round (`calibrate`), with the loaded round
TIMING = "rounds+loaded"


@dataclass(frozen=True)
class Costs:
    """Seconds. One target forward of n query tokens costs, where `target_points` holds measured
    (tokens, seconds) pairs, their piecewise-linear interpolation (the last segment's slope past the
    end); otherwise target_fixed_s + target_per_token_s * n. One draft step of one row costs
    draft_step_s; a batched draft step of n tokens (rows x fed entries) `draft(n)`, read from
    `draft_points` the same way (flat at draft_step_s without them).

    A forward's cost is keyed by its query tokens, not by how they split into rows: the weights'
    matmuls see rows x tokens as one dimension, and the attention over a few hundred cached entries
    is small beside them (docs/benchmarks.md, "Figures behind the code's design choices")."""

    target_fixed_s: float
    target_per_token_s: float
    draft_step_s: float
    target_points: tuple[tuple[int, float], ...] = ()
    draft_points: tuple[tuple[int, float], ...] = ()
    # (tokens one row scores beyond its one, seconds) of a round of LOADED_ROWS rows (the module's docstring)
    loaded_points: tuple[tuple[int, float], ...] = ()

    def __post_init__(self):
        # read through their monotone fit: a forward of more tokens never costs less, so a calibration
        # whose 9 tokens time below its 3 measured noise, and a plan built on that dip drafts for nothing
        for name in ("target_points", "draft_points", "loaded_points"):
            object.__setattr__(self, name, monotone_fit(getattr(self, name)))

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

    def at_load(self, rows: int) -> "Costs | LoadedRound":
        """What a round of `rows` one-token rows, one of which plans its draft alone, is priced with:
        the loaded round where it was timed, else these costs."""
        if len(self.loaded_points) < 2 or self.loaded_points[0][1] <= 0:
            return self
        return LoadedRound(self, rows)


class RoundCosts:
    """`Costs` read at one round of `rows` rows: a subclass says what its target forwards cost; the
    draft model's steps are the calibration's (what `best_option` and `decode_saving` read)."""

    def __init__(self, calibrated: Costs, rows: int):
        self.calibrated, self.rows = calibrated, max(1, rows)
        self.draft_step_s = calibrated.draft_step_s

    def target(self, tokens: int) -> float:
        raise NotImplementedError

    def draft(self, tokens: int) -> float:
        return self.calibrated.draft(tokens)

    def extra_token(self, tokens: int) -> float:
        return self.target(tokens + 1) - self.target(tokens)


class LoadedRound(RoundCosts):
    """The calibration's loaded round at `rows` rows: target(rows) is the timed plain round scaled to
    `rows` (per row: LOADED_ROWS of them shared one forward), and target(rows + n) adds what one row
    scoring n more tokens added to it."""

    def __init__(self, costs: Costs, rows: int):
        super().__init__(costs, rows)
        self._plain = costs.loaded_points[0][1]
        self._round = self._plain * self.rows / LOADED_ROWS

    def target(self, tokens: int) -> float:
        extra = tokens - self.rows
        if extra <= 0:  # fewer tokens than rows: the round's share of them
            return self._round * max(tokens, 1) / self.rows
        return self._round + _piecewise(self.calibrated.loaded_points, extra) - self._plain


def monotone_fit(points: tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
    """The non-decreasing curve closest to `points` (sizes ascending) in least squares: each run of
    sizes that time below an earlier one is replaced by its mean (pool-adjacent-violators)."""
    blocks: list[list[float]] = []  # [sum of seconds, sizes pooled]
    for _, seconds in points:
        blocks.append([seconds, 1])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted = [total / count for total, count in blocks for _ in range(int(count))]
    return tuple((n, seconds) for (n, _), seconds in zip(points, fitted))


def _piecewise(points: tuple[tuple[int, float], ...], tokens: int) -> float:
    # the segment whose right end is the first measured size >= tokens (the end segments extrapolate)
    i = min(max(bisect.bisect_left([n for n, _ in points], tokens), 1), len(points) - 1)
    (n0, t0), (n1, t1) = points[i - 1], points[i]
    return max(t0 + (t1 - t0) * (tokens - n0) / (n1 - n0), 0.0)


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
    Not the attention implementation (to_dict leaves it out): the engine names its own on a model's
    config while a batched forward runs, and the key must not depend on when it is read."""
    config = getattr(model, "config", None)
    settings = config.to_dict() if hasattr(config, "to_dict") else {}
    settings = {k: v for k, v in settings.items() if k not in _NAME_KEYS}
    params = [(name, tuple(p.shape), str(p.dtype)) for name, p in model.named_parameters()]
    first = next(model.parameters(), None)
    # the classes of its linear layers: the kernel they run (cpu_linear.py) sets a CPU forward's cost
    linears = sorted({type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.Linear)})
    return {"class": type(model).__name__, "config": settings, "params": params, "linears": linears,
            "device": str(first.device) if first is not None else "cpu"}


CPUINFO = Path("/proc/cpuinfo")


def _cpu_model() -> str:
    """The CPU's model and a digest of its instruction-set flags: virtual machines share a host name,
    and one with AVX-512 times a forward at a fraction of what one with AVX2 alone takes."""
    try:
        info = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:  # not Linux
        return platform.processor() or "cpu"
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)  # the last core's; all alike
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = hashlib.sha256(fields.get("flags", "").encode("utf-8")).hexdigest()[:8]
    return f"{fields.get('model name', platform.processor() or 'cpu')} ({flags})"


def _machine(device: torch.device) -> str:
    """The hardware and threads a forward runs on (a cache directory may be shared between machines)."""
    where = (f"{platform.node()}/{platform.machine()}/{_cpu_model()}/{os.cpu_count()}cpus/"
             f"{torch.get_num_threads()}threads")
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
    limits = [r.layout.max_positions for r in (engine.target_runtime, engine.draft_runtime) if r is not None]
    limit = min((n for n in limits if n is not None), default=None)
    if limit is not None:
        if limit < 2:
            raise ValueError(f"a model with learned position embeddings for {limit} position(s) leaves no room "
                             f"to calibrate forward costs")
        context = min(context, limit // 2)
    room = float("inf") if limit is None else limit - context
    return (context, tuple(n for n in sorted(set(sizes) | {1}) if n <= room),
            tuple(n for n in sorted(set(draft_sizes) | {1}) if n <= room))


# Contention: a forward that lasts at least this long can be stretched by another process in every
# repeat (a time slice is milliseconds); the best of a few repeats of a shorter one nearly always finds
# an undisturbed run, so short forwards say nothing either way (and tiny models always count as quiet)
CONTENTION_MIN_FORWARD_S = 1e-3
CONTENTION_BUSY = 0.5  # cores other processes kept busy while timing, beyond those our threads left free
CONTENTION_SPREAD = 0.25  # median over sizes of (slowest / fastest repeat - 1)


@dataclass(frozen=True)
class Calibration:
    """What `measure` found: the costs, every timed repeat per (role, tokens), and the cores other
    processes kept busy meanwhile (`cores` of them usable, `threads` of them ours)."""

    costs: Costs
    repeats: dict
    others_busy: float
    cores: int
    threads: int | None = None

    @property
    def contention(self) -> str | None:
        return contention(list(self.repeats.values()), self.others_busy, self.cores, self.threads)


def contention(repeats: list[list[float]], others_busy: float, cores: int, threads: int | None = None) -> str | None:
    """Why timings were taken on a busy machine (None: they look quiet). `repeats`: each forward
    size's timed repeats, seconds; only sizes whose fastest repeat lasts CONTENTION_MIN_FORWARD_S
    count. Other processes on the cores our `threads` (None: all cores) left free took nothing from them."""
    long = [times for times in repeats if times and min(times) >= CONTENTION_MIN_FORWARD_S]
    if not long:
        return None
    ours = cores if threads is None else min(threads, cores)
    if others_busy >= cores - ours + CONTENTION_BUSY:
        return f"other processes kept {others_busy:.1f} of {cores} cores busy beside this one's {ours} thread(s)"
    spreads = sorted(max(times) / min(times) - 1 for times in long if len(times) > 1)
    if spreads and spreads[len(spreads) // 2] > CONTENTION_SPREAD:
        return f"repeats of one forward differed by {spreads[len(spreads) // 2]:.0%} (median over sizes)"
    return None


@torch.inference_mode()
def calibrate(engine, repeats: int = 3, context: int = 64, sizes: tuple[int, ...] = CALIBRATION_TOKENS,
              draft_sizes: tuple[int, ...] = DRAFT_CALIBRATION_TOKENS) -> Costs:
    """Time target forwards of each of `sizes` tokens and draft forwards of each of `draft_sizes`
    after a `context`-token prefix (the best of `repeats`, after a warm-up), within the models'
    position limits (`calibration_plan`)."""
    return measure(engine, repeats, context, sizes, draft_sizes).costs


@torch.inference_mode()
def measure(engine, repeats: int = 3, context: int = 64, sizes: tuple[int, ...] = CALIBRATION_TOKENS,
            draft_sizes: tuple[int, ...] = DRAFT_CALIBRATION_TOKENS) -> Calibration:
    """`calibrate`, with every repeat and the machine's load while it ran (for `contention`)."""
    from .cpu_threads import CpuLoad
    from .kv_cache import KVCache
    from .speculative import prefill

    context, sizes, draft_sizes = calibration_plan(engine, context, sizes, draft_sizes)
    prompt = [i % engine.vocab_size for i in range(1, context + 1)]

    roles = {"target": (engine.target_runtime, sizes), "draft": (engine.draft_runtime, draft_sizes)}
    caches = {role: KVCache() for role in roles}
    for role, (runtime, _) in roles.items():
        prefill(runtime, caches[role], prompt)

    def single(role: str, n_new: int):
        caches[role].forward(roles[role][0], (prompt * (n_new // context + 1))[:n_new], [j - 1 for j in range(n_new)])
        caches[role].commit([])

    steps = {(role, n): (lambda role=role, n=n: single(role, n)) for role, (_, group) in roles.items() for n in group}
    loaded = _loaded_round(engine)
    if loaded is not None:
        steps.update({("loaded", n): (lambda n=n: loaded(n)) for n in LOADED_EXTRA})
    runs = list(steps)
    best = [float("inf")] * len(runs)
    timed: list[list[float]] = [[] for _ in runs]
    load = CpuLoad()
    load.sample()
    # a bar where a person waits (a terminal): on a CPU a pair of 1B models takes a minute or more
    bar = tqdm(total=(repeats + 1) * len(runs), desc="timing forwards (once per machine)", unit="forward",
               disable=None, leave=False)
    # round by round over every size, not each size's repeats in a row: a stretch of the machine
    # being busy elsewhere then slows one repeat of many sizes, which the best of the repeats drops,
    # instead of every repeat of one size, which it keeps as that size's cost
    with bar:
        for round_ in range(repeats + 1):  # the first is a warm-up
            for i, run in enumerate(runs):
                start = time.perf_counter()
                steps[run]()
                if round_:
                    timed[i].append(time.perf_counter() - start)
                    best[i] = min(best[i], timed[i][-1])
                bar.update()
    points = {role: tuple((n, t) for (r, n), t in zip(runs, best) if r == role) for role in ("target", "draft", "loaded")}
    (n0, one), (n1, many) = points["target"][0], points["target"][-1]
    per_token = max(0.0, (many - one) / max(n1 - n0, 1))  # the straight line, kept for reading the cache
    costs = Costs(max(one - per_token * n0, 1e-6), per_token, points["draft"][0][1], points["target"], points["draft"],
                  points["loaded"])
    return Calibration(costs, dict(zip(runs, timed)), load.sample(), load.cores, torch.get_num_threads())


def _loaded_round(engine):
    """A timed step of the loaded round (the module's docstring): LOADED_ROWS rows forked from one
    LOADED_CONTEXT-token prompt, each with LOADED_OWN tokens of its own after it; step(n) scores one
    token in every row and n more in the first, then drops them. None where the target's batched
    forwards do not read a pool (row_attention.serves) or its position table is too short."""
    from . import row_attention
    from .kv_cache import KVCache, forward_batch
    from .speculative import prefill

    runtime = engine.target_runtime
    limit = runtime.layout.max_positions
    context = LOADED_CONTEXT if limit is None else min(LOADED_CONTEXT, limit - LOADED_OWN - max(LOADED_EXTRA) - 1)
    if not row_attention.serves(runtime.model) or context < LOADED_OWN:
        return None
    root = KVCache()
    prefill(runtime, root, [(7 * i) % engine.vocab_size for i in range(1, context + 1)])
    rows = [root.fork() for _ in range(LOADED_ROWS)]
    own = [[(11 * b + 3 * i) % engine.vocab_size for i in range(LOADED_OWN)] for b in range(LOADED_ROWS)]
    forward_batch(runtime, rows, own, [list(range(-1, LOADED_OWN - 1))] * LOADED_ROWS, what="the loaded round")
    for kv, tokens in zip(rows, own):
        kv.commit(list(range(len(tokens))))
    device = runtime.model.device

    def step(extra: int) -> None:
        widths = [1 + extra] + [1] * (LOADED_ROWS - 1)
        forward_batch(runtime, rows, [[5] * n for n in widths], [list(range(-1, n - 1)) for n in widths],
                      what="the loaded round")
        if device.type == "cuda":  # the round's seconds, not its launch's
            torch.cuda.synchronize(device)
        for kv in rows:
            kv.commit([])

    return step


def _current(entry: dict, largest: int, largest_draft: int) -> bool:
    """Whether this version measured the entry up to `largest` target and `largest_draft` draft tokens
    (the most this engine's models hold, `calibration_plan`): older ones hold a line only, or
    single-row sizes up to 16 tokens and no batched draft steps, or draft steps up to 32 tokens and
    no prompt-sized one (a prefill priced from them extrapolates the slope of small batched steps,
    nearly flat on a GPU), or timed size by size (a busy stretch of the machine could set one size's
    cost), or without the loaded round. Those are measured again."""
    sizes = [n for n, _ in entry.get("target_points", ())]
    draft_sizes = [n for n, _ in entry.get("draft_points", ())]
    return (max(sizes, default=0) >= largest and max(draft_sizes, default=0) >= largest_draft
            and entry.get("timing") == TIMING)


def costs_from_entry(entry: dict) -> Costs:
    """The Costs a calibration cache entry holds (JSON keeps its points as lists)."""
    fields = {k: v for k, v in entry.items() if k != "timing"}
    return Costs(**{**fields, **{k: tuple((int(n), float(t)) for n, t in entry.get(k, ()))
                                 for k in ("target_points", "draft_points", "loaded_points")}})


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
    _, sizes, draft_sizes = calibration_plan(engine)
    if _current(entry, sizes[-1], draft_sizes[-1]) and not recalibrate:
        return costs_from_entry(entry)
    log.info("timing %s's forwards for the cost-aware policies (cached in %s)", key, path)
    calibration = measure(engine)
    costs, busy = calibration.costs, calibration.contention
    log.info("calibrated %s: %s", key, costs)
    if busy is not None:
        log.warning("forward costs timed on a busy machine (%s): used for this run, not cached; the next run times "
                    "them again, or pass --policy-option recalibrate=true when the machine is quiet", busy)
        return costs
    cached[key] = {**asdict(costs), "timing": TIMING}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cached, indent=2) + "\n", encoding="utf-8")
    return costs
