"""Options shared by the `seed-tot` commands that load models."""
from __future__ import annotations

import importlib
import os
from pathlib import Path

import click

from seed_tot.engine.decode_spec import DRAFTING_MODES, MODES, DecodeSpec, DecodeSpecError

MODE_CHOICE = click.Choice(MODES)


def decode_setting(setting: str):
    """A click callback: the option's value in DecodeSpec's canonical form (None: not given), or a
    usage error naming the flag. The spec built from these values checks nothing twice."""
    def parse(ctx, param, value):
        if value is None:
            return None
        try:
            return DecodeSpec.canonical(setting, value)
        except DecodeSpecError as err:
            raise click.BadParameter(str(err)) from None
    return parse


parse_k_config = decode_setting("k_config")


def check_data_file(ctx, param, value):
    """A click callback: --data names a file, or a usage error that says what it names instead (a
    directory is not "no such file"). solve, score and bench share it, so they word it alike."""
    if value is None:
        return None
    path = Path(value)
    if path.is_dir():
        raise click.BadParameter(f"{value} is a directory; pass the data file itself (e.g. a .jsonl file in it)")
    if not path.exists():
        raise click.BadParameter(f"{value}: no such file")
    return value


DTYPES = ("float32", "bfloat16", "float16")


def check_device(ctx, param, value):
    """A click callback: --device as torch will take it, or a usage error. Left to the engine, a
    typo or a GPU this machine lacks is a torch traceback after the tokenizer has loaded."""
    if value is None or value == "auto":
        return value
    import torch  # only when the command runs: --help stays torch-free

    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise click.BadParameter(f"{value!r} is not a device; expected cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise click.BadParameter(f"{value!r}: this machine has no CUDA GPU that torch can use; pass cpu or auto")
        if device.index is not None and device.index >= count:
            raise click.BadParameter(f"{value!r}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    return value


def check_dtype(ctx, param, value):
    """A click callback: --dtype one of DTYPES, or a usage error (the engine looks the name up on
    torch, so a typo was an AttributeError traceback after the tokenizer had loaded)."""
    if value is not None and value not in DTYPES:
        raise click.BadParameter(f"{value!r} is not one of {', '.join(DTYPES)}")
    return value


def pin_threads(ctx, param, value):
    """A click callback: --threads N (or $SEED_TOT_THREADS) pins the engine's CPU intra-op threads.
    It travels in the environment, which the engine reads when it starts and child processes
    (pipeline stages, a local Ray cluster's actors) inherit; not given: chosen by load (cpu_threads.py)."""
    from seed_tot.engine.cpu_threads import PIN_ENV

    if value is not None:
        os.environ[PIN_ENV] = str(value)
    return value


def model_options(fn):
    """--target/--draft/... shared by every command that loads models."""
    for option in reversed([
        click.option("--target", default=None, help="Hub id, local dir or .gguf file (default: embedded SmolLM2-135M-Instruct)."),
        click.option("--draft", default=None, help="Hub id, local dir or .gguf file, or a drafter dir from `seed-tot train-drafter` "
                                                   "(default: the drafter shipped for the target, else the target's first --draft-layers "
                                                   "layers; 'self' names those layers; 'lookup': no draft model, drafts by "
                                                   "prompt lookup)."),
        click.option("--draft-layers", default=4, show_default=True, help="Depth of the layer-truncated self-draft."),
        click.option("--device", default="auto", show_default=True, callback=check_device, help="cpu, cuda, cuda:N or auto (a GPU when there is one)."),
        click.option("--dtype", default=None, callback=check_dtype, help="float32, bfloat16, float16 (default: bf16 on GPU, fp32 on CPU). Greedy output is "
                     "token-identical across modes in float32; in half precision a forward's rounding "
                     "depends on its batch shape (README, 'Numerics')."),
        click.option("--threads", type=click.IntRange(min=1), default=None, envvar="SEED_TOT_THREADS", expose_value=False,
                     callback=pin_threads, help="CPU: intra-op threads of every forward [default: chosen from the free cores "
                     "and the model's size, and chosen again as the load changes; docs/engine.md, 'CPU threads']."),
    ]):
        fn = option(fn)
    return fn


def one_of_later(module: str, attribute: str):
    """A click callback that checks a value against `module.attribute`'s names when the command
    runs: where that module imports torch, a click.Choice would load it for --help too."""
    def check(ctx, param, value):
        choices = getattr(importlib.import_module(module), attribute)
        if value is not None and value not in choices:
            raise click.BadParameter(f"{value!r} is not one of {', '.join(choices)}")
        return value
    return check


def policy_options(fn):
    """--draft-policy/--policy-option/--head: how sd, mcsd and seed plan their drafts."""
    for option in reversed([
        click.option("--draft-policy", metavar="POLICY", callback=one_of_later("seed_tot.engine.decode_spec", "POLICIES"), default=None,
                     help="fixed (k_config shapes; the default of sd, mcsd, and seed with a tree k_config or on a GPU), opt-tree, "
                          "specdec, auto (the default of seed on a CPU with a chain k_config where the models cannot score trees), "
                          "parallelspec (a ParallelSpec drafter's rounds, every round), lookup (prompt lookup, no draft "
                          "model; the default with --draft lookup), suffix (the run's own text, no draft model) or choose "
                          "(per row and round: the draft model, the suffix draft, both or none, by expected gain; "
                          "the default of seed on a CPU with a chain k_config, and with a ParallelSpec drafter)."),
        click.option("--policy-option", "policy_option", multiple=True, metavar="KEY=VALUE",
                     help="A draft-policy setting, repeatable, e.g. n=8, delta=0.2, h=0.5, cut=cost, passes=2, ngram=3."),
        click.option("--head", "head_dir", type=click.Path(file_okay=False), default=None,
                     help="specdec (required) and auto (optional): the acceptance head directory from "
                          "`seed-tot train-head`."),
    ]):
        fn = option(fn)
    return fn


def pipeline_options(fn):
    """The `generate` options that only the pipeline modes read."""
    for option in reversed([
        click.option("--stages", type=click.IntRange(min=1), default=2, show_default=True,
                     help="pipedec/pp/stpp: target pipeline stages (one process each, plus one for the draft)."),
        click.option("--width", type=click.IntRange(min=1), default=4, show_default=True,
                     help="pipedec: prediction-tree nodes per layer."),
        click.option("--children", type=click.IntRange(min=1), default=2, show_default=True,
                     help="pipedec: children per node considered for the next layer."),
        click.option("--port", type=int, default=None, help="pipedec/pp/stpp: rendezvous port (default: a free one)."),
        click.option("--pipeline-timeout", type=float, default=600.0, show_default=True,
                     help="pipedec/pp/stpp: seconds before a stuck pipeline is stopped."),
        click.option("--join", is_flag=True, help="pipedec/pp/stpp: be one rank of a torchrun group instead of launching."),
        click.option("--simulate", is_flag=True, help="pipedec/pp/stpp: run every stage in this process (lockstep)."),
    ]):
        fn = option(fn)
    return fn


def policy_kwargs(draft_policy, policy_option, head_dir) -> dict:
    """Engine.generate keywords from the policy flags ({} when none is given)."""
    from seed_tot.engine.policies import parse_policy_options

    try:
        options = parse_policy_options(policy_option)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--policy-option") from None
    if head_dir is not None:
        options["head"] = head_dir
    if not draft_policy:
        # options without a policy name set the engine's default policy (e.g. the shipped
        # drafter's choose, which passes lookup=0 to its drafter's rounds), as README documents
        return {"policy_options": options} if options else {}
    return {"draft_policy": draft_policy, "policy_options": options}


HEAD_POLICIES = ("specdec", "auto")  # the draft policies that read an acceptance head (--head)


def check_policy_setting(decode: DecodeSpec, param_hint: str, label: str = "") -> None:
    """A usage error, before any model loads, for a draft-policy option the named policy does not take
    or cannot read (`label`: which bench mode). Left to the engine it surfaces only once the models
    have loaded, and in a bench only after every earlier mode has run. Options given without a policy
    name go to the engine's default policy, which depends on the draft model, so the engine checks those."""
    if decode.mode not in DRAFTING_MODES:
        return
    head = decode.options.get("head")
    head_hint = param_hint if label else "--head"
    if decode.draft_policy is None and head is not None:
        # the default policy depends on the mode and the draft model, and only auto of them reads a
        # head; left to the engine this is "draft policy 'parallelspec' has no option head" once loaded
        raise click.BadParameter(f"a head ({head}) is read by the draft policies {', '.join(HEAD_POLICIES)}; "
                                 f"name one with --draft-policy", param_hint=head_hint)
    if not isinstance(decode.draft_policy, str):
        return
    from seed_tot.engine.policies import check_policy_options

    try:
        check_policy_options(decode.draft_policy, decode.options)
    except ValueError as err:
        raise click.BadParameter(f"{label!r}: {err}" if label else str(err), param_hint=param_hint) from None
    if decode.draft_policy in HEAD_POLICIES and head is not None:
        from seed_tot.engine.policies.head import CONFIG

        if not (Path(head) / CONFIG).is_file():  # the engine's message, before the models load
            raise click.BadParameter(f"{Path(head) / CONFIG}: no head here (train one with `seed-tot train-head`)",
                                     param_hint=head_hint)


# The options that only some decoding modes read, and those modes; any other mode would ignore them.
# --draft is not here: a run keeps its models while --mode changes, and modes that draft nothing
# skip loading it (the stats then say draft=none).
MODE_OPTIONS: dict[str, tuple[str, ...]] = {
    "k_config": DRAFTING_MODES, "draft_policy": DRAFTING_MODES, "policy_option": DRAFTING_MODES,
    "head_dir": DRAFTING_MODES, "n_workers": ("seed",), "verify_batch": ("seed",), "draft_batch": ("seed",)}


def given_options(ctx: click.Context) -> set[str]:
    """Names of the parameters given on the command line (or through the environment), not defaulted."""
    from click.core import ParameterSource

    return {name for name in ctx.params
            if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}


def check_mode_options(ctx: click.Context, modes, uses: dict[str, tuple[str, ...]] = MODE_OPTIONS,
                       what: str = "mode") -> None:
    """A flag that none of `modes` reads is a usage error naming the flag and the modes that read it
    (`what` names the kind of choice: a decoding mode, or bench's workload)."""
    given = given_options(ctx)
    unused = [(name, users) for name, users in uses.items() if name in given and not set(modes) & set(users)]
    if unused:
        flags = {p.name: max(p.opts, key=len) for p in ctx.command.params}
        named = ", ".join(f"{flags[name]} (read by {', '.join(users)})" for name, users in unused)
        chosen = list(dict.fromkeys(modes))
        verb = "does" if len(chosen) == 1 else "do"
        raise click.UsageError(f"{what}{'s' * (len(chosen) > 1)} {', '.join(chosen)} {verb} not use {named}")


def load_engine(target, draft, draft_layers, device, dtype, modes=DRAFTING_MODES, attention: str = "gather",
                compile_forwards: str = "auto"):
    """The engine for `modes`; the draft is loaded only when one of them drafts. attention and
    compile_forwards: --attention's and --compile's words (engine/engine_settings.py)."""
    from seed_tot import Engine
    from seed_tot.engine.engine_settings import compile_setting
    return Engine.from_pretrained(target=target, draft=draft, device=device, dtype=dtype, draft_layers=draft_layers,
                                  load_draft=any(m in DRAFTING_MODES for m in modes), attention=attention,
                                  compile=compile_setting(compile_forwards))


DEFAULT_PROMPT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                  "How many clips did Natalia sell altogether in April and May?")
