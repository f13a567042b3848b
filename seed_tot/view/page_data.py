"""Run directories -> the JSON the page embeds: a header per run and, per problem, each run's tree.

The trees are flattened here, not in the browser, so the page's script only draws: every candidate
of every step becomes a node that names its parent node, its value, whether it was kept (its rank)
or pruned, whether it lies on the chosen path, and what the engine spent on it. Fields a record
lacks (older results, a crashed problem) are listed by name so the page can say what is missing.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from seed_tot.engine.decode_spec import DRAFTING_MODES
from seed_tot.search.protocol import Example, State
from seed_tot.search.results_file import summarize_records
from seed_tot.search.run_identity import RUN_FILE
from seed_tot.search.node_work import WORK_FIELDS
from seed_tot.search.solve import RESULTS_FILE, SUMMARY_FILE

log = logging.getLogger(__name__)

RECORD_FIELDS = ("id", "input", "prediction", "steps", "stats", "best_state", "wall_s")
STEP_FIELDS = ("frontier", "thoughts", "parents", "new_states", "values", "kept")
QUESTION_KEYS = ("question", "problem", "prompt", "input", "text", "sentences")  # creative_writing: "sentences"
GOLD_KEYS = ("gold", "gold_plan")  # a score's gold (gsm8k), else the data's (blocksworld's plan)

# show_state(example, state) -> str: how a node's state is shown (a task may supply it; the page
# shows the node's own step, the last entry of the state, otherwise).
StateShower = Callable[[Example, State], str]


@dataclass
class Run:
    directory: Path
    label: str
    summary: dict[str, Any] | None
    records: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)  # what the run directory lacks, in words
    identity: dict[str, Any] | None = None  # run.json: task, settings, models, policy (written before the first record)


def load_run(directory: str | Path, label: str | None = None) -> Run:
    """A run directory's records (unreadable lines skipped and counted) and its summary, if any."""
    directory = Path(directory)
    results = directory / RESULTS_FILE
    if not results.is_file():
        raise FileNotFoundError(f"{directory}: no {RESULTS_FILE}; give a directory `seed-tot solve --output` wrote")
    notes: list[str] = []
    records: list[dict[str, Any]] = []
    bad = 0
    for line in results.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            bad += 1  # a run killed mid-write leaves a cut last line
            continue
        if isinstance(record, dict) and "id" in record:
            records.append(record)
        else:
            bad += 1
    if bad:
        notes.append(f"{bad} line(s) of {RESULTS_FILE} are not result records and were skipped")
    summary = None
    summary_path = directory / SUMMARY_FILE
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            notes.append(f"{SUMMARY_FILE} does not parse ({err}); figures recomputed from {RESULTS_FILE}")
    identity = _read_identity(directory / RUN_FILE, notes)
    if summary is None:
        settings_from = f"model pair and settings from {RUN_FILE}" if identity else "model pair and settings not recorded"
        if not summary_path.is_file():
            notes.append(f"{SUMMARY_FILE} missing (run interrupted?): figures recomputed from {RESULTS_FILE}; "
                         f"{settings_from}")
    return Run(directory, label or directory.name, summary, records, notes, identity)


def _read_identity(path: Path, notes: list[str]) -> dict[str, Any] | None:
    """run.json, what the run was made with (an interrupted run has no summary.json to say it)."""
    if not path.is_file():
        return None
    try:
        identity = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        notes.append(f"{RUN_FILE} does not parse ({err})")
        return None
    return identity if isinstance(identity, dict) else None


def _policy_shown(settings: dict[str, Any], mode: str | None, k_config: Any) -> str | None:
    """The policy a drafting run without a recorded one ran: the one its settings name, else the
    default for its mode and k_config where that does not depend on the device."""
    from seed_tot.engine.policies import default_policy_name

    if settings.get("draft_policy"):
        return str(settings["draft_policy"])
    if mode is None or not isinstance(k_config, list):
        return None
    names = {device: default_policy_name(mode, tuple(k_config), device) for device in ("cpu", "cuda")}
    return names["cpu"] if names["cpu"] == names["cuda"] else (
        f"default ({names['cpu']} on a CPU, {names['cuda']} on a GPU; the device was not recorded)")


def run_header(run: Run) -> dict[str, Any]:
    """The figures of a run's header; those no file records are None (the page prints "not recorded")."""
    # summary.json once a run ends; run.json (written before its first record) for an interrupted one
    summary, identity = run.summary or {}, run.identity or {}
    figures = summarize_records(run.records)  # this file's records, whatever the summary covered
    settings = summary.get("settings") or identity.get("settings") or {}
    search = settings.get("search") or {}
    models = identity.get("models") if isinstance(identity.get("models"), dict) else {}
    mode = summary.get("mode") or settings.get("mode")
    k_config = summary.get("k_config") or settings.get("k_config")
    if mode is not None and mode not in DRAFTING_MODES:  # ar and parallel draft nothing: no policy to show
        policy = k_config = options = f"none ({mode} drafts nothing)"
    else:
        policy = summary.get("policy") or identity.get("policy") or _policy_shown(settings, mode, k_config)
        options = settings.get("policy_options") or ("none" if settings else None)
    mean_wall = figures.get("mean_wall_s") or 0.0
    return {
        "label": run.label, "directory": str(run.directory), "notes": run.notes,
        "task": summary.get("task") or identity.get("task"),
        "algorithm": summary.get("algorithm") or settings.get("algorithm"), "mode": mode,
        "target": summary.get("target") or models.get("target"), "draft": summary.get("draft") or models.get("draft"),
        "policy": policy, "policy_options": options,
        "k_config": k_config, "temperature": search.get("temperature"),
        "depth": search.get("depth"), "n_generate": search.get("n_generate"), "breadth": search.get("breadth"),
        "n": figures["n"], "accuracy": figures.get("accuracy"), "mean_score": figures.get("mean_score"),
        "tokens_per_s": figures.get("tokens_per_s"), "acceptance_rate": figures.get("acceptance_rate"),
        "tokens_per_target_forward": figures.get("tokens_per_target_forward"),
        # one problem at a time: problems/h from the mean wall time per problem (a concurrent run did more)
        "problems_per_h": 3600.0 / mean_wall if mean_wall else None,
    }


def question_text(data: Any) -> str:
    if isinstance(data, dict):
        for key in QUESTION_KEYS:
            if isinstance(data.get(key), str):
                return data[key]
    if isinstance(data, str):
        return data
    return json.dumps(data, indent=1, ensure_ascii=False, default=str)


def missing_fields(record: dict[str, Any]) -> list[str]:
    """The names of the fields the page needs that `record` lacks."""
    missing = [name for name in RECORD_FIELDS if name not in record]
    if "correct" not in record and "score" not in record and "error" not in record:
        missing.append("correct / score")
    steps = record.get("steps")
    if isinstance(steps, list):
        for n, step in enumerate(steps):
            lacking = [name for name in STEP_FIELDS if not isinstance(step, dict) or name not in step]
            missing += [f"steps[{n}].{name}" for name in lacking]
        if steps and not isinstance(record.get("node_work"), list):
            missing.append("node_work (the engine's work and the evaluator's reply per node; "
                           "results written before they were recorded)")
    return missing


def _at(values: Any, i: int) -> Any:
    return values[i] if isinstance(values, list) and 0 <= i < len(values) else None


def tree_nodes(record: dict[str, Any], show_state: StateShower | None = None) -> tuple[list[dict], list[dict]]:
    """(nodes, steps): every candidate of every step as a node, and each step's call counters.

    A node: p parent node (-1: the question), s step, i candidate index, t thought (None: a final
    state carried over to compete again), v value, k rank among the kept (None: pruned), r the
    evaluator's raw reply, w / vw the engine counters of its thought / evaluation, c on the chosen
    path, x the state as the task shows it, dup a repeat of an earlier candidate of its step;
    MCTS adds n visits, q mean reward and o the expansion order; CoT-SC pr the chain's prediction.
    """
    example = Example(str(record.get("id")), record.get("input") if isinstance(record.get("input"), dict) else {})
    by_state: dict[tuple, int] = {}  # a kept state -> its node, the parent of its children
    nodes: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for s, step in enumerate(record.get("steps") or []):
        if not isinstance(step, dict):
            continue
        frontier, states = step.get("frontier") or [], step.get("new_states") or []
        thoughts, parents, values = step.get("thoughts") or [], step.get("parents") or [], step.get("values") or []
        kept = [k for k in (step.get("kept") or []) if isinstance(k, int)]
        work = _at(record.get("node_work"), s) or {}
        count = max(len(thoughts), len(states), len(values))
        seen: set[tuple] = set()
        made: list[tuple[tuple, int, bool]] = []
        for i in range(count):
            state = tuple(_at(states, i) or ())
            parent_state = tuple(_at(frontier, _at(parents, i) if isinstance(_at(parents, i), int) else -1) or ())
            node: dict[str, Any] = {"p": by_state.get(parent_state, -1), "s": s, "i": i, "t": _at(thoughts, i),
                                    "v": _at(values, i), "k": kept.index(i) if i in kept else None,
                                    "r": _at(work.get("value_replies"), i),
                                    "w": _packed(_at(work.get("thought_work"), i)),
                                    "vw": _packed(_at(work.get("value_work"), i))}
            node.update(_search_marks(step, i))
            if state in seen and node["t"] is not None:
                node["dup"] = 1
            seen.add(state)
            if node["t"] is None:
                node["p"] = by_state.get(state, node["p"])  # a carried final state sits under itself
            if show_state is not None and state:
                node["x"] = _shown(show_state, example, state)
            elif len(state) and (node["t"] is None or state[-1] != node["t"]):
                node["x"] = str(state[-1])  # the task cleaned the thought up: show what the state holds
            made.append((state, len(nodes), node["k"] is not None))
            nodes.append(node)
        for state, index, is_kept in made:
            if is_kept:
                by_state[state] = index
        calls = work.get("call_work") if isinstance(work.get("call_work"), dict) else {}
        steps.append({"s": s, "cw": {phase: _packed(c) for phase, c in calls.items()}, "depth": step.get("depth")})
    _mark_chosen(nodes, record.get("best_state"), record.get("steps") or [])
    _mark_expansion_order(nodes, record.get("steps") or [])
    return nodes, steps


def _search_marks(step: dict[str, Any], i: int) -> dict[str, Any]:
    """What MCTS (n visits, q mean reward) and CoT-SC (pr the chain's prediction) record per candidate."""
    marks: dict[str, Any] = {}
    if isinstance(step.get("visits"), list):
        marks.update(n=_at(step["visits"], i), q=_at(step.get("mean_values"), i))
    if isinstance(step.get("predictions"), list):
        marks["pr"] = _at(step["predictions"], i)
    return marks


def _mark_expansion_order(nodes: list[dict], steps: list) -> None:
    """MCTS: o, the place in the expansion order of each node that was expanded (its step's
    frontier), where the record says the steps are expansions (they carry an "iteration")."""
    by_index = {(n["s"], n["i"]): n for n in nodes}
    for order, step in enumerate(steps):
        if not isinstance(step, dict) or "iteration" not in step:
            continue
        frontier = tuple((step.get("frontier") or [[]])[0])
        if not frontier:
            continue  # the root: the question itself, expanded first
        for earlier in range(order):
            prior = steps[earlier] if isinstance(steps[earlier], dict) else {}
            states = [tuple(x) for x in prior.get("new_states") or []]
            if frontier in states and (earlier, states.index(frontier)) in by_index:
                by_index[(earlier, states.index(frontier))]["o"] = order
                break


def _packed(work: Any) -> list | None:
    """A node's counters as a list in WORK_FIELDS order: the names once per page, not once per node."""
    return [work.get(name) for name in WORK_FIELDS] if isinstance(work, dict) else None


def _shown(show_state: StateShower, example: Example, state: tuple) -> str:
    try:
        return str(show_state(example, State(tuple(str(t) for t in state))))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        return f"(the task's show_state failed: {err})"


def _mark_chosen(nodes: list[dict], best_state: Any, steps: list) -> None:
    """Mark the path to the state the answer was written from: the node of each of its prefixes
    (a kept one where a prefix also occurs pruned)."""
    if not isinstance(best_state, list) or not best_state:
        return
    states = {}
    for node in nodes:
        step = steps[node["s"]] if node["s"] < len(steps) and isinstance(steps[node["s"]], dict) else {}
        states[id(node)] = tuple(_at(step.get("new_states"), node["i"]) or ())
    best = tuple(best_state)
    for depth in range(1, len(best) + 1):
        prefix = best[:depth]
        matches = [n for n in nodes if states[id(n)] == prefix]
        for node in [n for n in matches if n["k"] is not None][:1] or matches[:1]:
            node["c"] = 1


def _gold(record: dict[str, Any]) -> Any:
    data = record.get("input") if isinstance(record.get("input"), dict) else {}
    return next((source[key] for key in GOLD_KEYS for source in (record, data) if key in source), None)


def problem_entry(record: dict[str, Any], show_state: StateShower | None = None) -> dict[str, Any]:
    nodes, steps = tree_nodes(record, show_state)
    entry: dict[str, Any] = {
        "prediction": record.get("prediction"), "gold": _gold(record),
        "correct": record.get("correct"), "score": record.get("score"), "wall_s": record.get("wall_s"),
        "value": record.get("best_value"), "answer": record.get("answer_completion"),
        "stats": record.get("stats"), "nodes": nodes, "steps": steps, "missing": missing_fields(record),
        "work": isinstance(record.get("node_work"), list),  # node counters and replies were recorded
    }
    votes = next((st.get("votes") for st in record.get("steps") or [] if isinstance(st, dict) and "votes" in st), None)
    if isinstance(votes, dict):  # CoT-SC: each prediction's count
        entry["votes"] = votes
    if "error" in record:
        entry["error"] = str(record["error"])
    return entry


def _node_key(node: dict[str, Any]) -> tuple:
    return node["t"], node["v"], node["k"] is None


def mark_differences(entries: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Compare each run's tree with the first run's, node by node (same step, same candidate);
    mark differing nodes (`d`) in both and return where the runs part, or None when they agree."""
    base = entries[0]
    if base is None or sum(e is not None for e in entries) < 2:
        return None
    first_step: int | None = None
    differs = False
    for other in entries[1:]:
        if other is None:
            continue
        theirs = {(n["s"], n["i"]): n for n in other["nodes"]}
        ours = {(n["s"], n["i"]): n for n in base["nodes"]}
        for key in sorted(set(theirs) | set(ours)):
            a, b = ours.get(key), theirs.get(key)
            if a is not None and b is not None and _node_key(a) == _node_key(b):
                continue
            for node in (a, b):
                if node is not None:
                    node["d"] = 1
            first_step = key[0] if first_step is None else min(first_step, key[0])
        differs = differs or first_step is not None or other["prediction"] != base["prediction"]
    if not differs:
        return None
    return {"first_step": first_step, "predictions_differ": len({json.dumps(e["prediction"]) for e in entries
                                                                 if e is not None}) > 1}


def build_page_data(runs: Sequence[Run], show_state: StateShower | None = None) -> dict[str, Any]:
    """Everything the page shows, JSON-ready: runs' headers, then problems in the first run's order."""
    order: dict[str, None] = {}  # problem ids, first run's order first (a dict keeps insertion order)
    by_run: list[dict[str, dict]] = []
    for run in runs:
        records = {str(r["id"]): r for r in run.records}
        by_run.append(records)
        order.update(dict.fromkeys(records))
    problems = []
    for pid in order:
        records = [r.get(pid) for r in by_run]
        first = next(r for r in records if r is not None)
        entries = [None if r is None else problem_entry(r, show_state) for r in records]
        problems.append({"id": pid, "q": question_text(first.get("input")), "runs": entries,
                         "diff": mark_differences(entries) if len(runs) > 1 else None})
    headers = [run_header(run) for run in runs]
    greedy = [h["temperature"] == 0 for h in headers]
    return {"runs": headers, "problems": problems, "greedy": len(runs) > 1 and all(greedy),
            "work_fields": list(WORK_FIELDS), "format": 1}
