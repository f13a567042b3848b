"""Linear layers through oneDNN on a CPU (cpu_linear.py): the same function as `F.linear` to rounding,
run by every mode losslessly (greedy equal to the swapped target's own generate, samples in its law),
with the parameters untouched, autograd's calls left to `F.linear`, and `from_pretrained` choosing it."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from conftest import noisy_copy, reference_greedy, tiny_model
from seed_tot import Engine, SamplingParams
from seed_tot.engine.cost_model import cache_key
from seed_tot.engine.cpu_linear import OneDnnLinear, linear_kernel, onednn_available, use_onednn_linears
from test_sampling_lossless import SAMPLES, SETTINGS, exact_distribution, sample_through_engine, tv, tv_bound

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN")

MAX_NEW = 20
PROMPTS = [[5], [1, 2, 3, 4, 5, 6, 7], [9, 8, 7], [1, 2, 3, 4, 5, 6, 7]]


def onednn_ops(fn) -> int:
    """How many oneDNN inner products `fn()` ran."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if "_linear_pointwise" in e.key)


def swapped(model):
    assert use_onednn_linears(model) > 0
    return model


@pytest.mark.parametrize("rows", [1, 2, 3, 9, 27])
@pytest.mark.parametrize("batched,bias", [(False, True), (True, False)])
def test_onednn_linear_computes_f_linear_through_onednn(rows, batched, bias):
    torch.manual_seed(rows)
    layer = nn.Linear(96, 160, bias=bias)
    x = torch.randn(*((2,) if batched else ()), rows, 96)
    expected = layer(x)
    use_onednn_linears(layer)
    with torch.inference_mode():
        assert onednn_ops(lambda: layer(x)) == 1
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_calls_autograd_records_run_f_linear_and_train_as_before():
    torch.manual_seed(0)
    stock = nn.Linear(32, 48)
    fast = swapped(nn.Sequential(nn.Linear(32, 48)))[0]
    fast.load_state_dict(stock.state_dict())
    x = torch.randn(5, 32)
    assert onednn_ops(lambda: fast(x).sum().backward()) == 0
    out_fast, out_stock = fast(x), stock(x)
    assert torch.equal(out_fast, out_stock) and out_fast.grad_fn is not None
    fast.zero_grad(), stock.zero_grad()
    out_fast.sum().backward(), out_stock.sum().backward()
    assert torch.equal(fast.weight.grad, stock.weight.grad)
    with torch.no_grad():  # the same layer out of autograd: oneDNN again
        assert onednn_ops(lambda: fast(x)) == 1


def test_inputs_oneDNN_does_not_take_fall_back_to_f_linear():
    layer = swapped(nn.Sequential(nn.Linear(8, 4)))[0]
    with torch.inference_mode():
        for x in (torch.randn(8), torch.randn(0, 8), torch.randn(3, 8, dtype=torch.float64)):
            if x.dtype == torch.float64:
                layer.double()
            assert onednn_ops(lambda: layer(x)) == 0
            assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


def test_swap_keeps_every_parameter_shared_and_the_state_dict_unchanged():
    model = tiny_model("llama", seed=1)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    before = {k: v.data_ptr() for k, v in model.state_dict().items()}
    keys = cache_key(Engine(model))
    plain = sum(type(m) is nn.Linear for m in model.modules())
    assert use_onednn_linears(model) == plain > 0
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == before
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert all(type(m) is not nn.Linear for m in model.modules())
    assert use_onednn_linears(model) == 0  # idempotent
    assert cache_key(Engine(model)) != keys  # the calibration cache keeps the kernels' costs apart


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request):
    target = swapped(tiny_model(request.param, seed=3))
    draft = swapped(noisy_copy(tiny_model(request.param, seed=3), 0.005))
    return target, draft, [reference_greedy(target, p, MAX_NEW) for p in PROMPTS]


@pytest.mark.parametrize("mode,k_config", [("ar", (1,)), ("parallel", (1,)), ("sd", (1, 1, 1)), ("mcsd", (2, 2, 1)),
                                           ("seed", (1, 1, 1)), ("seed", (2, 2, 1))])
def test_greedy_tokens_equal_the_onednn_targets_generate(pair, mode, k_config):
    target, draft, refs = pair
    results = Engine(target, draft).generate(PROMPTS, SamplingParams(max_new_tokens=MAX_NEW, temperature=0),
                                             mode=mode, k_config=k_config)
    assert [r.token_ids for r in results] == refs


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_sampled_seed_trees_follow_the_onednn_targets_distribution(setting):
    from test_sampling_lossless import VOCAB
    target = swapped(tiny_model("llama", seed=21, vocab=VOCAB))
    draft = swapped(noisy_copy(tiny_model("llama", seed=21, vocab=VOCAB), 0.6, seed=22))
    results, exact = sample_through_engine(target, draft, setting, "seed", (2, 2), batch=None)
    with torch.inference_mode():
        assert onednn_ops(lambda: target(torch.tensor([[1, 2]]))) > 0
    assert tv(Counter(tuple(r.token_ids) for r in results), exact, SAMPLES) < tv_bound(exact, SAMPLES)


def test_from_pretrained_runs_linears_through_onednn_on_a_cpu_unless_told_stock(tiny_model_dirs):
    target_dir, draft_dir = tiny_model_dirs
    engine = Engine.from_pretrained(target=target_dir, draft=draft_dir, device="cpu")
    for model in (engine.target, engine.draft):
        assert all(type(m) is not nn.Linear for m in model.modules())
        assert any(isinstance(m, OneDnnLinear) for m in model.modules())
    prompt = [1, 2, 3]
    ref = reference_greedy(engine.target, prompt, 12)
    out = engine.generate([prompt], SamplingParams(max_new_tokens=12, temperature=0), mode="seed")
    assert out[0].token_ids == ref
    stock = Engine.from_pretrained(target=target_dir, draft=draft_dir, device="cpu", load_draft=False,
                                   cpu_linear="stock")
    assert not any(isinstance(m, OneDnnLinear) for m in stock.target.modules())
    assert (linear_kernel(engine.target), linear_kernel(stock.target)) == ("onednn", "stock")  # what bench records
    with pytest.raises(ValueError, match="cpu_linear must be one of onednn, stock, not 'mkl'"):
        Engine.from_pretrained(target=target_dir, device="cpu", cpu_linear="mkl")


def test_the_environment_sets_the_kernel_where_the_call_names_none(tiny_model_dirs, monkeypatch):
    monkeypatch.setenv("SEED_TOT_CPU_LINEAR", "stock")
    engine = Engine.from_pretrained(target=tiny_model_dirs[0], device="cpu", load_draft=False)
    assert not any(isinstance(m, OneDnnLinear) for m in engine.target.modules())
    engine = Engine.from_pretrained(target=tiny_model_dirs[0], device="cpu", load_draft=False, cpu_linear="onednn")
    assert any(isinstance(m, OneDnnLinear) for m in engine.target.modules())
    monkeypatch.setenv("SEED_TOT_CPU_LINEAR", "mkl")
    with pytest.raises(ValueError, match=r"\$SEED_TOT_CPU_LINEAR must be one of onednn, stock"):
        Engine.from_pretrained(target=tiny_model_dirs[0], device="cpu", load_draft=False)


def test_a_pipeline_rank_loading_a_model_by_name_gets_the_engines_kernel(tiny_model_dirs, monkeypatch):
    """PipeDec ranks that load their stage by name run the kernel `from_pretrained` would; a model
    handed over as an object is used as given."""
    from seed_tot.engine.pipeline import ModelSource
    target_dir, draft_dir = tiny_model_dirs
    monkeypatch.delenv("SEED_TOT_CPU_LINEAR", raising=False)
    loaded = ModelSource(str(target_dir), str(draft_dir))
    assert all(linear_kernel(loaded.load(which)) == "onednn" for which in ("target", "draft"))
    assert linear_kernel(ModelSource(str(target_dir), cpu_linear="stock").load("target")) == "stock"
    monkeypatch.setenv("SEED_TOT_CPU_LINEAR", "stock")
    assert linear_kernel(ModelSource(str(target_dir)).load("target")) == "stock"
    given = tiny_model("llama", seed=3)
    assert ModelSource(given).load("target") is given and linear_kernel(given) == "stock"
    with pytest.raises(ValueError, match="cpu_linear must be one of onednn, stock, not 'mkl'"):
        ModelSource(str(target_dir), cpu_linear="mkl").load("target")
