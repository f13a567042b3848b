"""Blocksworld planning (PlanBench's 6-step instances) as a tree-of-thoughts task.

A thought is one action; the state is the plan so far (canonical PlanBench English, one action
per thought). Each step samples n candidate next actions for every kept plan, the model judges
each new last action "good" or "bad", and the search keeps the best plans. The simulator in
`blocksworld_sim` parses actions, scores plans and, through `prior_value`, lets the search drop
illegal plans without asking the model.
"""
from __future__ import annotations

import functools
import logging
import random
import re
from typing import Any

from seed_tot.prompts import task_prompts
from seed_tot.search.protocol import Example, Prompt, SearchConfig, State

from .blocksworld_sim import (BlocksProblem, PddlError, describe_goal, describe_state, find_action,
                              parse_problem, random_instance, validate_plan)
from .loading import load_records, type_name

log = logging.getLogger(__name__)

# The evaluator's verdicts on SearchConfig's 1-10 scale: an unreadable reply sits at the DFS
# threshold (5) so it is neither preferred nor pruned; an illegal plan (prior_value) is below all.
VALUE_GOOD, VALUE_UNSURE, VALUE_BAD, VALUE_ILLEGAL = 10.0, 5.0, 1.0, 0.0

# A thought naming no action still becomes a state (the search must see what was sampled), marked
# so that it is never legal, never final and is shown back to the model without the mark.
UNPARSED = "[unparsed] "

REQUIRED_PROMPTS = ("domain", "statement", "plan_header", "plan_end", "demonstration", "thought_user",
                    "answer_user", "value_user", "value_case", "value_prefix", "no_steps", "value_demonstrations")
_PLAN_END = re.compile(r"\[\s*plan\s+end\s*\]", re.IGNORECASE)
_MARKERS = {"[plan]", "[plan end]"}


# Per-call token budgets (config.extra); an action or a verdict is one short line.
DEFAULT_BUDGETS = {"action_max_new_tokens": 32, "value_max_new_tokens": 8}


def default_config() -> SearchConfig:
    return SearchConfig(depth=6, n_generate=3, breadth=1, temperature=1.0,
                        max_new_tokens=6 * DEFAULT_BUDGETS["action_max_new_tokens"], extra=dict(DEFAULT_BUDGETS))


@functools.lru_cache(maxsize=4096)
def _parse(problem_pddl: str) -> BlocksProblem:
    return parse_problem(problem_pddl)


class Blocksworld:
    """Blocksworld for the ToT search.

    depth 6: the SEED paper's tree for 6-step Blocksworld has 7 levels, 6 actions and then the
    answer; `SearchConfig.depth` counts only the thought steps before the answer, so a plan has
    at most 6 actions. n_generate 3 candidate actions per kept state; breadth 1 unless a config
    in configs/ overrides it. Token budgets come from the run's config: an action (thought) takes
    `extra.action_max_new_tokens` (32: one line), a verdict `extra.value_max_new_tokens` (8), the
    answer one action budget per missing action; `max_new_tokens` caps them all (the search
    caps every call at it), so its default is the whole plan's budget, 6 x 32.
    """

    name = "blocksworld"
    value_range = (VALUE_ILLEGAL, VALUE_GOOD)  # MCTS maps values to [0, 1] by it

    def __init__(self, config: SearchConfig | None = None, prompts: dict[str, Any] | None = None, *,
                 n_random: int = 10, n_blocks: int = 4, plan_length: int = 6, seed: int = 0):
        self.config = config or default_config()
        self.prompts = task_prompts("blocksworld", prompts, REQUIRED_PROMPTS)
        # What `load(None)` generates: fixed so that a run without data is reproducible.
        self.n_random, self.n_blocks, self.plan_length, self.seed = n_random, n_blocks, plan_length, seed

    # --- data -----------------------------------------------------------------------------

    @property
    def default_data(self) -> str:
        """What load(None) solves, in words (`seed-tot tasks`)."""
        return (f"{self.n_random} random {self.n_blocks}-block instances with {self.plan_length}-action optimal "
                f"plans, generated from seed {self.seed}")

    def load(self, path: str | None = None, limit: int | None = None, offset: int = 0) -> list[Example]:
        """Records `{"id", "problem_pddl", "gold_plan"?}` from a JSONL file; with no path, random
        instances whose optimal plan has `plan_length` actions (there is no Hub dataset)."""
        if path is None:
            records = self.random_records()
            records = records[offset:None if limit is None else offset + limit]
        else:
            records = load_records(path, required=("problem_pddl",), limit=limit, offset=offset,
                                   check=_check_record)
        return [Example(id=record["id"], data=record) for record in records]

    def default_data_source(self) -> dict[str, Any]:
        """What `load(None)` reads, as run.json records it (a resume must generate the same instances)."""
        return {"generator": "blocksworld.random_instance", "seed": self.seed, "n_random": self.n_random,
                "n_blocks": self.n_blocks, "plan_length": self.plan_length}

    def random_records(self) -> list[dict[str, Any]]:
        rng = random.Random(self.seed)
        records = []
        for i in range(self.n_random):
            problem, plan = random_instance(self.n_blocks, self.plan_length, rng)
            records.append({"id": f"random-{i}", "problem_pddl": problem, "gold_plan": plan,
                            "optimal_length": len(plan)})
        log.info("generated %d random %d-block instances (seed %d)", len(records), self.n_blocks, self.seed)
        return records

    # --- prompts --------------------------------------------------------------------------

    def _statement(self, problem: BlocksProblem) -> str:
        return self.prompts["statement"].format(init=describe_state(problem.init),
                                                goal=describe_goal(problem.goal))

    def _demonstration(self) -> str:
        demo = self.prompts["demonstration"]
        plan = "\n".join(demo["plan"])
        return (f"{self._statement(_parse(demo['problem_pddl']))}\n\n{self.prompts['plan_header']}\n"
                f"{plan}\n{self.prompts['plan_end']}")

    def _plan_so_far(self, state: State) -> str:
        return "".join(f"{_shown(t)}\n" for t in state.thoughts)

    def thought_prompt(self, example: Example, state: State) -> Prompt:
        p = self.prompts
        user = p["thought_user"].format(domain=p["domain"], demonstration=self._demonstration(),
                                        statement=self._statement(_problem(example)))
        return Prompt(user, f"{p['plan_header']}\n{self._plan_so_far(state)}",
                      stop=("\n", p["plan_end"]), max_new_tokens=self._tokens("action_max_new_tokens"))

    def value_prompt(self, example: Example, state: State) -> Prompt:
        p = self.prompts
        demos = []
        for demo in p["value_demonstrations"]:
            case = self._case(_parse(demo["problem_pddl"]), list(demo["steps"]), demo["last"])
            demos.append(f"{case}\n{p['value_prefix']} {demo['verdict']}")
        thoughts = [_shown(t) for t in state.thoughts]
        case = self._case(_problem(example), thoughts[:-1], thoughts[-1] if thoughts else p["no_steps"])
        user = p["value_user"].format(domain=p["domain"], demonstrations="\n\n".join(demos), case=case)
        return Prompt(user, p["value_prefix"], stop=("\n\n", "[STATEMENT]"),
                      max_new_tokens=self._tokens("value_max_new_tokens"))

    def _case(self, problem: BlocksProblem, steps: list[str], last: str) -> str:
        return self.prompts["value_case"].format(
            init=describe_state(problem.init), goal=describe_goal(problem.goal),
            steps="\n".join(steps) or self.prompts["no_steps"], last=last)

    def answer_prompt(self, example: Example, state: State) -> Prompt:
        p = self.prompts
        user = p["answer_user"].format(domain=p["domain"], demonstration=self._demonstration(),
                                       statement=self._statement(_problem(example)), plan_end=p["plan_end"])
        # A finished plan needs nothing more from the model: one token keeps that call cheap.
        missing = self.config.depth - state.depth
        budget = 1 if self.is_final(example, state) else self._tokens("action_max_new_tokens") * missing
        return Prompt(user, f"{p['plan_header']}\n{self._plan_so_far(state)}", stop=(p["plan_end"],),
                      max_new_tokens=budget)

    def _tokens(self, key: str) -> int:
        return int(self.config.extra.get(key, DEFAULT_BUDGETS[key]))

    # --- the tree -------------------------------------------------------------------------

    def extend(self, state: State, thought: str) -> State:
        """Append the first action named in `thought` (before any [PLAN END]) in canonical
        English; with none, append the thought's first line marked UNPARSED."""
        text = _PLAN_END.split(thought, maxsplit=1)[0]
        action = find_action(text)
        if action is not None:
            return State(state.thoughts + (action.to_text(),))
        # Keep only text before [PLAN END], so the scorer cannot find an action in it later either.
        first = next((line.strip() for line in text.splitlines() if line.strip()), "(no action)")
        log.debug("no action in thought %r", thought)
        return State(state.thoughts + (UNPARSED + first[:120],))

    def parse_value(self, text: str) -> float:
        """good -> 10, bad -> 1 (the first verdict word counts; "not good" is bad, "not bad" good), else 5."""
        m = re.search(r"\b(not\s+good|not\s+bad|good|bad)\b", text.lower())
        if m is None:
            return VALUE_UNSURE
        return VALUE_GOOD if m.group(1) in ("good", "not bad") else VALUE_BAD

    def prior_value(self, example: Example, state: State) -> float | None:
        """VALUE_ILLEGAL (0) for a plan with an unreadable or illegal action, so the search can
        drop it without a model call (`seed_tot.search.expansion.evaluate_states` uses this);
        None otherwise: the model judges legal plans."""
        if state.depth == 0:
            return None
        return None if validate_plan(_problem(example), state.thoughts).valid else VALUE_ILLEGAL

    def is_final(self, example: Example, state: State) -> bool:
        """The goal is reached by a legal plan, or the plan has `config.depth` (6) actions."""
        if state.depth >= self.config.depth:
            return True
        check = validate_plan(_problem(example), state.thoughts)
        return check.valid and check.reaches_goal

    def prediction(self, example: Example, state: State, answer: str) -> str:
        """The plan, one action per line: the state's actions, then (when they do not reach the
        goal yet) the actions the answer call wrote, up to `config.depth` actions in all."""
        plan = [_shown(t) for t in state.thoughts]
        if not self.is_final(example, state):
            for line in _PLAN_END.split(answer, maxsplit=1)[0].splitlines():
                if len(plan) >= self.config.depth:
                    break
                action = find_action(line)
                if action is not None:
                    plan.append(action.to_text())
                elif line.strip():
                    break  # prose after the plan: the plan is over
        return "\n".join(plan)

    def score(self, example: Example, prediction: str) -> dict[str, Any]:
        """A plan, one action per line, English or PDDL; blank lines and [PLAN]/[PLAN END] are
        skipped. correct = every action legal and the goal reached (any length)."""
        lines = [ln.strip() for ln in prediction.splitlines()]
        actions = [find_action(ln) or ln for ln in lines if ln and ln.lower() not in _MARKERS]
        check = validate_plan(_problem(example), actions)
        return {"correct": check.valid and check.reaches_goal, "valid": check.valid,
                "reaches_goal": check.reaches_goal}


def _problem(example: Example) -> BlocksProblem:
    return _parse(example.data["problem_pddl"])


def _shown(thought: str) -> str:
    """A thought as the model and the scorer see it (without the UNPARSED mark)."""
    return thought[len(UNPARSED):] if thought.startswith(UNPARSED) else thought


def _check_record(record: dict[str, Any]) -> None:
    """A problem the simulator can read (load_records names the file and line of one it cannot)."""
    try:
        if not isinstance(record["problem_pddl"], str):
            raise PddlError(f"problem_pddl must be a string, got {type_name(record['problem_pddl'])}")
        _parse(record["problem_pddl"])
    except PddlError as err:
        raise ValueError(f"malformed problem_pddl: {err}") from None
