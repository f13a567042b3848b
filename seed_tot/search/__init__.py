"""Tree-of-thoughts search over the `Task` protocol: BFS (SEED's Algorithm 1), DFS, MCTS, the CoT and
CoT-SC baselines, and a dataset runner that writes results.jsonl and summary.json."""
from .bfs import bfs
from .config import ConfigError, RunSettings, apply_overrides, load_settings, shipped_config
from .cot import cot, self_consistency
from .dfs import dfs
from .expansion import SearchResult
from .llm import DecodingSettings, LLMCaller
from .mcts import MCTSConfig, mcts
from .protocol import Example, Prompt, SearchConfig, State, Task
from .results_file import ResultsFileError
from .solve import solve_dataset

__all__ = ["ConfigError", "DecodingSettings", "Example", "LLMCaller", "MCTSConfig", "Prompt", "ResultsFileError",
           "RunSettings", "SearchConfig", "SearchResult", "State", "Task", "apply_overrides", "bfs", "cot", "dfs",
           "load_settings", "mcts", "self_consistency", "shipped_config", "solve_dataset"]
