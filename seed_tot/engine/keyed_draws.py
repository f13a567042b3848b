"""Drafter-invariant sampling: every sampled token drawn at a uniform fixed by (row seed, position).

With `SamplingParams(draft_invariant=True)` the token at position t of a row is

    x_t = inverse_cdf(p_t, u(seed, t))        p_t: the target's processed distribution after x_<t

where u is a hash of the row's seed and t, uniform on [0, 1). Each x_t is an exact draw from p_t given
the prefix (u(seed, t) is independent of everything before t), so the row is an exact sample of the
target. A verification then needs no ratio test: at each node of a draft tree the target's token is
known once p is, and the walk accepts the child that equals it, as the greedy walk accepts the
argmax. So a row writes the same tokens for a seed in every mode (ar, parallel, sd, mcsd, seed), with
any draft policy, alone or batched beside any other rows: drafts change only how many target forwards
it takes (the idea of "drafter-invariant speculative decoding", Daliri, Musco and Suresh, 2024, there
with Gumbel noise over the vocabulary; here one inverse-CDF uniform a position, which costs nothing
more than the draw speculative sampling already makes).

"The same tokens" holds in exact arithmetic, as greedy's identity does: in float32 two modes score a
position in forwards of different shapes, whose logits round differently, and a draw whose uniform
lies within that rounding of a token's cumulative boundary can come out as the neighbouring token
(a greedy argmax flips the same way at a near tie, but a flat sampled p puts a boundary near u far
more often). From there the two rows go on as two different samples, each exact.

What it costs: a draft is accepted when it equals the keyed draw. A picked text draft (prompt lookup,
suffix) is accepted with probability p(x), as under the ratio test. A drafted token from the draft
model is drawn at the same uniform (`inverse_cdf(q_t, u(seed, t))`, "common random numbers"), so it
matches wherever q's and p's cumulative intervals overlap at u: close to, but below, the ratio
test's sum_x min(p, q) where q and p order their mass differently. What it buys: a policy may price a
sampled row by what shares its forwards (load=greedy plans such rows with the greedy ones), because
nothing it decides can change the row's tokens; and sampled runs of two modes write the same text, so
their wall times compare directly.
"""
from __future__ import annotations

_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers whose outputs pass as independent."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def keyed_uniform(seed: int, position: int) -> float:
    """u(seed, position) in [0, 1), 53 random bits (what a float64 holds)."""
    return (_mix(_mix(seed & _MASK) ^ position) >> 11) / float(1 << 53)


def row_seed(seq) -> int:
    """A row's key: the seed its generator was made with (the call's seed + the row's index)."""
    return seq.generator.initial_seed()


def slot_uniforms(seq, parents: list[int]) -> list[float]:
    """The keyed uniform of every slot of a draft tree of `parents` hung off the row's next token:
    slot 0 the token after the root (position len(generated)), slot i + 1 the token after node i,
    one position deeper than node i."""
    seed, base = row_seed(seq), len(seq.generated)
    depths: list[int] = []
    for parent in parents:
        depths.append(1 + (depths[parent] if parent >= 0 else 0))
    cache: dict[int, float] = {}
    out = []
    for depth in [0] + depths:
        if depth not in cache:
            cache[depth] = keyed_uniform(seed, base + depth)
        out.append(cache[depth])
    return out


def level_uniform(seq, depth: int) -> float:
    """The keyed uniform of the token `depth` levels below the row's next one (0: the next token): a
    draft model's coupled draw at that level."""
    return keyed_uniform(row_seed(seq), len(seq.generated) + depth)
