"""A real `seed-tot serve` process on 127.0.0.1 over tiny models saved to disk, for the server's tests, and
the fixtures the test_serve*.py files share: `served` (one server per test module: a tiny float32 target
and draft, seed mode, fixed draft chains), `engine` (an engine over the same saved models in this process,
for references) and `client` (the official `openai` client). A test module imports the fixtures it uses."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import noisy_copy, save_char_tokenizer, tiny_model
from seed_tot import Engine, GenerationResult, SamplingParams

# a chat template that marks each role, as instruct models' templates do (the char tokenizer has none)
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def save_models(root: Path) -> tuple[str, str]:
    """A target and a close draft with a real char-level tokenizer carrying CHAT_TEMPLATE."""
    from transformers import AutoTokenizer

    vocab = save_char_tokenizer(root / "tok")
    target = tiny_model("llama", seed=41, vocab=vocab, eos=vocab - 1)
    dirs = []
    for name, model in (("target", target), ("draft", noisy_copy(target, 0.005))):
        model.save_pretrained(root / name)
        tok = AutoTokenizer.from_pretrained(root / "tok")
        tok.chat_template = CHAT_TEMPLATE
        tok.save_pretrained(root / name)
        dirs.append(str(root / name))
    return dirs[0], dirs[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`seed-tot serve ARGS` on a free port; `url` is its /v1 base once /health answers."""

    def __init__(self, args: list[str], log_path: Path, timeout_s: float = 180.0):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + "/v1"
        self.log_path = log_path
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "seed_tot.cli", "serve", *args, "--port", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"seed-tot serve exited with {self.proc.returncode}:\n{log_path.read_text()}")
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"seed-tot serve did not answer /health in {timeout_s}s:\n{log_path.read_text()}")

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.base + "/metrics", timeout=10).text
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and line[0] != "#"}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


PROMPTS = ["The cat", "Once upon a time", "2+2=", "Hello world, this is"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    target, draft = save_models(root)
    server = ServerProcess(["--target", target, "--draft", draft, "--device", "cpu", "--dtype", "float32",
                            "--draft-policy", "fixed", "--served-model-name", "tiny", "--max-running", "8",
                            "--max-waiting", "32"], root / "serve.log")
    server.target, server.draft = target, draft
    yield server
    server.stop()


@pytest.fixture(scope="module")
def engine(served):
    return Engine.from_pretrained(target=served.target, draft=served.draft, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def client(served):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=120)


def greedy(engine, prompt, max_tokens: int, stop=()) -> GenerationResult:
    """The target alone (ar), the prompt alone: what every served greedy answer must equal."""
    params = SamplingParams(max_new_tokens=max_tokens, temperature=0, stop=stop)
    return engine.generate([prompt], params, mode="ar")[0]


def wait_for(served, condition, timeout_s: float = 60.0) -> dict:
    """The server's metrics once `condition` holds of them, or at the deadline (the caller asserts)."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = served.metrics()
        if condition(metrics) or time.monotonic() > deadline:
            return metrics
        time.sleep(0.2)
