"""`Engine`: one generation API over every decoding mode."""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Sequence as Seq

import torch

from .compiled_forward import CompileSettings
from .masks import UnsupportedAttention
from .model_runtime import ModelRuntime, check_attention_path
from .models import (DEFAULT_DRAFT_LAYERS, PROMPT_LOOKUP, SELF_DRAFT, check_same_vocabulary, default_target, load_model,
                     load_tokenizer, resolve_device, truncated_draft)
from .decode_spec import ALL_BATCH, AUTO_BATCH, DecodeSpec, call_spec
from .call_inputs import encode_prompts, sampling_params, torch_dtype
from .cpu_linear import ONEDNN, resolve_cpu_linear, use_onednn_linears
from .params import GenerationResult, SamplingParams
from .sequence import Sequence, StopRule
from .cpu_threads import model_work
from .forward_thread import ForwardThread
from .shared_prefill import PrefixStore
from .target_features import TargetHidden
from .call_checks import check_attention, check_context, needs_draft, runs_draft_model
from .call_policy import EnginePolicies, policy_name
from .call_prefill import draft_prefill_tokens, prefill_call, report_lengths

log = logging.getLogger(__name__)


class Engine:
    """A target model, an optional draft model sharing its vocabulary, and a tokenizer. The engine runs
    each model through its own `ModelRuntime` (`target_runtime`, `draft_runtime`: model_runtime.py)."""

    def __init__(self, target_model, draft_model=None, tokenizer=None, vocab_size: int | None = None,
                 target_name: str = "target", draft_name: str = "draft", forward_thread: ForwardThread | None = None,
                 prefix_cache_entries: int = 32, prefix_cache_bytes: int = 1 << 30, attention: str = "gather",
                 compile: "CompileSettings | bool | None" = None):
        self.target = target_model.eval()
        self.draft = draft_model.eval() if draft_model is not None else None
        # what this engine keeps about each model (its KV pool, layout, padding, hooks), beside the model;
        # attention: how batched forwards read the pool ("gather" or "pool": model_runtime.py);
        # `compile`: whether their fixed-shape forwards are compiled (compiled_forward.py; default on CUDA)
        compile = CompileSettings.of(compile)
        self.target_runtime = ModelRuntime(self.target, attention, compile=compile)
        self.draft_runtime = ModelRuntime(self.draft, attention, compile=compile) if self.draft is not None else None
        self.tokenizer = tokenizer
        self.target_name, self.draft_name = target_name, draft_name
        self.default_policy: str | None = None  # a drafting call's policy when it names none (None: the draft's)
        model_vocab = target_model.get_output_embeddings().weight.shape[0]
        # sample only over real tokens: the embedding matrix may be padded past the tokenizer
        self.vocab_size = min(vocab_size or (len(tokenizer) if tokenizer is not None else model_vocab), model_vocab)
        if self.draft is not None:
            draft_vocab = draft_model.get_output_embeddings().weight.shape[0]
            if draft_vocab < self.vocab_size:
                raise ValueError(f"draft {draft_name} has {draft_vocab} output tokens but target "
                                 f"{target_name} samples over {self.vocab_size}: they must share a vocabulary")
        # a drafter that reads the target's hidden states gets them from every target forward (target_features.py)
        reads_features = getattr(self.draft, "uses_target_features", False)
        self.target_hidden = self.target_runtime.capture(TargetHidden) if reads_features else None
        eos = getattr(target_model.generation_config, "eos_token_id", None)
        eos = tokenizer.eos_token_id if eos is None and tokenizer is not None else eos
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        # prompt stretches scored by earlier calls, per model (shared_prefill.py); 0 entries: off.
        # 1 GiB per model by default: about 23k tokens of SmolLM2-135M or 2k of a 7B fp16 model
        self.prefix_cache_entries = prefix_cache_entries
        self.prefix_stores = {role: PrefixStore(prefix_cache_entries, prefix_cache_bytes) for role in ("target", "draft")}
        self._scheduler = None  # the step loop of every call (seed.py), built at the first
        self._scheduler_lock = threading.Lock()
        self._policies = EnginePolicies()  # named policies built for this engine (call_policy.py)
        # on a CPU every forward runs on one thread (forward_thread.py says why); on a GPU each role has its own
        device = getattr(target_model, "device", torch.device("cpu"))
        self.forward_thread = (forward_thread or ForwardThread()) if torch.device(device).type == "cpu" else None
        if self.forward_thread is not None:  # the models are known now: a decode step's work bounds the threads
            self.forward_thread.threads.work = model_work(self.target)
            self.forward_thread.threads.recheck()

    def set_compile(self, settings: "CompileSettings | bool | None") -> None:
        """Whether both models' fixed-shape forwards are compiled from their next forward on
        (compiled_forward.py; True / False / None: on CUDA only); a runtime whose setting changes
        starts a new fixed-shape runner."""
        settings = CompileSettings.of(settings)
        for runtime in (self.target_runtime, self.draft_runtime):
            if runtime is not None:
                runtime.compile = settings

    @classmethod
    def from_pretrained(cls, target: str | None = None, draft: str | None = None, device: str = "auto",
                        dtype: torch.dtype | str | None = None, draft_layers: int = DEFAULT_DRAFT_LAYERS,
                        load_draft: bool = True, cpu_linear: str | None = None, attention: str = "gather",
                        compile: "CompileSettings | bool | None" = None) -> "Engine":
        """Each of target/draft: a Hub id, a local directory or a `.gguf` path. No target: the
        embedded SmolLM2-135M-Instruct. No draft: the drafter shipped in the package for this target
        (the embedded default has a ParallelSpec one) or else the target's first `draft_layers` layers;
        draft="self" asks for those layers by name; draft="lookup" loads no draft model and drafts by
        prompt lookup (the `lookup` policy, policies/prompt_lookup.py). A draft directory from `seed-tot train-drafter` is
        a drafter trained for this target (else an error).
        load_draft=False: no draft at all (enough for ar and parallel, saves its load time and memory).
        cpu_linear: on a CPU, "onednn" runs the models' linear layers through oneDNN (cpu_linear.py
        says why), "stock" through torch's own `F.linear`; None: $SEED_TOT_CPU_LINEAR, else onednn.
        attention, compile: as Engine's (how batched forwards read the pool; whether their fixed-shape
        forwards are compiled).
        On a CPU the models load on the engine's forward thread (forward_thread.py says why)."""
        settings = (check_attention_path(attention), CompileSettings.of(compile))  # before anything loads
        dtype = torch_dtype(dtype)  # before anything loads: a typo was an AttributeError after the tokenizer
        dev = resolve_device(device)
        linear = resolve_cpu_linear(cpu_linear)  # before anything loads, as the dtype
        if dev.type != "cpu":
            return cls._load(target, draft, dev, dtype, draft_layers, load_draft, None, settings)
        thread = ForwardThread()
        engine = thread.call(cls._load, target, draft, dev, dtype, draft_layers, load_draft, thread, settings)
        if linear == ONEDNN:  # before any forward: every mode and the calibration run the same kernels
            use_onednn_linears(engine.target, engine.draft)
        return engine

    @classmethod
    def _load(cls, target, draft, dev, dtype, draft_layers, load_draft, forward_thread,
              settings: tuple = ("gather", None)) -> "Engine":
        attention, compile = settings
        target = target or default_target()
        tokenizer = load_tokenizer(target)
        from .drafters import is_drafter_dir, load_drafter, shipped_drafter_for
        self_draft = draft == SELF_DRAFT
        if draft == PROMPT_LOOKUP:  # no draft model: its calls default to the `lookup` policy
            engine = cls._load(target, None, dev, dtype, draft_layers, False, forward_thread, settings)
            engine.draft_name, engine.default_policy = "prompt lookup", "lookup"
            return engine
        drafter_dir = load_draft and draft is not None and not self_draft and is_drafter_dir(draft)  # shares the target's vocabulary
        if load_draft and draft is not None and not self_draft and not drafter_dir:  # tokenizers first: a mismatch fails before any weights load
            check_same_vocabulary(tokenizer, load_tokenizer(draft), target, draft)
        target_model = load_model(target, dev, dtype)
        if not load_draft:
            if draft is not None:
                log.info("not loading draft %s: the requested mode runs the target alone", draft)
            return cls(target_model, None, tokenizer, target_name=target, draft_name="none",
                       forward_thread=forward_thread, attention=attention, compile=compile)
        shipped = shipped_drafter_for(target_model) if draft is None else None
        if shipped is not None:
            draft_model, draft_name = load_drafter(shipped, target_model, target), f"shipped:{shipped.name}"
        elif draft is None or self_draft:
            draft_model, draft_name = truncated_draft(target_model, draft_layers), f"{target}[:{draft_layers} layers]"
        elif drafter_dir:  # a trained drafter (seed-tot train-drafter): checked against this target
            draft_model, draft_name = load_drafter(draft, target_model, target), draft
        else:
            draft_model, draft_name = load_model(draft, dev, dtype), draft
        return cls(target_model, draft_model, tokenizer, target_name=target, draft_name=draft_name,
                   forward_thread=forward_thread, attention=attention, compile=compile)

    def pin_threads(self, threads: int | None) -> None:
        """Run this engine's CPU forwards on `threads` intra-op threads from now on (None: choose them
        again by the machine's load, cpu_threads.py). No effect on a GPU target."""
        if self.forward_thread is not None:
            if threads is not None and threads < 1:
                raise ValueError(f"threads must be at least 1, got {threads}")
            self.forward_thread.threads.pinned = threads
            self.forward_thread.threads.recheck()

    def threads_report(self) -> dict | None:
        """The CPU thread choice so far (cpu_threads.CpuThreads.report); None on a GPU."""
        return self.forward_thread.threads.report() if self.forward_thread is not None else None

    def on_forward_thread(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) where this engine runs its forwards: its forward thread on a CPU (build or
        train models that share its weights there; forward_thread.py says why), here on a GPU."""
        if self.forward_thread is None:
            return fn(*args, **kwargs)
        return self.forward_thread.call(fn, *args, **kwargs)

    @property
    def default_mode(self) -> str:
        """The mode of a call that names none: seed where this engine can draft (a draft model, or
        draft="lookup"), else parallel (every prompt in one batched forward per step). Sync and async
        calls agree, as `seed-tot generate` does; greedy output is the target's in every mode."""
        return "seed" if self.draft is not None or self.default_policy == "lookup" else "parallel"

    @property
    def scheduler(self):
        """The engine's one SeedScheduler: every call of every thread and event loop goes through its
        step loop, so concurrent calls (e.g. `solve --concurrency`) share its batched forwards."""
        with self._scheduler_lock:
            if self._scheduler is None:
                from .seed import SeedScheduler
                self._scheduler = SeedScheduler(self)
            return self._scheduler

    # ------------------------------------------------------------------ prompts
    def render_prompt(self, user: str, assistant_prefix: str = "", system: str | None = None) -> str:
        """Wrap a user message in the tokenizer's chat template when it has one."""
        tok = self.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            return user + assistant_prefix
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + assistant_prefix

    def encode(self, prompts: Seq[str] | Seq[Seq[int]]) -> list[list[int]]:
        return encode_prompts(prompts, self.tokenizer, self.target.get_input_embeddings().weight.shape[0])

    # ------------------------------------------------------------------ generation
    def generate(self, prompts, params: SamplingParams | None = None, mode: str | None = None,
                 k_config=(1, 1, 1), n_workers: int | None = None, verify_batch: int | str | None = AUTO_BATCH,
                 draft_policy=None, policy_options: dict | None = None,
                 draft_batch: int | str | None = AUTO_BATCH, *, spec: DecodeSpec | None = None) -> list[GenerationResult]:
        """Generate for every prompt; results come back in prompt order.
        The decoding settings come as one `spec=DecodeSpec(...)` (decode_spec.py) or as these keywords:
        mode: ar, parallel, sd, mcsd or seed (None: `default_mode`, seed where the engine can draft);
        seed mode: verify_batch drafts verified per target forward (FCFS); draft_batch ready draft
        workers drafted per draft forward (None or "all": all that are ready; 1: one row per draft forward, the paper's;
        "auto", the default: see `resolve_batches`).
        draft_policy: "fixed", "opt-tree", "specdec", "auto", "parallelspec", "lookup" (prompt lookup:
        needs no draft model), "suffix" (the run's own text: needs none either), "choose" (per row and
        round: the draft model, that text, both or none) or a DraftPolicy object (see
        seed_tot.engine.policies); None: the draft's own default (`choose` for a ParallelSpec drafter),
        else `policies.default_policy_name`; policy_options: that policy's settings.
        parallel mode: every row of every overlapping seed/parallel call on this engine shares target
        forwards (see `_scheduled`); n_workers, verify_batch and draft_batch do not apply to it."""
        spec = call_spec(spec, self.default_mode, mode=mode, k_config=k_config, n_workers=n_workers,
                         verify_batch=verify_batch, draft_policy=draft_policy, policy_options=policy_options,
                         draft_batch=draft_batch)
        params = sampling_params(params)
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop running here: the normal, synchronous caller
            pass
        else:  # waiting here would block that loop and every other call on it
            raise RuntimeError("generate() was called inside a running event loop: use `await engine.agenerate(...)`")
        if not self._scheduled(spec.mode):
            return self.on_forward_thread(self._generate_static_parallel, prompts, params, self._resolved(spec))
        seqs, future, start = self._submit(prompts, params, spec)
        self.scheduler.wait(future)
        return self._finish(seqs, start)

    def _generate_static_parallel(self, prompts, params: SamplingParams, spec: DecodeSpec, stop=None,
                                  on_tokens=None) -> list[GenerationResult]:
        """parallel as one static left-padded batch, for a target no batched mask serves (see `_scheduled`)."""
        from .parallel import generate_parallel
        start = time.perf_counter()  # wall time includes prefill, like the busy time does
        seqs, _ = self._start(prompts, params, spec.mode, spec.k_config, spec.verify_batch, prefill=False,
                              on_tokens=on_tokens)
        generate_parallel(self.target, seqs, params, self.vocab_size, stop)
        return self._finish(seqs, start)

    async def agenerate(self, prompts, params: SamplingParams | None = None, mode: str | None = None,
                        k_config=(1, 1, 1), n_workers: int | None = None,
                        verify_batch: int | str | None = AUTO_BATCH, draft_policy=None,
                        policy_options: dict | None = None,
                        draft_batch: int | str | None = AUTO_BATCH, *,
                        spec: DecodeSpec | None = None, on_tokens=None) -> list[GenerationResult]:
        """The coroutine form, for callers that already run an event loop (settings as in `generate`).
        Modes that do not go through the scheduler (see `_scheduled`) run in a thread.
        on_tokens(index, tokens, finish_reason): called on the engine's step thread as each prompt's
        tokens are committed (after the stop rule; finish_reason None until the last), for streaming."""
        spec = call_spec(spec, self.default_mode, mode=mode, k_config=k_config, n_workers=n_workers,
                         verify_batch=verify_batch, draft_policy=draft_policy, policy_options=policy_options,
                         draft_batch=draft_batch)
        return await self._agenerate(prompts, sampling_params(params), spec, on_tokens)

    async def _agenerate(self, prompts, params: SamplingParams, spec: DecodeSpec,
                         on_tokens=None) -> list[GenerationResult]:
        if not self._scheduled(spec.mode):
            stop = threading.Event()  # a thread cannot be cancelled: the batch reads this at each step
            try:
                return await asyncio.to_thread(self.on_forward_thread, self._generate_static_parallel, prompts,
                                               params, self._resolved(spec), stop, on_tokens)
            except asyncio.CancelledError:
                stop.set()  # the batch ends at its next step instead of decoding its whole budget
                raise
        seqs, future, start = self._submit(prompts, params, spec, on_tokens)
        try:
            await asyncio.wrap_future(future)  # cancelling the awaiting task cancels the call
        except asyncio.CancelledError:
            # the error's traceback keeps this frame, often inside a reference cycle that only the garbage
            # collector breaks: without this the cancelled rows, and so their KV slots, would live on with it
            del seqs
            raise
        return self._finish(seqs, start)

    def _submit(self, prompts, params: SamplingParams, spec: DecodeSpec, on_tokens=None):
        """Check and hand one call to the scheduler: (its sequences, its future, its start time).
        Everything that can be refused is refused here, before any forward; the prefill runs on the
        step thread when the call is admitted."""
        start = time.perf_counter()  # wall time includes prefill, like the busy time does
        spec = self._resolved(spec)
        policy = self._call_policy(spec, params)  # ar, parallel: None
        seqs, _ = self._start(prompts, params, spec.mode, spec.k_config, spec.verify_batch, spec.draft_batch,
                              prefill=False, policy=policy, on_tokens=on_tokens)
        with_draft = runs_draft_model(spec.mode, policy)
        # rows that share a forward: sd and mcsd run one row at a time, so each saves what a row alone does
        load = min([len(seqs)] + [n for n in (spec.n_workers, spec.verify_limit) if n is not None])
        pricing = policy if with_draft and policy.prices_prefill else None
        if pricing is not None and not pricing.drafts_call(draft_prefill_tokens(self, seqs), len(seqs), params, load):
            # the draft's prefill would cost more than it saves: plain target steps, or the policy's
            # rounds that need no draft model (DraftPolicy.declined)
            policy = pricing.declined()
            with_draft = False
        future = self.scheduler.submit(seqs, policy, spec, prepare=lambda: self._prefill_shared(seqs, with_draft))
        if pricing is not None:  # what this call outputs prices the next one of its kind
            future.add_done_callback(lambda done: report_lengths(done, pricing, params, seqs, with_draft))
        return seqs, future, start

    def resolve_batches(self, mode: str, verify_batch: int | str | None,
                        draft_batch: int | str | None) -> tuple[int | None, int | None]:
        """SEED's batch sizes with "auto" (the default) decided: every queued draft in one target
        forward and every ready worker in one draft forward (None), on a model that takes batched 4D
        masks exactly; otherwise 1, the paper's execution (ALiBi models: Bloom, MPT).

        Why batched by default: a forward over m rows costs far less than m one-row forwards, on a
        CPU and more so on a GPU, where a target forward stays memory-bound up to hundreds of tokens,
        and the tokens are identical either way (bench `tot-step` measures both executions;
        docs/benchmarks.md, "Figures behind the code's design choices"). Explicit
        numbers are kept as given; a batched number on an ALiBi model is refused (`call_checks.check_attention`).
        Returns the scheduler's counts: None is every one ("all")."""
        spec = self._resolved(DecodeSpec(mode=mode, verify_batch=verify_batch, draft_batch=draft_batch))
        return spec.verify_limit, spec.draft_limit

    def _resolved(self, spec: DecodeSpec) -> DecodeSpec:
        """The call's spec as the scheduler runs it: "auto" batch sizes decided for these models (see
        `resolve_batches`; the one place they are), 1 outside seed mode, and parallel's fixed batching."""
        if spec.mode == "parallel":  # every row, every step, in the shared target forward; nothing to draft
            return spec.replace(n_workers=None, verify_batch=ALL_BATCH, draft_batch=1)
        if spec.mode != "seed":  # ar, sd, mcsd: one sequence of the call after another, alone in its forwards
            return spec.replace(n_workers=1, verify_batch=1, draft_batch=1)

        def decide(value: int | str, runtime: ModelRuntime) -> int | str:
            if value != AUTO_BATCH:
                return value
            try:
                runtime.layout.check_tree_masks("batched seed")
            except UnsupportedAttention:
                return 1
            return ALL_BATCH

        return spec.replace(verify_batch=decide(spec.verify_batch, self.target_runtime),
                            draft_batch=decide(spec.draft_batch, self.draft_runtime or self.target_runtime))

    def generate_pipelined(self, prompts, params: SamplingParams | None = None, mode: str = "pipedec",
                           stages: int = 2, **options):
        """PipeDec (mode "pipedec") or its baselines ("pp", "stpp") over a target split in `stages`
        pipeline stages, each its own torch.distributed process (see seed_tot.engine.pipeline.api)."""
        from .pipeline.api import generate_pipelined
        if self.target_hidden is not None and mode != "pp":
            raise ValueError(f"mode {mode!r} cannot draft with a drafter that reads the target's hidden states "
                             f"(its stages do not pass them back); use --draft self (the target's first layers) or a drafter "
                             f"trained without --target-features")
        return generate_pipelined(self, prompts, params, mode, stages, **options)

    def _scheduled(self, mode: str) -> bool:
        """Whether calls of this mode run on the engine's step loop (seed.py): every mode does, parallel
        as plain target steps (a round that drafts nothing), so N concurrent parallel calls
        (`solve --concurrency N`) batch across calls exactly as N seed calls do: a row joins at its next
        step and leaves when it stops, and seed and parallel pay the same per-forward costs, so their
        difference is speculation alone. Only a parallel call on a target that cannot take batched 4D
        masks (ALiBi: Bloom, MPT) keeps the static left-padded batch of parallel.py, one per call,
        which its 2D padding mask serves exactly."""
        if mode != "parallel":
            return True
        try:
            self.target_runtime.layout.check_tree_masks("parallel across calls")
        except UnsupportedAttention:
            return False
        return True

    def _call_policy(self, spec: DecodeSpec, params: SamplingParams):
        """A call's DraftPolicy (None: ar, parallel), before any forward."""
        return self.policy(spec.mode, spec.k_config, params, spec.draft_policy, spec.options)

    def _start(self, prompts, params: SamplingParams, mode: str, k_config, verify_batch: int | str | None = 1,
               draft_batch: int | str | None = 1, prefill: bool = True, policy=None, on_tokens=None):
        """The call's sequences (prefilled unless prefill=False). `policy`: the call's DraftPolicy; one
        that never feeds the draft model (prompt lookup) gets no draft caches and no draft checks."""
        k_config = tuple(k_config)
        with_draft = runs_draft_model(mode, policy)
        if with_draft and self.draft is None:
            raise needs_draft(mode)
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        encoded = self.encode(prompts)
        single = len(encoded) == 1
        check_attention(self, mode, k_config, 1 if single else verify_batch, 1 if single else draft_batch, with_draft)
        check_context(self, encoded, params, with_draft)
        rule = StopRule(params, self.eos_ids, self.tokenizer)
        seqs = [Sequence(i, ids, rule, torch.Generator().manual_seed(params.seed + i), on_tokens=on_tokens)
                for i, ids in enumerate(encoded)]
        if prefill:  # the static parallel batch scores its prompts inside its first decode forward
            self._prefill_shared(seqs, with_draft=with_draft)
        return seqs, k_config

    def clear_prefix_cache(self, keep: bool = True) -> None:
        """Forget the prompt stretches kept from earlier calls (a benchmark run starts cold with it);
        keep=False also stops keeping new ones until the next clear_prefix_cache() (bench's @pc0)."""
        for store in self.prefix_stores.values():
            store.clear()
            store.max_entries = self.prefix_cache_entries if keep else 0
        self._policies.clear_text()  # and the text drafts read (a run starts as a fresh engine)

    def _prefill_shared(self, seqs: list[Sequence], with_draft: bool) -> list[dict]:
        """The call's prompts scored by each model it runs, timed for its timeline (call_prefill.py)."""
        return prefill_call(self, seqs, with_draft)

    def policy_name(self, draft_policy: str | None = None, mode: str = "seed", k_config: tuple[int, ...] = (1,)) -> str:
        """The policy a drafting call runs (call_policy.policy_name)."""
        return policy_name(self, draft_policy, mode, k_config)

    def policy(self, mode: str, k_config: tuple[int, ...], params: SamplingParams, draft_policy=None,
               policy_options: dict | None = None):
        """The DraftPolicy of a call: an object as given, a name built once per engine and options
        (it keeps its calibration, head and records across calls), None for ar and parallel."""
        return self._policies.get(self, mode, k_config, params, draft_policy, policy_options)

    @staticmethod
    def _finish(seqs: list[Sequence], start: float) -> list[GenerationResult]:
        wall = time.perf_counter() - start
        for seq in seqs:
            seq.stats.wall_s = wall
            seq.stats.kv_copy_s = sum(kv.copy_s for kv in (seq.target, seq.draft) if kv is not None)
        return [seq.result() for seq in seqs]

