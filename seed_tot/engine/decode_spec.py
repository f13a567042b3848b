"""`DecodeSpec`: every decoding setting of an engine call, in one immutable, validated object.

The command line, a YAML config (search/config.py) and Python callers all build one here; the
same object then travels unchanged through the search layer (RunSettings, LLMCaller) to
`Engine.generate` and on to its scheduler. Each setting has one canonical form, so nothing
downstream converts or re-checks it:

    mode            one of MODES
    k_config        a tuple of positive ints ("2,2,1", [2, 2, 1] and (2, 2, 1) all become (2, 2, 1))
    n_workers       a positive int, or None: one draft worker per sequence
    verify_batch    a positive int, "all" (every queued draft) or "auto" (decided per model pair by
    draft_batch     the engine, Engine.resolve_batches); None, the older Python spelling, is "all"
    draft_policy    a policy name (engine/policies), a DraftPolicy object, or None: the engine's default
    policy_options  (key, value) pairs sorted by key; a mapping or pairs are accepted

This module imports no torch (and nothing of the engine), so the command line parses a spec
without loading it (`seed-tot --help` stays fast), and the policy package can import from here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

MODES = ("ar", "parallel", "sd", "mcsd", "seed")
DRAFTING_MODES = ("sd", "mcsd", "seed")  # the modes that run a draft model
AUTO_BATCH = "auto"  # SEED's default draft/verify batch: batched where exact (Engine.resolve_batches)
ALL_BATCH = "all"  # every queued draft / ready worker; the canonical form of None too
POLICIES = ("fixed", "opt-tree", "specdec", "auto", "parallelspec", "lookup", "suffix", "choose")  # engine/policies builds them


class DecodeSpecError(ValueError):
    """A bad decoding setting; `setting` names it."""

    def __init__(self, setting: str, message: str):
        super().__init__(message)
        self.setting = setting

    def __reduce__(self):  # both arguments, so that the error survives pickling (a Ray actor raising it)
        return type(self), (self.setting, str(self))


def check_k_config(k_config: Any) -> tuple[int, ...]:
    """A draft-tree shape: k_config[d] children per node at depth d+1, e.g. (2, 2, 1); the command
    line's "2,2,1" too."""
    if isinstance(k_config, str):
        k_config = [part for part in k_config.replace(" ", "").strip("()").split(",") if part]
    try:
        # int() alone would truncate, (1.5, 2) ran as (1, 2); like the batch sizes, no float or bool is a count
        if any(isinstance(c, (float, bool)) for c in k_config):
            raise ValueError
        k = tuple(int(c) for c in k_config)
    except (TypeError, ValueError):
        raise DecodeSpecError("k_config", f"k_config must be a sequence of positive integers, got {k_config!r}") from None
    if not k or any(c <= 0 for c in k):
        raise DecodeSpecError("k_config", f"k_config must be a non-empty sequence of positive integers, "
                                          f"got {k_config!r}")
    return k


def _mode(value: Any) -> str:
    if value not in MODES:
        raise DecodeSpecError("mode", f"unknown mode {value!r}; expected one of {', '.join(MODES)}")
    return value


def _positive_int(setting: str, value: Any, allowed: str) -> int:
    """value as a positive int (a string of digits from a command line too), else an error naming
    the setting and what it accepts."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DecodeSpecError(setting, f"{setting} must be {allowed}, got {value!r}")
    return value


def _n_workers(value: Any) -> int | None:
    return None if value is None else _positive_int("n_workers", value, "a positive integer or None (one per sequence)")


def _batch(setting: str) -> Callable[[Any], int | str]:
    def canonical(value: Any) -> int | str:
        if value is None or value == ALL_BATCH:
            return ALL_BATCH
        if value == AUTO_BATCH:
            return AUTO_BATCH
        return _positive_int(setting, value, f"a positive integer, None or {ALL_BATCH!r} (every one) or "
                                             f"{AUTO_BATCH!r} (batched where the models take it exactly)")
    return canonical


def _draft_policy(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str):
        if value not in POLICIES:
            raise DecodeSpecError("draft_policy", f"unknown draft_policy {value!r}; expected one of "
                                                  f"{', '.join(POLICIES)}")
        return value
    # a DraftPolicy object, recognised by its interface (policies/base.py): importing the class here
    # would load torch and tie this module to the policy package, which imports from it
    if not callable(getattr(value, "begin", None)) or not callable(getattr(value, "observe", None)):
        raise DecodeSpecError("draft_policy", f"draft_policy must be a policy name or a DraftPolicy, got {value!r}")
    return value


def _policy_options(value: Any) -> tuple[tuple[str, Any], ...]:
    if value is None:
        return ()
    pairs = value.items() if isinstance(value, Mapping) else value
    try:
        options = dict(pairs)
    except (TypeError, ValueError):
        raise DecodeSpecError("policy_options", f"policy_options must be a mapping of option names to values, "
                                                f"got {value!r}") from None
    bad = [key for key in options if not isinstance(key, str) or not key]
    if bad:
        raise DecodeSpecError("policy_options", f"policy_options keys must be non-empty strings, got {bad[0]!r}")
    return tuple(sorted(options.items()))


# setting -> its canonical form (or DecodeSpecError); the one place each setting is checked
_CANONICAL: dict[str, Callable[[Any], Any]] = {
    "mode": _mode, "k_config": check_k_config, "n_workers": _n_workers, "verify_batch": _batch("verify_batch"),
    "draft_batch": _batch("draft_batch"), "draft_policy": _draft_policy, "policy_options": _policy_options}
SETTINGS = tuple(_CANONICAL)


@dataclass(frozen=True)
class DecodeSpec:
    """How an engine call decodes. Built from any accepted spelling (see the module docstring);
    holds the canonical one. Equal specs decode alike."""

    mode: str = "seed"
    k_config: tuple[int, ...] = (1, 1, 1)
    n_workers: int | None = None
    verify_batch: int | str = AUTO_BATCH
    draft_batch: int | str = AUTO_BATCH
    draft_policy: Any = None
    policy_options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        for name, canonical in _CANONICAL.items():
            object.__setattr__(self, name, canonical(getattr(self, name)))
        if self.policy_options and not isinstance(self.draft_policy, (str, type(None))):
            raise DecodeSpecError("policy_options", "policy_options go with a policy name, not with a DraftPolicy object")

    @staticmethod
    def canonical(setting: str, value: Any) -> Any:
        """One setting's canonical form (a command-line callback's check), or DecodeSpecError."""
        return _CANONICAL[setting](value)

    def replace(self, **changes: Any) -> "DecodeSpec":
        """A copy with `changes` (any accepted spelling), checked like a new spec."""
        unknown = sorted(set(changes) - set(SETTINGS))
        if unknown:
            raise DecodeSpecError(unknown[0], f"unknown decoding setting {unknown[0]!r}; known: {', '.join(SETTINGS)}")
        return dataclasses.replace(self, **changes)

    @property
    def options(self) -> dict[str, Any]:
        """policy_options as a dict (a fresh one: the spec stays immutable)."""
        return dict(self.policy_options)

    @property
    def verify_limit(self) -> int | None:
        """Drafts per target forward as the scheduler counts them: None for every queued one."""
        return _limit("verify_batch", self.verify_batch)

    @property
    def draft_limit(self) -> int | None:
        """Ready workers per draft forward as the scheduler counts them: None for every ready one."""
        return _limit("draft_batch", self.draft_batch)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML values (a DraftPolicy object by its name)."""
        policy = self.draft_policy if isinstance(self.draft_policy, (str, type(None))) else self.draft_policy.name
        return {"mode": self.mode, "k_config": list(self.k_config), "n_workers": self.n_workers,
                "verify_batch": self.verify_batch, "draft_batch": self.draft_batch, "draft_policy": policy,
                "policy_options": self.options}


def _limit(setting: str, value: int | str) -> int | None:
    if value == AUTO_BATCH:  # a bug, not a user error: the engine decides "auto" before scheduling
        raise ValueError(f"{setting}='auto' must be resolved for the models first (Engine.resolve_batches)")
    return None if value == ALL_BATCH else value


def call_spec(spec: DecodeSpec | None, default_mode: str, **keywords: Any) -> DecodeSpec:
    """The spec of one `Engine.generate`/`agenerate` call: `spec` as given, else one built from the
    loose keyword settings (the older API, still supported), a mode of None being `default_mode`.
    Both at once is an error: one of them would be silently ignored."""
    if isinstance(keywords.get("mode"), DecodeSpec):  # generate(prompts, params, DecodeSpec(...))
        raise TypeError("a DecodeSpec goes in as spec=DecodeSpec(...); the third positional argument is mode")
    if keywords.get("mode") is None:
        keywords["mode"] = default_mode
    loose = DecodeSpec(**keywords)
    if spec is None:
        return loose
    if not isinstance(spec, DecodeSpec):
        raise TypeError(f"spec must be a DecodeSpec, got {type(spec).__name__}")
    if loose != DecodeSpec(mode=default_mode):
        raise ValueError("pass the decoding settings either as spec=DecodeSpec(...) or as keywords "
                         "(mode, k_config, ...), not both")
    return spec
