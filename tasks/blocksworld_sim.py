"""A pure-Python simulator of the 4-operator Blocksworld (PlanBench's `blocksworld-4ops` domain).

Scoring needs an exact plan checker, and the search uses the same checker to drop illegal
branches; this needs no planner or VAL binary. Semantics follow `domain.pddl` exactly; English
follows PlanBench, in which the objects a, b, c, ... are the red, blue, orange, ... block.
"""
from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass
from typing import Sequence

log = logging.getLogger(__name__)

COLORS = tuple("red blue orange yellow white magenta black cyan green violet silver gold".split())
OBJECTS = "abcdefghijkl"  # PlanBench names object OBJECTS[i] after COLORS[i]
ARITY = {"pick-up": 1, "put-down": 1, "stack": 2, "unstack": 2}
PREDICATES = {"clear": 1, "ontable": 1, "handempty": 0, "holding": 1, "on": 2}

Fact = tuple[str, ...]  # ("on", "a", "b"), ("handempty",), ...


class PddlError(ValueError):
    """A problem string that is not a well-formed, consistent Blocksworld problem."""


class ActionParseError(ValueError):
    """Text that names no Blocksworld action."""


class IllegalAction(ValueError):
    """An action whose preconditions do not hold in the state it is applied to."""


@dataclass(frozen=True)
class BlocksState:
    """A complete configuration. Only `on`, `on_table` and `holding` are stored; `clear` and
    `arm_empty` are derived, so two equal configurations always compare (and hash) equal."""

    blocks: tuple[str, ...]
    on: frozenset[tuple[str, str]] = frozenset()  # (upper, lower)
    on_table: frozenset[str] = frozenset()
    holding: str | None = None

    @property
    def arm_empty(self) -> bool:
        return self.holding is None

    @property
    def clear(self) -> frozenset[str]:
        covered = {lower for _, lower in self.on}
        return frozenset(b for b in self.blocks if b not in covered and b != self.holding)

    def below(self, block: str) -> str | None:
        return next((lower for upper, lower in self.on if upper == block), None)

    def facts(self) -> frozenset[Fact]:
        facts: set[Fact] = {("clear", b) for b in self.clear}
        facts |= {("ontable", b) for b in self.on_table}
        facts |= {("on", x, y) for x, y in self.on}
        facts.add(("handempty",) if self.holding is None else ("holding", self.holding))
        return frozenset(facts)

    def satisfies(self, goal: frozenset[Fact]) -> bool:
        return goal <= self.facts()


@dataclass(frozen=True)
class BlocksProblem:
    name: str
    init: BlocksState
    goal: frozenset[Fact]


@dataclass(frozen=True)
class Action:
    name: str  # one of ARITY
    args: tuple[str, ...]

    def to_pddl(self) -> str:
        return f"({self.name} {' '.join(self.args)})"

    def to_text(self) -> str:
        """PlanBench's natural-language form, e.g. 'unstack the blue block from on top of the red block'."""
        return _ACTION_TEXT[self.name].format(*(block_name(a) for a in self.args))


_ACTION_TEXT = {"pick-up": "pick up {0}", "put-down": "put down {0}", "stack": "stack {0} on top of {1}",
                "unstack": "unstack {0} from on top of {1}"}


@dataclass(frozen=True)
class PlanCheck:
    valid: bool  # every action parsed and was applicable
    reaches_goal: bool  # valid and the final state satisfies the goal
    first_illegal: int | None  # 0-based index of the first bad action
    reason: str | None
    final_state: BlocksState  # the state before the first bad action when invalid


def block_name(obj: str) -> str:
    i = OBJECTS.find(obj)
    return f"the {COLORS[i]} block" if len(obj) == 1 and i >= 0 else f"the {obj} block"


# --- PDDL problems --------------------------------------------------------------------------

def _sexp(text: str) -> list:
    text = re.sub(r";[^\n]*", "", text)  # PDDL comments
    tokens = re.findall(r"\(|\)|[^\s()]+", text.lower())
    stack: list[list] = [[]]
    for tok in tokens:
        if tok == "(":
            stack.append([])
        elif tok == ")" and len(stack) == 1:
            raise PddlError("unbalanced ')'")
        elif tok == ")":
            stack[-2].append(stack.pop())
        else:
            stack[-1].append(tok)
    if len(stack) != 1:
        raise PddlError("unbalanced '(' (missing ')')")
    forms = [f for f in stack[0] if isinstance(f, list)]
    if len(forms) != 1 or not forms[0] or forms[0][0] != "define":
        raise PddlError("expected one (define (problem ...) ...) form")
    return forms[0]


def _fact(form, objects: set[str], where: str) -> Fact:
    if not isinstance(form, list) or not form or any(isinstance(t, list) for t in form):
        raise PddlError(f"{where}: expected an atom like (on a b), got {form!r}")
    pred, args = form[0], tuple(form[1:])
    if pred not in PREDICATES:
        raise PddlError(f"{where}: unknown predicate {pred!r}")
    if len(args) != PREDICATES[pred]:
        raise PddlError(f"{where}: ({pred} ...) takes {PREDICATES[pred]} argument(s), got {len(args)}")
    if unknown := [a for a in args if a not in objects]:
        raise PddlError(f"{where}: unknown object(s) {', '.join(unknown)}")
    return (pred, *args)


def parse_problem(text: str) -> BlocksProblem:
    """Parse a PDDL problem; raise PddlError when it is malformed or its init is inconsistent."""
    define = _sexp(text)
    sections = {f[0]: f[1:] for f in define[1:] if isinstance(f, list) and f and isinstance(f[0], str)}
    name = sections.get("problem", ["?"])[0]
    if missing := [key for key in (":objects", ":init", ":goal") if key not in sections]:
        raise PddlError(f"missing section(s) {', '.join(missing)}")
    tokens = sections[":objects"]
    # typed lists ("a b - block") name a type after each "-": drop it
    objects = [o for i, o in enumerate(tokens) if isinstance(o, str) and o != "-"
               and not (i > 0 and tokens[i - 1] == "-")]
    if not objects or len(set(objects)) != len(objects):
        raise PddlError("(:objects ...) must list distinct objects")
    known = set(objects)
    init = frozenset(_fact(f, known, "(:init)") for f in sections[":init"])
    if len(sections[":goal"]) != 1:
        raise PddlError("(:goal ...) must hold one (and ...) or one atom")
    form = sections[":goal"][0]
    atoms = form[1:] if isinstance(form, list) and form[:1] == ["and"] else [form]
    goal = frozenset(_fact(f, known, "(:goal)") for f in atoms)
    if not goal:
        raise PddlError("(:goal ...) is empty")
    return BlocksProblem(str(name), _state_from_facts(tuple(sorted(known)), init), goal)


def _state_from_facts(blocks: tuple[str, ...], facts: frozenset[Fact]) -> BlocksState:
    on = frozenset((f[1], f[2]) for f in facts if f[0] == "on")
    table = frozenset(f[1] for f in facts if f[0] == "ontable")
    held = [f[1] for f in facts if f[0] == "holding"]
    if len(held) > 1:
        raise PddlError("(:init) holds more than one block")
    state = BlocksState(blocks, on, table, held[0] if held else None)
    # STRIPS would silently accept contradictions (a block on two blocks, a missing clear);
    # a state that is not a real configuration would make plan checks meaningless, so refuse it.
    for b in blocks:
        places = (b in table) + sum(1 for x, _ in on if x == b) + (b == state.holding)
        if places != 1:
            raise PddlError(f"(:init) puts block {b} in {places} places (on the table, on a block or held)")
        if sum(1 for _, y in on if y == b) > 1:
            raise PddlError(f"(:init) has more than one block on {b}")
        seen, cur = set(), b
        while cur is not None:  # every tower must end on the table or in the hand, not in a loop
            if cur in seen:
                raise PddlError(f"(:init) has a cycle of on facts through {b}")
            seen.add(cur)
            cur = state.below(cur)
    if state.facts() != facts:
        wrong = sorted(state.facts() ^ facts)
        raise PddlError(f"(:init) clear/handempty facts disagree with the towers: {wrong}")
    return state


def render_problem(problem: BlocksProblem) -> str:
    """PDDL text in PlanBench's layout."""
    init = sorted(problem.init.facts(), key=lambda f: (f[0] != "handempty", f[1:], f[0]))
    goal = "\n".join(f"({' '.join(f)})" for f in sorted(problem.goal))
    return (f"(define (problem {problem.name})\n(:domain blocksworld-4ops)\n"
            f"(:objects {' '.join(problem.init.blocks)} )\n(:init\n"
            + "".join(f"({' '.join(f)})\n" for f in init)
            + f")\n(:goal\n(and\n{goal})\n)\n)\n")


# --- actions: parsing and applying ----------------------------------------------------------

# "a"/"an" before a colour is the article ("a blue block"), not block a; "block c" names block c
_BLOCK = (r"(?:the\s+|an?\s+(?=(?:" + "|".join(COLORS) + r")\b))?(?:block\s+(?=[a-z]\b))?(?P<{g}>"
          + "|".join(COLORS) + r"|[a-z])\b(?:\s+block\b)?")
_NL_PATTERNS = (
    ("unstack", re.compile(r"\bunstack\s+" + _BLOCK.format(g="x")
                           + r"\s+(?:from\s+)?(?:on\s+)?(?:top\s+)?(?:of\s+)?" + _BLOCK.format(g="y"))),
    ("stack", re.compile(r"\bstack\s+" + _BLOCK.format(g="x")
                         + r"\s+(?:on\s+|onto\s+)?(?:top\s+)?(?:of\s+)?" + _BLOCK.format(g="y"))),
    ("pick-up", re.compile(r"\bpick(?:\s+|-)?up\s+" + _BLOCK.format(g="x"))),
    ("put-down", re.compile(r"\bput(?:\s+|-)?down\s+" + _BLOCK.format(g="x"))),
)
_PDDL_ACTION = re.compile(r"\(\s*(pick-up|put-down|stack|unstack)((?:\s+[\w-]+)*)\s*\)")
_COLOR_TO_OBJECT = dict(zip(COLORS, OBJECTS))


def _normalise(text: str) -> str:
    text = " ".join(text.lower().split())
    text = re.sub(r"^(?:\d+\s*[.):]|[-*\u2022])\s*", "", text)  # list numbering or bullets
    return text.rstrip(" .")


def _matches(text: str):
    """(start, end, Action) for every action mention found in normalised text."""
    found = []
    for m in _PDDL_ACTION.finditer(text):
        args = tuple(m.group(2).split())
        if len(args) == ARITY[m.group(1)]:
            found.append((m.start(), m.end(), Action(m.group(1), args)))
    for name, pattern in _NL_PATTERNS:
        for m in pattern.finditer(text):
            args = tuple(_COLOR_TO_OBJECT.get(m.group(g), m.group(g)) for g in ("x", "y")[:ARITY[name]])
            found.append((m.start(), m.end(), Action(name, args)))
    return sorted(found, key=lambda t: (t[0], -t[1]))


def parse_action(text: str) -> Action:
    """One action, PDDL ("(unstack b a)") or PlanBench English ("unstack the blue block from on
    top of the red block"); case, a trailing period, list numbering and 'the' are tolerated."""
    norm = _normalise(text)
    for start, end, action in _matches(norm):
        if start == 0 and end == len(norm):
            return action
    raise ActionParseError(f"not a Blocksworld action: {text!r}")


def find_action(text: str) -> Action | None:
    """The first action mentioned anywhere in `text` (e.g. a model's chatty reply), or None."""
    return found[0][2] if (found := _matches(_normalise(text))) else None


def why_illegal(state: BlocksState, action: Action) -> str | None:
    """None when `action` is applicable in `state`, else the violated precondition in words."""
    if unknown := [a for a in action.args if a not in state.blocks]:
        return f"there is no block {', '.join(unknown)} in this problem"
    x = action.args[0]
    if action.name in ("pick-up", "unstack") and not state.arm_empty:
        return "the hand is not empty"
    if action.name in ("put-down", "stack") and state.holding != x:
        return f"the hand is not holding {block_name(x)}"
    if action.name in ("pick-up", "unstack") and x not in state.clear:
        return f"{block_name(x)} is not clear"
    if action.name == "pick-up" and x not in state.on_table:
        return f"{block_name(x)} is not on the table"
    if action.name == "unstack" and (x, action.args[1]) not in state.on:
        return f"{block_name(x)} is not on top of {block_name(action.args[1])}"
    if action.name == "stack" and action.args[1] not in state.clear:
        return f"{block_name(action.args[1])} is not clear"
    return None


def apply(state: BlocksState, action: Action | str) -> BlocksState:
    """The successor state; raises IllegalAction (or ActionParseError for unreadable text)."""
    action = parse_action(action) if isinstance(action, str) else action
    reason = why_illegal(state, action)
    if reason is not None:
        raise IllegalAction(f"{action.to_text()}: {reason}")
    x = action.args[0]
    if action.name == "pick-up":
        return BlocksState(state.blocks, state.on, state.on_table - {x}, x)
    if action.name == "unstack":
        return BlocksState(state.blocks, state.on - {(x, action.args[1])}, state.on_table, x)
    if action.name == "put-down":
        return BlocksState(state.blocks, state.on, state.on_table | {x}, None)
    return BlocksState(state.blocks, state.on | {(x, action.args[1])}, state.on_table, None)


def validate_plan(problem: BlocksProblem | str, actions: Sequence[Action | str]) -> PlanCheck:
    """Run `actions` from the initial state and stop at the first unreadable or illegal one."""
    problem = parse_problem(problem) if isinstance(problem, str) else problem
    state = problem.init
    for i, action in enumerate(actions):
        try:
            state = apply(state, action)
        except (IllegalAction, ActionParseError) as err:
            return PlanCheck(False, False, i, str(err), state)
    return PlanCheck(True, state.satisfies(problem.goal), None, None, state)


# --- search ---------------------------------------------------------------------------------

def successors(state: BlocksState) -> list[tuple[Action, BlocksState]]:
    if state.holding is not None:
        h = state.holding
        moves = [Action("put-down", (h,))] + [Action("stack", (h, y)) for y in sorted(state.clear)]
    else:
        moves = [Action("pick-up", (x,)) if x in state.on_table else Action("unstack", (x, state.below(x)))
                 for x in sorted(state.clear)]
    return [(a, apply(state, a)) for a in moves]


def optimal_plan(problem: BlocksProblem, max_length: int | None = None) -> list[Action] | None:
    """A shortest plan by breadth-first search over states; None if none within max_length."""
    parent: dict[BlocksState, tuple[BlocksState, Action] | None] = {problem.init: None}
    frontier, depth = [problem.init], 0
    while frontier:
        for state in frontier:
            if state.satisfies(problem.goal):
                plan = []
                while parent[state] is not None:
                    state, action = parent[state]
                    plan.append(action)
                return plan[::-1]
        if max_length is not None and depth >= max_length:
            return None
        nxt = []
        for state in frontier:
            for action, child in successors(state):
                if child not in parent:
                    parent[child] = (state, action)
                    nxt.append(child)
        frontier, depth = nxt, depth + 1
    return None


def _random_towers(blocks: Sequence[str], rng: random.Random) -> BlocksState:
    order = list(blocks)
    rng.shuffle(order)
    towers: list[list[str]] = []
    for b in order:  # each block starts a new tower or goes on top of a random one
        k = rng.randrange(len(towers) + 1)
        if k == len(towers):
            towers.append([])
        towers[k].append(b)
    on = frozenset((t[i + 1], t[i]) for t in towers for i in range(len(t) - 1))
    return BlocksState(tuple(sorted(blocks)), on, frozenset(t[0] for t in towers))


def random_instance(n_blocks: int, plan_length: int, rng: random.Random,
                    max_tries: int = 20000) -> tuple[str, list[str]]:
    """(problem PDDL, one optimal plan as PDDL actions) whose BFS-optimal length is exactly
    `plan_length`: random towers for init and goal, rejected until the optimum fits. Like
    PlanBench, the goal is a non-empty subset of the goal towers' `on` facts."""
    if not 1 <= n_blocks <= len(OBJECTS):
        raise ValueError(f"n_blocks must be in 1..{len(OBJECTS)}, got {n_blocks}")
    blocks = OBJECTS[:n_blocks]
    for attempt in range(1, max_tries + 1):
        init = _random_towers(blocks, rng)
        on_facts = sorted(_random_towers(blocks, rng).on)
        if not on_facts:
            continue
        goal = frozenset(("on", x, y) for x, y in rng.sample(on_facts, rng.randint(1, len(on_facts))))
        problem = BlocksProblem(f"BW-rand-{n_blocks}", init, goal)
        plan = optimal_plan(problem, max_length=plan_length)
        if plan is not None and len(plan) == plan_length:
            log.debug("random_instance: accepted after %d tries", attempt)
            return render_problem(problem), [a.to_pddl() for a in plan]
    raise ValueError(f"no {n_blocks}-block instance with an optimal plan of {plan_length} in {max_tries} tries")


# --- natural language -----------------------------------------------------------------------

_FACT_TEXT = {"handempty": "the hand is empty", "holding": "the hand is holding {0}", "clear": "{0} is clear",
              "ontable": "{0} is on the table", "on": "{0} is on top of {1}"}


def _fact_text(fact: Fact) -> str:
    return _FACT_TEXT[fact[0]].format(*(block_name(a) for a in fact[1:]))


_ORDER = {"clear": 0, "handempty": 1, "holding": 1, "on": 2, "ontable": 3}


def describe_facts(facts: frozenset[Fact]) -> str:
    """PlanBench order: clear facts, the hand, on facts, then on-table facts; 'x, y and z'."""
    parts = [_fact_text(f) for f in sorted(facts, key=lambda f: (_ORDER[f[0]], f[1:]))]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def describe_state(state: BlocksState) -> str:
    """e.g. 'the red block is clear, the hand is empty, ... and the blue block is on the table'."""
    return describe_facts(state.facts())


describe_goal = describe_facts  # a goal is a set of facts too
