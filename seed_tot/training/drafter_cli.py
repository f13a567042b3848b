"""`seed-tot train-drafter`: train a ParallelSpec (or same-size autoregressive) drafter for a target."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from seed_tot.cli_options import check_device, check_dtype

from .data_source import refuse_test_split
from .samples import DATA_FILE

log = logging.getLogger(__name__)
DEFAULT_VOCAB = 8192


def _task_list(ctx, param, value) -> tuple[str, ...]:
    from .drafter_data import TASKS

    names = tuple(n.strip().replace("-", "_") for n in value.split(",") if n.strip())
    unknown = [n for n in names if n not in TASKS]
    if not names or unknown:
        raise click.BadParameter(f"expected a comma-separated subset of {','.join(TASKS)}, got {value!r}")
    return names


@click.command("train-drafter")
@click.option("--method", type=click.Choice(["parallelspec", "autoregressive"]), default="parallelspec", show_default=True,
              help="parallelspec: k+1 tokens per forward from [MASK] tokens; autoregressive: one token per forward.")
@click.option("--target", default=None, help="Hub id, local dir or .gguf file (default: embedded SmolLM2-135M-Instruct).")
@click.option("--data", "data_file", type=click.Path(exists=True, dir_okay=False), required=True,
              help='JSONL training questions, one {"question": ..., "answer": ...} per line (GSM8K *train*; never test data); gsm8k_value builds its states from the answers.')
@click.option("--k", "k", type=click.IntRange(min=1), default=4, show_default=True,
              help="parallelspec: [MASK] tokens (drafts k+1 per forward); autoregressive: held-out chain is k+1 long.")
@click.option("--layers", type=click.IntRange(min=1), default=1, show_default=True, help="Decoder layers of the drafter.")
@click.option("--steps", type=click.IntRange(min=1), default=2000, show_default=True, help="Training steps.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Drafter, config, cached data and checkpoints go here; rerun to resume.")
@click.option("--tasks", default="gsm8k,gsm8k_value,blocksworld,creative_writing", show_default=True, callback=_task_list,
              help="Which task prompts to render from the train questions.")
@click.option("--max-examples", type=click.IntRange(min=2), default=256, show_default=True,
              help="Train questions read from --data.")
@click.option("--heldout", type=click.IntRange(min=1), default=8, show_default=True,
              help="Questions after the --max-examples ones whose prompts are kept out of training (and of the "
                   "draft vocabulary), for the final acceptance (tau).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True, help="Target response length.")
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Of the target's responses (0 = greedy).")
@click.option("--distill-temperature", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Train against the target's distributions at this temperature (soft labels, for sampled "
                   "decoding) instead of its responses' tokens (0).")
@click.option("--target-features", is_flag=True,
              help="parallelspec: the drafter also reads the target's final hidden states (EAGLE-style features).")
@click.option("--gen-batch", type=click.IntRange(min=1), default=16, show_default=True, help="Prompts per batched target call.")
@click.option("--batch", type=click.IntRange(min=1), default=8, show_default=True, help="Sequences per training step.")
@click.option("--max-groups", type=click.IntRange(min=1), default=64, show_default=True,
              help="Group anchors per sequence and step (drawn from the response positions).")
@click.option("--context", type=click.IntRange(min=1), default=256, show_default=True, help="Prompt tokens kept per sample.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=5e-4, show_default=True, help="Learning rate.")
@click.option("--device", default="auto", show_default=True, callback=check_device, help="cpu, cuda, cuda:N or auto (a GPU when there is one).")
@click.option("--dtype", default=None, callback=check_dtype, help="float32 (default on CPU), bfloat16, float16.")
@click.option("--draft-vocab", "vocab_size", type=click.IntRange(min=0), default=DEFAULT_VOCAB, show_default=True,
              help="Train and draft over only the N tokens most frequent in the target's responses (FR-Spec; 0: all tokens).")
@click.option("--vocab-examples", type=click.IntRange(min=0), default=8000, show_default=True,
              help="Train records whose prompts and solutions fill the draft vocabulary past the responses' own tokens.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of data selection and training.")
def train_drafter_command(method, target, data_file, k, layers, steps, out_dir, tasks, max_examples, heldout,
                          max_new_tokens, temperature, distill_temperature, target_features, gen_batch, batch, max_groups,
                          context, lr, device, dtype, vocab_size, vocab_examples, seed):
    """Generate the target's responses to the project's own prompts, train the drafter on them (progress
    on stderr), save DIR/drafter.safetensors + DIR/drafter.json and report held-out acceptance."""
    from seed_tot import Engine

    refuse_test_split(data_file, "train drafters")
    if target_features and method != "parallelspec":
        raise click.BadParameter("only a parallelspec drafter can read the target's hidden states",
                                 param_hint="--target-features")
    engine = Engine.from_pretrained(target=target, device=device, dtype=dtype, load_draft=False)
    # everything else runs where the engine runs its forwards (its forward thread on a CPU): generating the
    # data, building the vocabulary, training and measuring share one OpenMP team (forward_thread.py says why)
    try:
        engine.on_forward_thread(_generate_and_train, engine, method, target, data_file, k, layers, steps, out_dir,
                                 tasks, max_examples, heldout, max_new_tokens, temperature, context, seed, gen_batch,
                                 batch, lr, max_groups, vocab_size, vocab_examples, distill_temperature, target_features)
    except KeyboardInterrupt as err:  # the line says what was kept once the forward thread stopped
        from seed_tot.interrupt import Interrupted

        from . import checkpoints
        raise Interrupted(lambda: checkpoints.interrupted(Path(out_dir), DATA_FILE)) from err


def _generate_and_train(engine, method, target, data_file, k, layers, steps, out_dir, tasks, max_examples, heldout,
                        max_new_tokens, temperature, context, seed, gen_batch, batch, lr, max_groups, vocab_size,
                        vocab_examples, distill_temperature, target_features=False) -> None:
    import time

    import torch
    from safetensors.torch import load_file, save_file
    from tqdm import tqdm

    from seed_tot import Engine, SamplingParams
    from seed_tot.engine.drafters import ParallelDrafter, save_drafter
    from seed_tot.engine.drafters.draft_vocab import coverage, frequent_tokens
    from seed_tot.tasks.loading import load_records

    from .drafter_data import (attach_target_hidden, generate_samples, heldout_prompts, pack, records_tokens,
                               special_ids, split_questions, task_prompts, unpack)
    from . import checkpoints
    from .drafter_train import heldout_tau, train_drafter
    from .response_bar import ResponseBar
    from .soft_labels import target_soft_labels
    from seed_tot.engine.forward_thread import stop_point

    out = Path(out_dir)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    try:
        train_records, held_records = split_questions(
            load_records(data_file, required=("question",), limit=max_examples + heldout), max_examples, heldout)
    except ValueError as err:
        raise click.UsageError(f"{data_file}: {err} (--heldout {heldout})") from err
    if len(train_records) < max_examples:
        log.warning("%s: %d questions train (not --max-examples %d): the last %d are held out", data_file,
                    len(train_records), max_examples, heldout)
    texts = task_prompts(engine, train_records, tasks, seed)
    held_texts = heldout_prompts(engine, held_records, tasks, seed, set(texts))
    if not held_texts:
        raise click.UsageError(f"{data_file}: every prompt of the {len(held_records)} held-out questions is also a "
                               f"training prompt; raise --heldout")
    train_prompts, held_prompts = engine.encode(texts), engine.encode(held_texts)
    data_meta = {"target": engine.target_name, "data": str(data_file), "max_examples": max_examples, "tasks": list(tasks),
                 "max_new_tokens": max_new_tokens, "temperature": temperature, "context": context, "seed": seed,
                 "heldout": heldout, "split": "by question", "train_questions": len(train_records)}
    data_path, meta_path, cost_path = out / DATA_FILE, out / "data.json", out / "data_cost.json"
    checkpoints.check_same_training(out, {
        "method": method, "k": k, "layers": layers, "batch": batch, "lr": lr, "max_groups": max_groups, "seed": seed,
        "distill_temperature": distill_temperature, "target_features": target_features, "draft_vocab": vocab_size,
        "vocab_examples": vocab_examples})
    gen_start = time.perf_counter()
    if data_path.is_file() and meta_path.is_file() and json.loads(meta_path.read_text()) == data_meta:
        samples = unpack(load_file(str(data_path)))
        click.echo(f"reusing {len(samples)} cached samples from {data_path}", err=True)
        # what generating them cost when they were made (the card reports that, not the reload)
        gen_s = json.loads(cost_path.read_text())["generate_s"] if cost_path.is_file() else time.perf_counter() - gen_start
    else:
        checkpoints.check_same_data(out, meta_path, data_meta)
        with ResponseBar(len(train_prompts), gen_batch) as bar:
            samples = generate_samples(engine, train_prompts, params, gen_batch, context, progress=bar.done)
        out.mkdir(parents=True, exist_ok=True)
        save_file(pack(samples), str(data_path))
        meta_path.write_text(json.dumps(data_meta, indent=2) + "\n", encoding="utf-8")
        gen_s = time.perf_counter() - gen_start
        cost_path.write_text(json.dumps({"generate_s": gen_s}) + "\n", encoding="utf-8")
    response_tokens = sum(len(s.tokens) - s.start for s in samples)
    click.echo(f"{len(samples)} samples, {response_tokens} response tokens", err=True)
    torch.manual_seed(seed)
    drafter = ParallelDrafter(engine.target, k if method == "parallelspec" else 0, layers,
                              target_features=target_features)
    vocab_record = None
    if vocab_size:  # set before training, so the drafter learns the softmax over the rows it drafts from
        # (drafter_train._scored). First every token the target wrote here (exactly what a drafter has to
        # propose), then, up to the size, the most frequent tokens of the train side's prompts and
        # solutions (--vocab-examples records): the responses alone hold too few distinct tokens
        # for a test question's names and words (docs/benchmarks.md)
        responses = [s.tokens[s.start:] for s in samples]
        ids = frequent_tokens(responses, vocab_size, special_ids(engine.tokenizer))
        source = "the target's responses in the training data"
        if ids.numel() < vocab_size and vocab_examples:
            held = range(len(train_records), len(train_records) + len(held_records))
            counted = [r for i, r in enumerate(load_records(data_file, required=("question",), limit=vocab_examples))
                       if i not in held]  # the held-out questions' words stay out of the drafter too
            token_lists = records_tokens(engine, counted, [t for t in tasks if t != "gsm8k_value"], frozenset(held_texts))
            more = frequent_tokens(token_lists, vocab_size - ids.numel(), exclude=ids.tolist())
            ids = torch.unique(torch.cat([ids, more]))
            source += f", then the most frequent of {len(counted)} {Path(data_file).name} records' prompts and solutions"
        drafter.set_draft_vocab(ids)
        vocab_record = {"source": source, "coverage": round(coverage(ids, responses), 4)}
    soft, soft_s = None, 0.0
    if distill_temperature:  # the target's own distributions at the responses' positions (soft_labels.py)
        soft_start = time.perf_counter()
        with tqdm(total=len(samples), desc=f"target distributions at T={distill_temperature:g}", unit="sample") as bar:
            soft = target_soft_labels(engine.target, samples, distill_temperature, progress=_stoppable(bar.update))
        soft_s = time.perf_counter() - soft_start
    features_s = 0.0
    if target_features:  # what the drafter reads beside each token at inference: the target's hidden states
        features_start = time.perf_counter()
        with tqdm(total=len(samples), desc="target hidden states", unit="sample") as bar:
            attach_target_hidden(engine.target, samples, train_prompts, progress=_stoppable(bar.update))
        features_s = time.perf_counter() - features_start
    train_start = time.perf_counter()
    with tqdm(total=steps, desc=f"training {method} drafter", unit="step") as bar:
        def progress(step: int, loss: float, accuracy: list[float]) -> None:
            stop_point()  # Ctrl-C: training ends after this step (its checkpoints stay)
            bar.n = step
            bar.set_postfix(loss=f"{loss:.3f}", acc="/".join(f"{a:.2f}" for a in accuracy))
            bar.refresh()
        result = train_drafter(drafter, samples, steps, out, batch=batch, lr=lr, max_groups=max_groups, seed=seed,
                               progress=progress, soft_labels=soft)
    train_s = time.perf_counter() - train_start
    # held-out prompts cut to the context the samples keep: the drafter is measured on what it was trained for
    measured = Engine(engine.target, drafter, engine.tokenizer, forward_thread=engine.forward_thread)
    held = [p[-context:] for p in held_prompts]
    tau = {**heldout_tau(measured, held, k + 1, min(max_new_tokens, 64)), "questions": len(held_records)}
    sampled = heldout_tau(measured, held, k + 1, min(max_new_tokens, 64), distill_temperature) if distill_temperature else None
    training = {**data_meta, "method": method, "steps": result.steps, "batch": batch, "lr": lr, "max_groups": max_groups,
                "final_loss": result.loss, "final_accuracy": result.accuracy, "heldout": tau,
                "samples": len(samples), "response_tokens": response_tokens,
                "generate_minutes": gen_s / 60, "train_minutes": train_s / 60,
                "distill_temperature": distill_temperature, "soft_label_minutes": soft_s / 60, "heldout_sampled": sampled,
                "target_features": target_features, "feature_minutes": features_s / 60}
    save_drafter(drafter, out, engine.target, engine.target_name, training, vocab_record)
    command = ["seed-tot train-drafter", f"--method {method}", f"--data {data_file}", f"--k {k}", f"--layers {layers}",
               f"--steps {steps}", f"--batch {batch}", f"--lr {lr:g}", f"--max-groups {max_groups}",
               f"--max-examples {max_examples}", f"--heldout {heldout}", f"--max-new-tokens {max_new_tokens}",
               f"--temperature {temperature:g}", f"--context {context}", f"--gen-batch {gen_batch}",
               f"--distill-temperature {distill_temperature:g}", f"--tasks {','.join(tasks)}", f"--draft-vocab {vocab_size}", f"--vocab-examples {vocab_examples}",
               f"--seed {seed}", f"--out {out}"] + (["--target-features"] if target_features else [])
    if target:
        command.insert(2, f"--target {target}")
    (out / "MODEL_CARD.md").write_text(model_card(method, k, layers, training, " ".join(command), vocab_record and {"size": drafter.draft_vocab_size, **vocab_record}), encoding="utf-8")
    click.echo(json.dumps({"drafter": str(out), "method": method, "k": drafter.n_masks, "layers": layers,
                           "steps": result.steps, "loss": result.loss, "accuracy": result.accuracy, "heldout": tau, "heldout_sampled": sampled,
                           "weights_mb": (out / "drafter.safetensors").stat().st_size / 2**20}, indent=2))


def _stoppable(update):
    """A progress callback that ends the work at a Ctrl-C (forward_thread.stop_point) after each step."""
    from seed_tot.engine.forward_thread import stop_point

    def step(n: int = 1) -> None:
        stop_point()
        update(n)
    return step


def vocab_line(vocab: dict | None) -> str:
    if not vocab:
        return "- **Draft vocabulary**: the whole vocabulary.\n"
    return (f"- **Draft vocabulary**: the {vocab['size']} most frequent tokens of {vocab['source']} "
            f"(they cover {vocab['coverage']:.1%} of it; draft_vocab.safetensors): the drafter's LM head scores only "
            f"these, the target still verifies over all tokens.\n")


def features_line(training: dict) -> str:
    if not training.get("target_features"):
        return ""
    return (f"- **Inputs**: beside each token, the target's final hidden state at the position before it "
            f"(EAGLE-style features, RMS-scaled and added through a linear `fuse` map; a mask reads its anchor's), computed for the data in "
            f"{training['feature_minutes']:.1f} min. Drafts only with the `parallelspec` policy.\n")


def distill_line(training: dict) -> str:
    from .soft_labels import DEFAULT_TOP_K

    if not training.get("distill_temperature"):
        return ""
    return (f"- **Labels**: the target's own distributions at T={training['distill_temperature']:g} (top {DEFAULT_TOP_K} tokens per "
            f"position, soft cross-entropy; the loss includes their entropy), computed in "
            f"{training['soft_label_minutes']:.1f} min.\n")


def sampled_line(training: dict) -> str:
    held = training.get("heldout_sampled")
    if not held:
        return ""
    return (f" At T={held['temperature']:g}: tau {held['tau']:.2f}, {held['acceptance']:.1%} accepted "
            f"({held['tokens']} tokens).")


def model_card(method: str, k: int, layers: int, training: dict, command: str, vocab: dict | None = None) -> str:
    """A short model card from the training record: what the drafter is, its data, cost and tau."""
    held = training["heldout"]
    accuracy = ", ".join(f"{a:.2f}" for a in training["final_accuracy"])
    return f"""# {method} drafter for {Path(str(training['target'])).name}

- **What**: {layers} decoder layer(s) of the target's own config class{f' + {k} [MASK] embeddings (one forward drafts up to {k + 1} tokens)' if method == 'parallelspec' else ' (one token per forward)'}, over the target's frozen, shared embeddings and LM head (not stored here). Load with `--draft DIR` / `Engine.from_pretrained(draft=DIR)`; it refuses any other target.
- **Data**: the target's own {'greedy' if not training['temperature'] else f"T={training['temperature']}"} responses ({training['max_new_tokens']} tokens) to the project's {', '.join(training['tasks'])} prompts, rendered from the first {training['train_questions']} questions of `{Path(str(training['data'])).name}` (a *train* split; no test data). {training['samples']} samples, {training['response_tokens']} response tokens. Held out: the next {training['heldout']['questions']} questions' {training['heldout']['prompts']} prompts{' (Blocksworld: instances drawn with seed + 1)' if 'blocksworld' in training['tasks'] else ''}, not trained on{', nor counted in the draft vocabulary' if vocab else ''}.
- **Training**: {training['steps']} steps, batch {training['batch']}, lr {training['lr']}, {training['max_groups']} groups per sequence; final loss {training['final_loss']:.3f}, per-position accuracy {accuracy}. Cost on the machine that trained it: {training['generate_minutes']:.1f} min generating the data, {training['train_minutes']:.1f} min training.
{vocab_line(vocab)}{features_line(training)}{distill_line(training)}- **Held-out acceptance** (greedy sd, chain of {held['depth']}, {held['prompts']} prompts, {held['tokens']} tokens): tau {held['tau']:.2f} tokens per target forward, {held['acceptance']:.1%} of drafted tokens accepted.{sampled_line(training)}
- **Reproduce**: `{command}`
"""
