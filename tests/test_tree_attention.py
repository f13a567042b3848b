"""Tree attention with stock transformers models: a 4D mask and per-node position ids give every
tree node exactly the logits its root-to-node path gets as a plain sequence."""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from seed_tot.engine.kv_cache import KVCache, forward_batch
from seed_tot.engine.model_runtime import ModelRuntime

PREFIX = [3, 17, 4, 9, 22]
# a tree of 9 nodes: parent index per node (-1 = child of the prefix's last token)
PARENTS = [-1, -1, 0, 0, 1, 2, 2, 4, 7]
TOKENS = [11, 12, 13, 14, 15, 16, 17, 18, 19]


def path_to(node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(TOKENS[node])
        node = PARENTS[node]
    return path[::-1]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tree_node_logits_equal_plain_sequence_logits(arch):
    model = tiny_model(arch, seed=2)
    runtime = ModelRuntime(model)
    kv = KVCache()
    kv.forward(runtime, PREFIX[:-1], [i - 1 for i in range(len(PREFIX) - 1)])
    kv.commit(list(range(len(PREFIX) - 1)))
    # entry 0 is the prefix's last token, tree nodes follow (their parents shifted by one)
    logits = kv.forward(runtime, PREFIX[-1:] + TOKENS, [-1] + [p + 1 for p in PARENTS])
    with torch.no_grad():
        for node in range(len(TOKENS)):
            plain = model(torch.tensor([PREFIX + path_to(node)])).logits[0, -1]
            torch.testing.assert_close(logits[node + 1], plain, atol=1e-4, rtol=1e-4)


def test_commit_keeps_exactly_the_accepted_path():
    model = tiny_model("llama", seed=2)
    runtime = ModelRuntime(model)
    kv = KVCache()
    kv.forward(runtime, PREFIX, [i - 1 for i in range(len(PREFIX))])
    kv.commit(list(range(len(PREFIX))))
    kv.forward(runtime, TOKENS, PARENTS)
    path = [1, 4, 7]  # tokens 12, 15, 18: a root-to-leaf chain
    kv.commit(path)
    assert kv.length == len(PREFIX) + 3
    # the next token's logits from the committed cache equal those of the plain sequence
    nxt = kv.forward(runtime, [5], [-1])[0]
    with torch.no_grad():
        plain = model(torch.tensor([PREFIX + [12, 15, 18, 5]])).logits[0, -1]
    torch.testing.assert_close(nxt, plain, atol=1e-4, rtol=1e-4)


def test_commit_rejects_a_non_chain():
    model = tiny_model("llama", seed=2)
    runtime = ModelRuntime(model)
    kv = KVCache()
    kv.forward(runtime, TOKENS, PARENTS)
    with pytest.raises(ValueError, match="chain"):
        kv.commit([0, 4])  # node 4's parent is 1, not 0


def test_batched_tree_forward_equals_one_sequence_at_a_time():
    model = tiny_model("qwen2", seed=6)
    runtime = ModelRuntime(model)
    prompts = [[1, 2, 3, 4, 5, 6], [7], [8, 9]]  # different prefix lengths, one empty prefix
    trees = [(TOKENS, PARENTS), ([30, 31, 32], [-1, 0, 1]), ([40], [-1])]
    singles, batched = [], []
    for prompt in prompts:
        for out in (singles, batched):
            kv = KVCache()
            if len(prompt) > 1:
                kv.forward(runtime, prompt[:-1], [i - 1 for i in range(len(prompt) - 1)])
            kv.commit(list(range(len(kv.parents))))
            out.append(kv)
    single_logits = [kv.forward(runtime, [p[-1]] + t, [-1] + [x + 1 for x in par])
                     for kv, p, (t, par) in zip(singles, prompts, trees)]
    batch_logits = forward_batch(runtime, batched, [[p[-1]] + t for p, (t, _) in zip(prompts, trees)],
                                 [[-1] + [x + 1 for x in par] for _, par in trees])
    for a, b in zip(single_logits, batch_logits):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for kv_single, kv_batched in zip(singles, batched):  # each cache gets back its own unpadded slice
        assert kv_single.length == kv_batched.length
        torch.testing.assert_close(kv_single.cache.layers[0].keys, kv_batched.cache.layers[0].keys, atol=1e-4, rtol=1e-4)
