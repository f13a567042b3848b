"""The DraftPolicy of an engine's calls: the name a call runs, and the named policies built once per
engine, shape, greedy and options (each keeps its calibration, head and records across calls)."""
from __future__ import annotations

import threading

from .call_checks import MODEL_FREE_POLICIES, check_feature_policy, check_tree_policy, needs_draft
from .decode_spec import DRAFTING_MODES
from .params import SamplingParams


def policy_name(engine, draft_policy: str | None, mode: str, k_config: tuple[int, ...]) -> str:
    """The policy a drafting call runs: the one it names, else the engine's or its drafter's, else
    policies.default_policy_name's for the mode, k_config, target device and whether the models can score
    trees (seed on a CPU: choose; auto for an ALiBi model)."""
    from .policies import default_policy_name
    default = draft_policy or engine.default_policy or getattr(engine.draft, "default_policy", None)
    return default or default_policy_name(mode, k_config, engine.target.device.type, scores_trees(engine))


def scores_trees(engine) -> bool:
    """Whether the target and the draft model (if any) take tree masks (ALiBi models do not: masks.py)."""
    runtimes = [engine.target_runtime] + ([engine.draft_runtime] if engine.draft is not None else [])
    return not any(runtime.layout.alibi for runtime in runtimes)


class EnginePolicies:
    """The named policies built for one engine, by name, shape, greedy and options."""

    def __init__(self):
        self._built: dict = {}
        self._lock = threading.Lock()

    def get(self, engine, mode: str, k_config: tuple[int, ...], params: SamplingParams, draft_policy=None,
            policy_options: dict | None = None):
        """The DraftPolicy of a call on `engine`: an object as given, a name built once (see the class),
        None for ar and parallel."""
        from .policies import DraftPolicy
        if isinstance(draft_policy, DraftPolicy):  # DecodeSpec refuses policy_options beside one
            check_feature_policy(engine, draft_policy.name)
            if mode in DRAFTING_MODES:
                check_tree_policy(engine, draft_policy.name, draft_policy.drafts_trees, draft_policy.uses_draft_model)
            return draft_policy
        if mode not in DRAFTING_MODES:
            if draft_policy not in (None, "fixed") or policy_options:
                raise ValueError(f"mode {mode!r} drafts nothing: it takes no draft policy")
            return None
        shape = (1,) * len(k_config) if mode == "sd" else k_config
        name = policy_name(engine, draft_policy, mode, k_config)
        if engine.draft is None and name not in MODEL_FREE_POLICIES:
            raise needs_draft(mode)
        check_feature_policy(engine, name)
        key = (name, shape, params.greedy, tuple(sorted((policy_options or {}).items())))
        policy = self._built.get(key)
        if policy is None:
            # built on the forward thread, as every forward here (forward_thread.py): building may calibrate, which on the
            # caller's thread would time beside the step loop and leave that thread an OpenMP team (slowing it for good)
            policy = engine.on_forward_thread(self._build, engine, key, name, policy_options, shape, params)
        return policy

    def _build(self, engine, key: tuple, name: str, policy_options: dict | None, shape: tuple[int, ...],
               params: SamplingParams):
        """The named policy of `key`, built once (the first of two threads' calls builds it, the other reads it)."""
        from .policies import make_policy, may_draft_trees
        with self._lock:  # held on one thread only (the forward thread where there is one): never across a wait
            if key not in self._built:  # checked before it is built: building may calibrate, which runs forwards
                # every named policy that may draft trees feeds them to the draft model too
                check_tree_policy(engine, name, may_draft_trees(name, policy_options, engine, shape), True)
                self._built[key] = make_policy(name, policy_options, engine, shape, params)
            return self._built[key]

    def clear_text(self) -> None:
        """Forget the text every built policy drafts from (a run starts as a fresh engine)."""
        for policy in list(self._built.values()):
            policy.clear_text()
