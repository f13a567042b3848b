"""Monte Carlo tree search with UCT over the `Task` protocol (after RAP / llm-reasoners).

Every iteration selects up to m leaves (`parallel_leaves`) and expands them together:

    select:    from the root, follow the child of highest UCT
                   Q(c) + exploration * sqrt(ln N(parent) / (N(c) + 1))
               (Q: mean reward of c's visits; a child never visited has its own reward) down to a
               node without children; each selected path takes a virtual loss (a visit of reward
               0) so the next selection of the same iteration leans elsewhere
    expand:    n thoughts of every selected open leaf in ONE engine call, their values in ONE more
               (so each call carries rows of m leaves: one row at a time no engine can batch)
    backprop:  a leaf's reward (its best child's, or its own when final) is added along its path

A node's reward is the task's value of its state mapped to [0, 1] by the task's `value_range`
(lo, hi) when it has one (the raw value otherwise); final states (is_final, or the depth
reached) are not expanded, their own reward is backed up. The answer is written from the path
that follows the most visited child (or, with answer="value", the highest mean reward) from the
root. Ties go to the earlier child everywhere, so a search is deterministic for a seed.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from .expansion import SearchResult, evaluate_states, generate_thoughts, state_to_json, task_is_final, write_answer
from .llm import LLMCaller
from .protocol import Example, SearchConfig, State, Task

log = logging.getLogger(__name__)

ANSWER_CHOICES = ("visits", "value")


@dataclass(frozen=True)
class MCTSConfig:
    iterations: int = 10
    exploration: float = 1.0
    parallel_leaves: int = 1
    answer: str = "visits"

    def __post_init__(self) -> None:
        if self.iterations < 1 or self.parallel_leaves < 1:
            raise ValueError(f"iterations and parallel_leaves must be at least 1, got {self.iterations}, "
                             f"{self.parallel_leaves}")
        if self.exploration < 0:
            raise ValueError(f"exploration must be >= 0, got {self.exploration}")
        if self.answer not in ANSWER_CHOICES:
            raise ValueError(f"answer must be one of {', '.join(ANSWER_CHOICES)}, got {self.answer!r}")


@dataclass(eq=False)
class Node:
    state: State
    parent: "Node | None" = None
    reward: float = 0.0  # the task's normalised value of this state
    value: float | None = None  # the task's raw value (None: the root)
    final: bool = False
    children: list["Node"] = field(default_factory=list)
    visits: int = 0
    total: float = 0.0  # sum of backed-up rewards
    virtual: int = 0  # virtual losses of the selections in flight
    step: int | None = None  # the tree record's step that expanded this node

    def q(self) -> float:
        n = self.visits + self.virtual
        return self.total / n if n else self.reward

    def mean(self) -> float:
        return self.total / self.visits if self.visits else self.reward

    def path(self) -> list["Node"]:
        node, path = self, []
        while node is not None:
            path.append(node)
            node = node.parent
        return path[::-1]


def normalise(task: Task, value: float) -> float:
    """The task's value in [0, 1] by its `value_range` (lo, hi); the value as it is without one."""
    bounds = getattr(task, "value_range", None)
    if bounds is None:
        return value
    lo, hi = bounds
    return min(max((value - lo) / (hi - lo), 0.0), 1.0)


class MonteCarloTreeSearch:
    def __init__(self, caller: LLMCaller, task: Task, example: Example, config: SearchConfig, mcts: MCTSConfig):
        self.caller, self.task, self.example, self.config, self.mcts = caller, task, example, config, mcts
        self.root = Node(State())
        self.root.final = self.is_final(self.root.state)
        self.steps: list[dict] = []

    def is_final(self, state: State) -> bool:
        return state.depth >= self.config.depth or task_is_final(self.task, self.example, state)

    def uct(self, parent: Node, child: Node) -> float:
        n_parent = parent.visits + parent.virtual
        explore = math.sqrt(math.log(n_parent) / (child.visits + child.virtual + 1)) if n_parent > 0 else 0.0
        return child.q() + self.mcts.exploration * explore

    def select(self) -> Node:
        node = self.root
        while node.children:
            node = max(node.children, key=lambda c: self.uct(node, c))  # max keeps the first of equals
        return node

    def select_leaves(self) -> list[Node]:
        """Up to m distinct leaves, each path taking a virtual loss until backprop."""
        leaves: list[Node] = []
        for _ in range(self.mcts.parallel_leaves):
            leaf = self.select()
            if leaf in leaves:
                break  # every path leads to a leaf already in flight: expand what we have
            leaves.append(leaf)
            for node in leaf.path():
                node.virtual += 1
        return leaves

    def expand(self, leaves: list[Node], iteration: int) -> None:
        """The open leaves' thoughts in one call, every child's value in one call."""
        if not leaves:
            return
        n = self.config.n_generate
        thoughts, states = generate_thoughts(self.caller, self.task, self.example, [l.state for l in leaves], n)
        values = evaluate_states(self.caller, self.task, self.example, states)
        for j, leaf in enumerate(leaves):
            rows = range(j * n, (j + 1) * n)
            seen: set[State] = set()
            kept: list[int] = []
            for i, row in enumerate(rows):
                if states[row] in seen:
                    continue  # a repeated thought is one child, not two
                seen.add(states[row])
                kept.append(i)
                leaf.children.append(Node(states[row], leaf, reward=normalise(self.task, values[row]),
                                          value=values[row], final=self.is_final(states[row])))
            leaf.step = len(self.steps)
            self.steps.append({
                "step": leaf.step, "iteration": iteration, "depth": leaf.state.depth,
                "frontier": [state_to_json(leaf.state)],
                "thoughts": [thoughts[r] for r in rows], "parents": [0] * n,
                "new_states": [state_to_json(states[r]) for r in rows],
                "values": [values[r] for r in rows],
                "kept": kept,  # the children made (a repeat is not); re-ranked by visits at the end
            })

    def backpropagate(self, leaf: Node) -> None:
        reward = max(c.reward for c in leaf.children) if leaf.children else leaf.reward
        for node in leaf.path():
            node.virtual -= 1
            node.visits += 1
            node.total += reward

    def run(self) -> Node:
        for iteration in range(self.mcts.iterations):
            if self.root.final:
                break
            leaves = self.select_leaves()
            self.expand([leaf for leaf in leaves if not leaf.final], iteration)
            for leaf in leaves:
                self.backpropagate(leaf)
            log.debug("iteration %d: %d leaves, %d expansions so far", iteration, len(leaves), len(self.steps))
        self.record_statistics()
        return self.best_leaf()

    def best_leaf(self) -> Node:
        if self.mcts.answer == "visits":
            key = lambda c: (c.visits, c.mean())  # noqa: E731
        else:
            key = lambda c: c.mean()  # noqa: E731
        node = self.root
        while node.children:
            node = max(node.children, key=key)
        return node

    def record_statistics(self) -> None:
        """Each step's children's visits and mean rewards, and "kept" ranked by visits."""
        for node in self._expanded():
            step = self.steps[node.step]
            by_row = {i: child for i, child in zip(step["kept"], node.children)}
            step["visits"] = [by_row[i].visits if i in by_row else 0 for i in range(len(step["thoughts"]))]
            step["mean_values"] = [round(by_row[i].mean(), 6) if i in by_row else None
                                   for i in range(len(step["thoughts"]))]
            step["kept"] = sorted(by_row, key=lambda i: -by_row[i].visits)

    def _expanded(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.step is not None:
                out.append(node)
            stack.extend(node.children)
        return out


def mcts(caller: LLMCaller, task: Task, example: Example, config: SearchConfig,
         settings: MCTSConfig | None = None) -> SearchResult:
    search = MonteCarloTreeSearch(caller, task, example, config, settings or MCTSConfig())
    best = search.run()
    answer, prediction = write_answer(caller, task, example, best.state)
    return SearchResult(prediction=prediction, state=best.state, answer=answer, value=best.value,
                        steps=search.steps, expanded=len(search.steps))
