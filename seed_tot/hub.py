"""Whether the Hugging Face Hub can be asked at all, found out before a model or a dataset is loaded.

Where the Hub cannot be reached, huggingface_hub retries each file with growing waits (every retry
warned twice) before its error: half a minute of warnings before a model or a Hub dataset fails.
One probe here, asked once per process, lets the model loader (engine/models.py) and the data loader
(tasks/loading.py) fail at once in one line instead, or go to a cached copy. torch-free and
seed_tot-free, so either side imports it without pulling in the other.
"""
from __future__ import annotations

import functools
import urllib.error
import urllib.request

HUB_PROBE_TIMEOUT_S = 5.0


def offline_mode() -> bool:
    """HF_HUB_OFFLINE=1: the user asked for cached copies only, so the Hub is never probed."""
    from huggingface_hub import constants

    return constants.is_offline_mode()


def unreachable_hub() -> str | None:
    """Why the Hub this process would ask (HF_ENDPOINT) cannot be reached, as words that can follow
    "cannot load X:", or None when it answers."""
    from huggingface_hub import constants

    problem = hub_unreachable(constants.ENDPOINT)
    return None if problem is None else f"the Hugging Face Hub ({constants.ENDPOINT}) is unreachable ({problem})"


@functools.lru_cache(maxsize=None)
def hub_unreachable(endpoint: str) -> str | None:
    """Why `endpoint` cannot be reached (one request, no retries; proxies from the environment
    apply), or None when it answers at all. Asked once per process: target, draft, their
    tokenizers and the task's dataset would otherwise each wait for it."""
    request = urllib.request.Request(endpoint, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=HUB_PROBE_TIMEOUT_S):
            return None
    except urllib.error.HTTPError:
        return None  # an HTTP status is an answer: the Hub is there
    except OSError as err:  # URLError, timeouts, DNS and connection failures
        return str(getattr(err, "reason", err))
