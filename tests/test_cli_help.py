"""`seed-tot --help` and every subcommand's --help answer without importing torch or transformers;
--version; every option says what it does; bench --modes shows the whole mode syntax."""
from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import click
from click.testing import CliRunner

from seed_tot.cli import main

HEAVY = ("torch", "transformers")


def _heavy_modules_after(code: str) -> list[str]:
    script = f"import sys\n{code}\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.split()


def test_importing_the_cli_imports_neither_torch_nor_transformers():
    assert _heavy_modules_after("import seed_tot.cli") == []


def test_every_help_page_renders_without_torch_or_transformers():
    commands = sorted(main.commands)
    assert {"generate", "solve", "score", "bench"} <= set(commands)
    code = ("from click.testing import CliRunner\nfrom seed_tot.cli import main\n"
            f"for args in [['--help']] + [[c, '--help'] for c in {commands!r}]:\n"
            "    result = CliRunner().invoke(main, args)\n"
            "    assert result.exit_code == 0 and 'Usage:' in result.output, (args, result.output)")
    assert _heavy_modules_after(code) == []


def test_version_prints_the_installed_distributions_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"seed-tot, version {version('seed-tot')}"


def test_every_option_of_every_command_has_help_text():
    missing = [f"{name} {param.opts[0]}" for name, command in main.commands.items() for param in command.params
               if isinstance(param, click.Option) and not param.help]
    assert missing == []


def test_bench_modes_help_shows_the_whole_mode_syntax():
    text = CliRunner().invoke(main, ["bench", "--help"], terminal_width=1000).output
    line = next(line for line in text.splitlines() if "--modes" in line)
    for part in (":K-K-K", "@wN", "@vbM", "@dbM", "@cN", "@pc0", "+POLICY[:KEY=VALUE...]"):
        assert part in line


def test_an_unknown_draft_policy_is_still_refused_by_name():
    result = CliRunner().invoke(main, ["generate", "--draft-policy", "nope"])
    assert result.exit_code == 2 and "'nope' is not one of fixed, opt-tree" in result.output
