"""Tiny random models built from configs in code (the Hub is unreachable from CI)."""
from __future__ import annotations

import copy
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

VOCAB = 96

# Tiny models gain nothing from intra-op threads, and on a small shared CPU OpenMP threads
# spin-wait on each other; one thread per forward also lets SEED's draft and target threads
# really run side by side on two cores.
torch.set_num_threads(1)


def tiny_model(arch: str = "llama", seed: int = 0, vocab: int = VOCAB, layers: int = 2, eos: int | None = None):
    """A float32 model whose logits are spread out enough (initializer_range) to give peaked,
    tie-free distributions, like a trained model's."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  initializer_range=0.15, eos_token_id=eos, bos_token_id=None, pad_token_id=None)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        raise ValueError(arch)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = 0
    return model.eval()


def noisy_copy(model, noise: float, seed: int = 1):
    """A draft that agrees with the target often: the target's weights plus Gaussian noise."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise)
    return draft.eval()


class CharTokenizer:
    """A character-level tokenizer with the slice of the transformers tokenizer API the engine uses."""

    chat_template = None

    def __init__(self, vocab: int = VOCAB, eos_token_id: int | None = None):
        self.chars = [chr(ord(" ") + i) for i in range(vocab)]
        self.index = {c: i for i, c in enumerate(self.chars)}
        self.eos_token_id = eos_token_id

    def __len__(self) -> int:
        return len(self.chars)

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [self.index[c] for c in text]}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(self.chars[i] for i in ids if not (skip_special_tokens and i == self.eos_token_id))

    def get_vocab(self) -> dict:
        return dict(self.index)


def reference_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """What the target alone produces: transformers' own greedy generate."""
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, len(prompt):].tolist()


def count_calls(monkeypatch, module, name: str) -> dict:
    """Wrap `module.name` so that each call adds one to the returned {"n": count}: how often a path ran."""
    calls = {"n": 0}
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def rows_stopping_differently(max_new_tokens: int = 30):
    """A target, prompts, tokenizer, params and greedy references under which rows end at different
    steps: sequence 0 at EOS after 2 tokens, sequence 1 at a stop string of its own output."""
    from seed_tot import SamplingParams

    target = tiny_model("llama", seed=30)
    prompts = [[7, 1], [2, 9, 9, 4], [5, 5], [3]]
    eos = reference_greedy(target, prompts[0], max_new_tokens)[1]
    target.generation_config.eos_token_id = eos
    tok = CharTokenizer(eos_token_id=eos)
    refs = [reference_greedy(target, p, max_new_tokens) for p in prompts]
    stop_text = tok.decode(refs[1][3:5])
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0, stop=(stop_text,))
    return target, prompts, tok, params, refs


@pytest.fixture(autouse=True)
def seed_drafts_fixed_chains(request, monkeypatch):
    """In-process tests run seed with the fixed policy where they name none. Its default, choose,
    decides from this machine's timing whether drafting pays (on tiny models on a CPU it mostly does
    not), so a test of drafting, verification or an attention path would test a plain target step,
    and one of counts would depend on the machine. Tests marked `seed_default_policy`
    (test_default_policy.py) run the default itself; commands run in a subprocess run it too."""
    if request.node.get_closest_marker("seed_default_policy") is None:
        from seed_tot.engine import policies
        monkeypatch.setattr(policies, "SEED_DEFAULTS", {})  # every device: fixed


@pytest.fixture(autouse=True, scope="session")
def private_calibration_cache(tmp_path_factory):
    """Costs calibrated during tests (parallelspec's cut=cost, auto) go to a private cache: never into
    the user's ~/.cache/seed-tot, where costs timed beside a test run would mislead later runs."""
    previous = os.environ.get("SEED_TOT_CACHE_DIR")
    os.environ["SEED_TOT_CACHE_DIR"] = str(tmp_path_factory.mktemp("seed-tot-cache"))
    yield
    if previous is None:
        os.environ.pop("SEED_TOT_CACHE_DIR", None)
    else:
        os.environ["SEED_TOT_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def llama_pair():
    target = tiny_model("llama", seed=0)
    return target, noisy_copy(target, 0.005)


def save_char_tokenizer(path) -> int:
    """A real transformers tokenizer (char-level WordLevel) saved to `path`; returns its size."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    vocab = {c: i for i, c in enumerate(chars)}
    vocab["<unk>"] = len(vocab)
    vocab["<eos>"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    fast.save_pretrained(path)
    return len(vocab)


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory):
    """A target and a close draft saved as local model directories with a real tokenizer, for the CLI."""
    root = tmp_path_factory.mktemp("models")
    vocab = save_char_tokenizer(root / "tok")
    target = tiny_model("llama", seed=41, vocab=vocab, eos=vocab - 1)
    draft = noisy_copy(target, 0.005)
    dirs = []
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        save_char_tokenizer(root / name)
        dirs.append(str(root / name))
    return dirs


@pytest.fixture(autouse=True)
def calibrations_count_as_quiet(monkeypatch):
    """Tests calibrate on a machine other work shares, so whether a calibration looks contended (and is
    then not cached) would depend on that work: here none does. test_contended_calibration restores
    the rule and injects the timings it judges."""
    from seed_tot.engine import cost_model
    monkeypatch.setattr(cost_model, "CONTENTION_MIN_FORWARD_S", float("inf"))
