"""Build a run's draft policy before its first call, so that a calibration happens before any clock.

The cost-aware policies (auto, parallelspec's cut=cost, opt-tree's derived settings) time the
machine's forwards the first time they are built on it (cost_model.load_costs, cached per machine).
Built inside the first call, that minute is the first problem's: its wall time and tokens/s count
it, and its progress bar sits at 0 tokens/s without a word. `prepare_policy` builds the policy the
calls will use (the engine keeps it: `Engine.policy`) and says when it calibrates and how long it took.
"""
from __future__ import annotations

import json
import logging
import time

from .decode_spec import DRAFTING_MODES, DecodeSpec
from .params import SamplingParams

log = logging.getLogger(__name__)

CALIBRATED = ("auto", "choose")  # the policies that always price their rounds with cost_model's calibration


def _cache_stamp() -> int | None:
    """When the calibration cache was last written (None: never): a calibration rewrites it."""
    from .cost_model import cache_path

    try:
        return cache_path().stat().st_mtime_ns
    except OSError:
        return None


def _cached(engine) -> bool:
    """Whether the cache holds costs for this engine's models on this machine (read only)."""
    from .cost_model import cache_key, cache_path

    try:
        return cache_key(engine) in json.loads(cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):  # none yet, or unreadable: load_costs says which
        return False


def prepare_policy(engine, spec: DecodeSpec, params: SamplingParams) -> None:
    """Build the policy of the calls `spec` and `params` describe (nothing for ar and parallel),
    calibrating now where it needs to: one log line before a calibrated policy's first calibration, one after any."""
    from .cost_model import cache_path
    from .policies.base import FLAGS

    if spec.mode not in DRAFTING_MODES:
        return
    name = engine.policy_name(spec.draft_policy, spec.mode, spec.k_config)
    recalibrate = FLAGS.get(str(spec.options.get("recalibrate", "false")).lower(), False)
    if name in CALIBRATED and (recalibrate or not _cached(engine)):
        log.info("calibrating: the %s policy times this machine's target and draft forwards, before the first "
                 "problem (seconds for small models, a minute or more for 1B models on a CPU; cached in %s for "
                 "later runs)", name, cache_path())
    stamp, start = _cache_stamp(), time.perf_counter()
    engine.policy(spec.mode, spec.k_config, params, spec.draft_policy, spec.options)
    if _cache_stamp() != stamp:
        log.info("calibrated for the %s policy in %.1f s (cached in %s: later runs reuse it; the policy option "
                 "recalibrate=true times the forwards again)", name, time.perf_counter() - start, cache_path())
