"""Every `seed-tot ...` command in README.md and docs/*.md parses as written (click's parsing and the
checks a command makes before it loads a model), without running any model."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from scripted_engine import ScriptedEngine

from seed_tot.bench import parse_modes
from seed_tot.cli import _GENERATE_MODE_OPTIONS, main
from seed_tot.cli_options import (HEAD_POLICIES, check_data_file, check_mode_options, check_policy_setting,
                                  policy_kwargs)
from seed_tot.engine.decode_spec import DecodeSpec
from seed_tot.search import DecodingSettings, LLMCaller
from seed_tot.search.config import RunSettings
from seed_tot.search.protocol import Prompt

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# prose that names a command's shape rather than a command: placeholders, alternatives, elisions
SYNOPSIS = re.compile(r"\.\.\.|…|\||\[|\b[A-Z]{3,}\b")


def _block_commands(text: str) -> list[str]:
    """`seed-tot` lines of fenced code blocks, with their backslash continuations joined."""
    commands, in_block, pending = [], False, None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_block, pending = not in_block, None
            continue
        if not in_block:
            continue
        stripped = line.strip()
        if pending is not None:
            pending += " " + stripped.rstrip("\\")
        elif stripped.startswith("seed-tot "):
            pending = stripped.rstrip("\\")
        else:
            continue
        if not stripped.endswith("\\"):
            commands.append(pending)
            pending = None
    return commands


def _inline_commands(text: str) -> list[str]:
    return [c for c in re.findall(r"`(seed-tot [^`]+)`", text) if not SYNOPSIS.search(c)]


def _documented(kind):
    found = []
    for doc in DOCS:
        for command in kind(doc.read_text(encoding="utf-8")):
            found.append(pytest.param(command, id=f"{doc.name}: {command[:70]}"))
    return found


def _create_inputs(cmd: click.Command, args: list[str]) -> None:
    """Files the command requires to exist (an earlier documented step writes them), made empty in
    the current directory."""
    for param in cmd.params:
        # a click.Path that must exist, or --data, whose callback checks that it names a file
        if not ((isinstance(param.type, click.Path) and param.type.exists) or param.callback is check_data_file):
            continue
        for opt in set(param.opts) & set(args):
            path = Path(args[args.index(opt) + 1])
            if getattr(param.type, "file_okay", True):  # --data: a file
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            else:
                path.mkdir(parents=True, exist_ok=True)


def _parse(command: str) -> click.Context:
    """click's parsing of one command line, then the checks its command runs before loading models."""
    argv = shlex.split(command, comments=True)
    assert argv[0] == "seed-tot"
    name, args = argv[1], argv[2:]
    cmd = main.get_command(click.Context(main), name)
    assert cmd is not None, f"no command {name!r}"
    _create_inputs(cmd, args)
    ctx = cmd.make_context(name, args, parent=click.Context(main, info_name="seed-tot"))
    p = ctx.params
    if "policy_option" in p:
        policy_kwargs(p["draft_policy"], p["policy_option"], p["head_dir"])
    if name == "generate":
        check_mode_options(ctx, [p["mode"]], _GENERATE_MODE_OPTIONS)
    elif name == "solve":
        check_mode_options(ctx, [p["mode"] or RunSettings().mode])
    elif name == "bench":
        check_mode_options(ctx, [s.decode.mode for s in parse_modes(p["modes"], DecodeSpec(
            k_config=p["k_config"], n_workers=p["n_workers"], verify_batch=p["verify_batch"],
            draft_batch=p["draft_batch"]))])
    return ctx


@pytest.fixture(autouse=True)
def _in_a_scratch_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where _create_inputs writes


def test_the_docs_hold_commands_in_code_blocks():
    assert len(_documented(_block_commands)) >= 15  # the extraction finds them (README alone has 14)


@pytest.mark.parametrize("command", _documented(_block_commands))
def test_documented_code_block_command_parses(command):
    _parse(command)


@pytest.mark.parametrize("command", _documented(_inline_commands))
def test_documented_inline_command_parses_apart_from_arguments_prose_leaves_out(command):
    try:
        _parse(command)
    except click.MissingParameter:  # prose may name a command without its required --output or TASK
        pass


def test_documented_policy_options_work_without_draft_policy():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    fragments = set(re.findall(r"`(--policy-option [^`]+)`", readme))
    assert {"--policy-option lookup=0", "--policy-option cut=none"} <= fragments
    for fragment in fragments:
        for command in ("seed-tot generate", "seed-tot solve blocksworld --output runs/x"):
            _parse(f"{command} {fragment}")


def test_policy_options_without_a_policy_name_go_to_the_default_policy():
    assert policy_kwargs(None, ("lookup=0",), None) == {"policy_options": {"lookup": "0"}}
    assert policy_kwargs(None, (), None) == {}


class _RecordingEngine(ScriptedEngine):
    def generate(self, prompts, params, *, spec):
        self.spec = spec
        return super().generate(prompts, params, spec=spec)


def test_a_solves_policy_options_reach_the_engine_without_a_policy_name():
    engine = _RecordingEngine(lambda user, copy: "a thought")
    caller = LLMCaller(engine, DecodingSettings(DecodeSpec(policy_options={"cut": "none"})))
    caller.complete([Prompt("q")], "thought")
    assert engine.spec.options == {"cut": "none"} and engine.spec.draft_policy is None


def test_the_readme_gives_bench_the_mode_spec_syntax_its_parser_takes():
    from seed_tot.bench import SPEC_SYNTAX

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shown = set(re.findall(r"`(MODE\[[^`]*)`", readme))
    assert shown == {SPEC_SYNTAX}


def _reader_trips(doc: Path) -> list[str]:
    """What goes wrong when a reader runs a doc's `solve` and `view` commands in the order written:
    a solve into an --output that an earlier command filled (refused without --resume; with it, two
    data sets in one results.jsonl), or a view of a directory no earlier command wrote."""
    # the quick start chains its solve after `pip install ... &&`
    text = doc.read_text(encoding="utf-8").replace("&& seed-tot ", "\nseed-tot ")
    written: dict[Path, tuple] = {}
    trips = []
    for command in _block_commands(text):
        ctx = _parse(command)
        p = ctx.params
        if ctx.info_name == "solve":
            out, source = Path(p["output"]), (p["task_name"], p["data"])
            if out in written and not p["resume"]:
                trips.append(f"{command}: {out} already holds an earlier command's results (needs its own --output)")
            elif out in written and written[out] != source:
                trips.append(f"{command}: resumes {out}, which holds {written[out]}")
            written.setdefault(out, source)
        elif ctx.info_name == "view":
            trips += [f"{command}: no earlier command writes {run}" for run in map(Path, p["run_dirs"])
                      if run not in written]
    return trips


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_a_reader_running_the_documented_solves_in_order_meets_no_refusal(doc):
    assert _reader_trips(doc) == []


def test_the_readme_trains_a_head_and_then_decodes_with_it():
    """README named `seed-tot train-head` only in the command table: no command, and nothing said which
    policies read the head or that it must be trained for the same target and draft."""
    commands = [_parse(c) for c in _block_commands((ROOT / "README.md").read_text(encoding="utf-8"))]
    heads = [Path(ctx.params["out_dir"]) for ctx in commands if ctx.info_name == "train-head"]
    readers = [ctx.params for ctx in commands if ctx.info_name == "generate" and ctx.params["head_dir"]]
    assert heads and readers
    for p in readers:
        assert Path(p["head_dir"]) in heads and p["draft_policy"] in HEAD_POLICIES
        Path(p["head_dir"]).mkdir(exist_ok=True)
        Path(p["head_dir"], "head.json").write_text("{}", encoding="utf-8")  # what train-head leaves there
        check_policy_setting(DecodeSpec(mode=p["mode"], **policy_kwargs(p["draft_policy"], p["policy_option"],
                                                                         p["head_dir"])), "--policy-option")
