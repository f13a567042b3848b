"""The words that choose how the engine runs its batched forwards (Engine(attention=, compile=)), as
the command line and the YAML configs give them. Plain values, no torch: `--help` and the config
parser read them without loading it.

Both choose a path, never the tokens: greedy output is the target's alone either way, so a run's
records do not depend on them (search/run_identity.py compares neither)."""
from __future__ import annotations

# "gather" copies each row's history out of the pool per layer; "pool" reads the pool in place (model_runtime.py)
ATTENTION_PATHS = ("gather", "pool")
# --compile's words -> Engine(compile=): None compiles on CUDA only (compiled_forward.CompileSettings)
COMPILE_WORDS = {"auto": None, "on": True, "off": False}
DEFAULT_ATTENTION, DEFAULT_COMPILE = "gather", "auto"


def compile_setting(word: str) -> bool | None:
    """Engine(compile=) from a compile word (auto, on, off); a ValueError naming them otherwise."""
    if word not in COMPILE_WORDS:
        raise ValueError(f"compile={word!r}: expected one of {', '.join(COMPILE_WORDS)}")
    return COMPILE_WORDS[word]


def describe(attention: str, compile_word: str) -> str:
    """The words a summary line or a bench header gives the two settings."""
    return f"attention={attention} compile={compile_word}"
