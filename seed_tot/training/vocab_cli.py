"""`seed-tot drafter-vocab`: give a trained drafter a frequency-ranked draft vocabulary (FR-Spec).

The counts come from training-side text only: the drafter's cached self-distillation data when its
directory still holds it (the target's own responses: exactly what a drafter must predict), else
the project's rendered prompts (their few-shot examples show the answer formats) and the records'
answers (GSM8K *train* solutions) from --data. Special tokens are always kept (EOS must stay
draftable). The vocabulary only changes what can be drafted, never what is emitted (draft_vocab.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import click

DEFAULT_SIZE = 8192


@click.command("drafter-vocab")
@click.option("--drafter", "drafter_dir", type=click.Path(exists=True, file_okay=False), required=True,
              help="A directory from `seed-tot train-drafter` (the vocabulary is written into it).")
@click.option("--target", default=None, help="The drafter's target (default: embedded SmolLM2-135M-Instruct).")
@click.option("--data", "data_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="JSONL train records ({'question', 'answer'}) to count, when DIR holds no cached training data.")
@click.option("--size", type=click.IntRange(min=0), default=DEFAULT_SIZE, show_default=True,
              help="Most frequent tokens kept (0: remove the vocabulary, draft over all tokens).")
@click.option("--max-examples", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Train records read from --data.")
@click.option("--tasks", default="gsm8k,blocksworld,creative_writing", show_default=True,
              help="Which task prompts to render from the train records before counting.")
def drafter_vocab_command(drafter_dir, target, data_file, size, max_examples, tasks):
    """Count training-side tokens, keep the --size most frequent (plus special tokens) as DIR's draft
    vocabulary and report its coverage of the counted text."""
    from safetensors.torch import load_file

    from seed_tot import Engine
    from seed_tot.engine.drafters.draft_vocab import VOCAB_FILE, coverage, frequent_tokens, save_vocab
    from seed_tot.engine.drafters.storage import CONFIG, read_config
    from seed_tot.tasks.loading import load_records

    from .data_source import refuse_test_split
    from .drafter_data import records_tokens, special_ids, training_heldout, unpack
    from .samples import DATA_FILE

    root = Path(drafter_dir)
    config = read_config(root)
    if size == 0:
        (root / VOCAB_FILE).unlink(missing_ok=True)
        config.pop("draft_vocab", None)
        (root / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        _update_card(root, None)
        click.echo(f"{root}: drafts over the whole vocabulary")
        return
    engine = Engine.from_pretrained(target=target, draft=str(root))  # checks the drafter fits the target
    if (root / DATA_FILE).is_file():
        token_lists = [s.tokens[s.start:] for s in unpack(load_file(str(root / DATA_FILE)))]
        source = f"{root / DATA_FILE} (the target's responses)"
    elif data_file is not None:
        refuse_test_split(data_file, "count tokens")
        records = load_records(data_file, required=("question",), limit=max_examples)
        held, held_texts = training_heldout(engine, config.get("training"), data_file)
        records = [r for i, r in enumerate(records) if i not in held]  # the card's held-out tau stays held out
        token_lists = records_tokens(engine, records, [t for t in tasks.split(",") if t], held_texts)
        source = f"{data_file} ({len(records)} records: rendered prompts and answers)"
        if held:
            source += f", less the {len(held)} questions held out in training"
    else:
        raise click.UsageError(f"{root} holds no {DATA_FILE}; pass --data with training records to count")
    ids = frequent_tokens(token_lists, size, special_ids(engine.tokenizer))
    save_vocab(root, ids)
    share = coverage(ids, token_lists)
    config["draft_vocab"] = {"size": int(ids.numel()), "source": source, "coverage": round(share, 4)}
    (root / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    _update_card(root, config["draft_vocab"])
    click.echo(json.dumps({"drafter": str(root), **config["draft_vocab"]}, indent=2))


def _update_card(root: Path, vocab: dict | None) -> None:
    """The model card's vocabulary line, rewritten for the vocabulary now in `root`: a card that
    named the old one would describe a drafter the directory no longer holds. A card without such a
    line gets one before its Reproduce line; a directory without a card is left without one."""
    from .drafter_cli import vocab_line

    card = root / "MODEL_CARD.md"
    if not card.is_file():
        return
    line = vocab_line(vocab).rstrip("\n")
    line = (line[:-1] if line.endswith(".") else line) + " (set after training by `seed-tot drafter-vocab`)."
    lines = card.read_text(encoding="utf-8").splitlines()
    at = next((i for i, text in enumerate(lines) if text.startswith("- **Draft vocabulary**")), None)
    if at is not None:
        lines[at] = line
    else:
        at = next((i for i, text in enumerate(lines) if text.startswith("- **Reproduce**")), len(lines))
        lines.insert(at, line)
    stale = " Measured with the vocabulary it was trained with, not the one `seed-tot drafter-vocab` set since."
    lines = [text + stale if text.startswith("- **Held-out acceptance**") and stale not in text else text for text in lines]
    card.write_text("\n".join(lines) + "\n", encoding="utf-8")
