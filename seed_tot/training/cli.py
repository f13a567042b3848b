"""`seed-tot train-head`: train SpecDec++'s acceptance head for a target/draft pair."""
from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path

import click

from seed_tot.cli_options import model_options

from .data_source import refuse_test_split

log = logging.getLogger(__name__)
DATA_FILE = "data.safetensors"


@click.command("train-head")
@model_options
@click.option("--data", "data_file", type=click.Path(exists=True, dir_okay=False), required=True,
              help='JSONL prompts, one {"question": ...} per line (e.g. GSM8K *train*).')
@click.option("--max-examples", type=click.IntRange(min=3), default=64, show_default=True,
              help="Prompts read from --data to generate acceptance data with (whole prompts are held out "
                   "for evaluation and validation, so at least 3).")
@click.option("--steps", type=click.IntRange(min=1), default=500, show_default=True, help="Training steps of the head.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Head, config, cached data and checkpoints go here; rerun to resume.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True, help="Target response length.")
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True,
              help="Of the target's responses (0 = off).")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
              help="Of the target's responses (1 = off).")
@click.option("--mix-rate", type=click.FloatRange(0, 1), default=0.15, show_default=True, help="r: P(Z_i = X_i).")
@click.option("--w-rej", type=click.FloatRange(min=0, min_open=True), default=6.0, show_default=True,
              help="BCE weight of rejections (the paper tries 1, 3, 6, 12).")
@click.option("--layers", type=click.IntRange(min=0), default=2, show_default=True, help="Residual blocks of the head.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of sampling, mixing and training.")
def train_head_command(target, draft, draft_layers, device, dtype, data_file, max_examples, steps, out_dir,
                       max_new_tokens, temperature, top_k, top_p, mix_rate, w_rej, layers, seed):
    """Generate acceptance data with the target and draft, then train the head (progress on stderr)."""
    from seed_tot import Engine, SamplingParams

    from . import checkpoints

    refuse_test_split(data_file, "train heads")
    out = Path(out_dir)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    engine = Engine.from_pretrained(target=target, draft=draft, device=device, dtype=dtype, draft_layers=draft_layers)
    try:
        _generate_and_train(engine, out, params, data_file, max_examples, steps, max_new_tokens, temperature, top_k,
                            top_p, mix_rate, w_rej, layers, seed)
    except KeyboardInterrupt as err:  # the line says what was kept
        from seed_tot.interrupt import Interrupted
        raise Interrupted(lambda: checkpoints.interrupted(out, DATA_FILE)) from err


def _generate_and_train(engine, out, params, data_file, max_examples, steps, max_new_tokens, temperature, top_k, top_p,
                        mix_rate, w_rej, layers, seed) -> None:
    import torch
    from safetensors.torch import load_file, save_file
    from tqdm import tqdm

    from seed_tot.engine.policies.head import AcceptanceHead, save_head
    from seed_tot.tasks.loading import load_records

    from . import checkpoints
    from .response_bar import ResponseBar
    from .specdec_data import GEN_BATCH, HeadData, generate_data
    from .specdec_train import train_head

    trained_for = {"target": engine.target_name, "draft": engine.draft_name, "temperature": temperature,
                   "top_k": top_k, "top_p": top_p, "max_new_tokens": max_new_tokens, "mix_rate": mix_rate,
                   "w_acc": 1.0, "w_rej": w_rej, "data": str(data_file), "max_examples": max_examples,
                   "seed": seed,  # it draws the responses (temperature > 0) and the mixing: other data
                   "split": "by prompt"}  # data cached before rows knew their prompt: not reused
    data_path, meta_path = out / DATA_FILE, out / "data.json"
    if data_path.is_file() and meta_path.is_file() and json.loads(meta_path.read_text()) == trained_for:
        tensors = load_file(str(data_path))
        data = HeadData(tensors["hidden"], tensors["labels"], tensors["prompt"])
        click.echo(f"reusing {len(data.labels)} cached rows from {data_path}", err=True)
    else:
        checkpoints.check_same_data(out, meta_path, trained_for)
        records = load_records(data_file, required=("question",), limit=max_examples)
        prompts = engine.encode([engine.render_prompt(r["question"]) for r in records])
        with ResponseBar(len(prompts), GEN_BATCH, desc="target responses + labels") as bar:
            data = generate_data(engine, prompts, params, mix_rate, seed, progress=lambda i: bar.done(1))
        out.mkdir(parents=True, exist_ok=True)
        save_file({"hidden": data.hidden.contiguous(), "labels": data.labels.contiguous(),
                   "prompt": data.prompt.contiguous()}, str(data_path))
        meta_path.write_text(json.dumps(trained_for, indent=2) + "\n", encoding="utf-8")
    click.echo(f"{len(data.labels)} rows, mean acceptance label {float(data.labels.mean()):.3f}", err=True)
    answered = len(torch.unique(data.groups()))
    if answered < 3:
        raise click.ClickException(f"{answered} of the prompts got a response: too few to hold out one for "
                                   f"evaluation and one for validation; raise --max-examples")
    torch.manual_seed(seed)
    head = AcceptanceHead(data.hidden.shape[1], layers)
    with tqdm(total=steps, desc="training head", unit="step") as bar:
        def progress(step: int, loss: float) -> None:
            bar.n = step
            bar.set_postfix(loss=f"{loss:.4f}")
            bar.refresh()
        result = train_head(head, data, steps, out, w_rej=w_rej, seed=seed, progress=progress)
    save_head(head, out, trained_for)
    report = {"steps": result.steps, "heldout_loss": result.heldout_loss,
              "best_constant_heldout_loss": result.constant_loss, "best_constant": result.constant,
              "rows": len(data.labels), "head": str(out)}
    (out / "MODEL_CARD.md").write_text(model_card(trained_for, layers, report, command_line(click.get_current_context())),
                                       encoding="utf-8")
    click.echo(json.dumps(report, indent=2))


def command_line(ctx: click.Context) -> str:
    """The command that ran, every option spelled out (defaults too: a later default must not change what the
    card's command reproduces)."""
    parts = [f"seed-tot {ctx.info_name}"]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if value is not None and param.opts[0].startswith("--"):
            parts.append(f"{param.opts[0]} {shlex.quote(str(value))}")
    return " ".join(parts)


def model_card(trained_for: dict, layers: int, report: dict, command: str) -> str:
    """The head's card: what it is for, its data, how it compares with a constant, the command that made it."""
    sampling = "greedy" if not trained_for["temperature"] else (
        f"T={trained_for['temperature']:g}, top-k {trained_for['top_k']}, top-p {trained_for['top_p']:g}")
    return f"""# SpecDec++ acceptance head for {Path(str(trained_for['target'])).name} drafting with {Path(str(trained_for['draft'])).name}

- **What**: {layers} residual block(s) over the draft's hidden state, predicting the probability that the target accepts the token drafted from it (`head.safetensors`, `head.json`). Read by `--draft-policy specdec --head DIR` (and `auto` when given); refused beside another target or draft.
- **Data**: {report['rows']} rows from the target's {sampling} responses ({trained_for['max_new_tokens']} tokens) to the first {trained_for['max_examples']} questions of `{Path(str(trained_for['data'])).name}` (a *train* split; no test data), mix rate {trained_for['mix_rate']}, rejection weight {trained_for['w_rej']}, seed {trained_for['seed']}.
- **Training**: {report['steps']} steps, the weights of the best validation loss; validation and held-out rows are those of whole prompts (about a tenth each, at least one prompt each), never of a trained prompt's response; held-out weighted BCE {report['heldout_loss']:.4f} against {report['best_constant_heldout_loss']:.4f} for the best constant ({report['best_constant']:.3f}).
- **Reproduce**: `{command}`
"""
