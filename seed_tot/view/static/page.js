"use strict";
// Draws the page from the JSON above: the run header and problem list at load, a problem's
// trees only when it is opened (a run of 1,319 problems would be too many nodes to draw at once).
(function () {
  const DATA = JSON.parse(document.getElementById("run-data").textContent);
  const RUNS = DATA.runs;
  const NA = "not recorded";
  // counters travel as lists in DATA.work_fields order; unpacked once, when their problem is opened
  function unpack(values) {
    return values ? Object.fromEntries(DATA.work_fields.map((name, i) => [name, values[i]])) : null;
  }

  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "cls") el.className = v;
      else if (k === "on") for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const kid of kids.flat()) {
      if (kid === null || kid === undefined) continue;
      el.append(kid instanceof Node ? kid : String(kid));
    }
    return el;
  }
  function fmt(x, digits) {
    if (x === null || x === undefined) return h("span", {cls: "na"}, NA);
    if (typeof x === "number") return Number.isInteger(x) ? String(x) : x.toFixed(digits === undefined ? 2 : digits);
    if (typeof x === "object") return JSON.stringify(x);
    return String(x);
  }
  function ratio(a, b) { return b ? a / b : null; }
  function ordinal(n) { return n + (n % 10 === 1 && n % 100 !== 11 ? "st" : n % 10 === 2 && n % 100 !== 12 ? "nd" : n % 10 === 3 && n % 100 !== 13 ? "rd" : "th"); }
  // a long text: clamped, with a button that shows all of it
  function longText(text, cls) {
    const pre = h("pre", {cls: "text " + (cls || "")}, text === null || text === undefined ? "" : String(text));
    if (String(text || "").length < 300 && String(text || "").split("\n").length < 6) return pre;
    pre.classList.add("clamp");
    const btn = h("button", {cls: "more", type: "button"}, "show all");
    btn.addEventListener("click", () => {
      const clamped = pre.classList.toggle("clamp");
      btn.textContent = clamped ? "show all" : "show less";
    });
    return h("div", {}, pre, btn);
  }
  function verdict(p) {
    if (!p) return h("span", {cls: "na"}, "not in this run");
    if (p.error) return h("span", {cls: "bad"}, "failed");
    if (p.correct === true) return h("span", {cls: "ok"}, "correct");
    if (p.correct === false) return h("span", {cls: "bad"}, "wrong");
    if (typeof p.score === "number") return "score " + p.score.toFixed(3);
    return h("span", {cls: "na"}, NA);
  }

  // ---- run header ----
  // label: value pairs, several to a column, so the header stays one screen wide
  function pairs(r, items) {
    return items.map(([name, value]) => h("div", {}, h("span", {cls: "kv"}, name + " "), value));
  }
  const HEADER_ROWS = [
    ["Run", (r) => h("span", {title: r.directory}, r.label)], ["Task", (r) => fmt(r.task)],
    ["Search", (r) => pairs(r, [["algorithm", fmt(r.algorithm)], ["depth / n / breadth",
      [r.depth, r.n_generate, r.breadth].map((x) => x === null || x === undefined ? "?" : x).join(" / ")],
      ["temperature", fmt(r.temperature)]])],
    ["Engine", (r) => pairs(r, [["mode", fmt(r.mode)], ["draft policy", fmt(r.policy)],
      ["policy options", fmt(r.policy_options)], ["k_config", fmt(r.k_config)]])],
    ["Models", (r) => pairs(r, [["target", model(r.target)], ["draft", model(r.draft)]])],
    ["Problems", (r) => fmt(r.n)], ["Accuracy", (r) => fmt(r.accuracy, 3)], ["Mean score", (r) => fmt(r.mean_score, 3)],
    ["Tokens/s", (r) => fmt(r.tokens_per_s, 1)], ["Problems/h", (r) => fmt(r.problems_per_h, 1)],
    ["Acceptance", (r) => fmt(r.acceptance_rate, 3)], ["Tokens / target forward", (r) => fmt(r.tokens_per_target_forward, 2)],
  ];
  // a model given as a file path is named by its file; the whole path is its tooltip
  function model(name) {
    return name ? h("span", {title: name}, String(name).split(/[\\/]/).filter(Boolean).pop()) : fmt(null);
  }
  function drawHeader() {
    // one row per run, so two runs' figures sit one above the other
    // a task scores by accuracy or by a mean score: the column it does not use is left out
    const unused = ["Accuracy", "Mean score"].filter((name) =>
      RUNS.every((r) => (name === "Accuracy" ? r.accuracy : r.mean_score) === null));
    const rows = HEADER_ROWS.filter(([name]) => !unused.includes(name));
    const table = h("table", {cls: "grid", id: "run-table"}, h("tr", {}, rows.map(([name]) => h("th", {}, name))),
      RUNS.map((r) => h("tr", {}, rows.map(([, cell]) => h("td", {}, cell(r))))));
    const box = document.getElementById("run-header");
    box.append(table);
    RUNS.forEach((r) => r.notes.forEach((note) => box.append(h("div", {cls: "missing"}, r.label + ": " + note))));
  }

  // ---- problem list with filter ----
  const ITEMS = [];
  function status(p) {
    const present = p.runs.filter((r) => r);
    if (present.some((r) => r.correct === false || r.error)) return "wrong";
    if (present.length && present.every((r) => r.correct === true)) return "correct";
    return "unscored";
  }
  function drawList() {
    const ul = document.getElementById("problems");
    const frag = document.createDocumentFragment();
    DATA.problems.forEach((p, index) => {
      const marks = p.runs.map((r) => !r ? "–" : r.error ? "!" : r.correct === true ? "✓" : r.correct === false ? "✗" : "·").join("");
      const li = h("li", {"data-id": p.id, "data-status": status(p), title: p.q.slice(0, 200)},
        h("span", {cls: "marks"}, marks + " "), p.id, p.diff ? h("span", {cls: "mark", title: "the runs differ"}, " ≠") : null);
      li.addEventListener("click", () => openProblem(index));
      frag.append(li);
      ITEMS.push({li, id: p.id.toLowerCase(), status: status(p), differs: !!p.diff,
                  missing: p.runs.some((r) => r && r.missing.length)});
    });
    ul.append(frag);
    if (RUNS.length < 2) document.querySelector('#filter option[value="differs"]').remove();
  }
  function applyFilter() {
    const which = document.getElementById("filter").value;
    const needle = document.getElementById("search").value.trim().toLowerCase();
    let shown = 0;
    for (const it of ITEMS) {
      const ok = (which === "all" || (which === "differs" ? it.differs : which === "missing" ? it.missing : it.status === which))
        && (!needle || it.id.includes(needle));
      it.li.hidden = !ok;
      shown += ok;
    }
    document.getElementById("count").textContent = shown + " of " + ITEMS.length + " problems";
  }

  // ---- one problem ----
  function sumWork(works) {
    const t = {new_tokens: 0, accepted: 0, draft_depth: 0, target_forwards: 0, draft_forwards: 0, n: 0};
    for (const w of works) {
      if (!w) continue;
      t.n += 1;
      for (const k of Object.keys(t)) if (k !== "n") t[k] += w[k] || 0;
    }
    return t;
  }
  function workCells(w) {
    if (!w) return [h("td", {cls: "na", colspan: 5}, NA)];
    return [h("td", {cls: "num"}, fmt(w.new_tokens)), h("td", {cls: "num"}, fmt(ratio(w.accepted, w.draft_depth), 3)),
            h("td", {cls: "num"}, fmt(w.target_forwards, 1)), h("td", {cls: "num"}, fmt(w.draft_forwards, 1)),
            h("td", {cls: "num"}, w.wall_s === undefined ? h("span", {cls: "na"}, "-") : fmt(w.wall_s, 3))];
  }
  function stepRows(p) {
    return p.steps.map((st) => {
      const nodes = p.nodes.filter((n) => n.s === st.s);
      const tw = sumWork(nodes.map((n) => n.w)), vw = sumWork(nodes.map((n) => n.vw));
      const cw = st.cw || {};
      const wall = cw.thought || cw.value ? ((cw.thought || {}).wall_s || 0) + ((cw.value || {}).wall_s || 0) : null;
      const tokens = tw.new_tokens + vw.new_tokens;
      return {s: st.s, nodes, kept: nodes.filter((n) => n.k !== null).length, tw, vw, wall,
              tps: wall ? tokens / wall : null, acc: ratio(tw.accepted + vw.accepted, tw.draft_depth + vw.draft_depth),
              tf: tw.target_forwards + vw.target_forwards, df: tw.draft_forwards + vw.draft_forwards, known: tw.n + vw.n > 0};
    });
  }
  function stepTable(p) {
    const head = ["step", "candidates", "kept", "pruned", "thought tokens", "value tokens", "acceptance",
                  "target fwd", "draft fwd", "wall s", "tokens/s"];
    const table = h("table", {cls: "grid steps"}, h("tr", {}, head.map((c) => h("th", {}, c))));
    for (const r of stepRows(p)) {
      const known = (x, d) => r.known ? fmt(x, d) : h("span", {cls: "na"}, NA);
      table.append(h("tr", {}, h("td", {}, r.s + 1), h("td", {cls: "num"}, r.nodes.length), h("td", {cls: "num"}, r.kept),
        h("td", {cls: "num"}, r.nodes.length - r.kept), h("td", {cls: "num"}, known(r.tw.new_tokens)),
        h("td", {cls: "num"}, known(r.vw.new_tokens)), h("td", {cls: "num"}, known(r.acc, 3)),
        h("td", {cls: "num"}, known(r.tf, 1)), h("td", {cls: "num"}, known(r.df, 1)),
        h("td", {cls: "num"}, fmt(r.wall, 3)), h("td", {cls: "num"}, fmt(r.tps, 1))));
    }
    return table;
  }
  function speedTable(prob) {
    const rows = prob.runs.map((p) => p ? stepRows(p) : []);
    const steps = Math.max(...rows.map((r) => r.length));
    const table = h("table", {cls: "grid speed"}, h("tr", {}, h("th", {}, "step"),
      RUNS.map((r) => h("th", {}, r.label + " tokens/s")), RUNS.slice(1).map((r) => h("th", {}, r.label + " / " + RUNS[0].label))));
    for (let s = 0; s < steps; s++) {
      const tps = rows.map((r) => r[s] ? r[s].tps : null);
      table.append(h("tr", {}, h("td", {}, s + 1), tps.map((x) => h("td", {cls: "num"}, fmt(x, 1))),
        tps.slice(1).map((x) => h("td", {cls: "num"}, x !== null && tps[0] ? (x / tps[0]).toFixed(2) + "x" : fmt(null)))));
    }
    return table;
  }
  function statePath(p, node) {
    const path = [];
    for (let n = node; n; n = n.p >= 0 ? p.nodes[n.p] : null) path.unshift(n.x !== undefined ? n.x : n.t);
    return path;
  }
  function nodeBody(p, node) {
    const wt = h("table", {cls: "grid"}, h("tr", {}, ["", "tokens", "acceptance", "target fwd", "draft fwd", "wall s"].map((c) => h("th", {}, c))),
      h("tr", {}, h("th", {}, "thought"), workCells(node.w)), h("tr", {}, h("th", {}, "evaluation"), workCells(node.vw)));
    const body = h("div", {cls: "body"},
      h("div", {cls: "kv"}, "step " + (node.s + 1) + ", candidate " + (node.i + 1) + ", value " + (node.v === null ? NA : node.v) +
        (node.k !== null ? ", kept (rank " + (node.k + 1) + ")" : ", pruned") + (node.c ? ", on the chosen path" : "") +
        (node.dup ? ", a repeat of an earlier candidate (valued without the model)" : "") +
        (node.n !== undefined ? ", visits " + node.n + ", mean reward " + (node.q === null ? NA : node.q) : "") +
        (node.o !== undefined ? ", expanded " + ordinal(node.o + 1) : "") +
        (node.pr !== undefined ? ", prediction " + JSON.stringify(node.pr) : "")),
      h("h4", {}, node.t === null ? "Carried over: a final state competing again" : "Thought"), node.t === null ? null : longText(node.t),
      h("h4", {}, "State after this step"), h("ol", {cls: "state"}, statePath(p, node).map((x) => h("li", {}, longText(x)))),
      h("h4", {}, "Evaluator's reply"), node.r === null || node.r === undefined
        ? h("div", {cls: "na"}, node.dup || node.t === null ? "none: not asked" : p.work
          ? "none: the task valued this state without the model (prior_value)" : "none recorded (older results)")
        : longText(node.r, "reply"),
      h("h4", {}, "Engine work"), wt);
    return body;
  }
  function drawNode(p, node, kids) {
    const st = node.k !== null ? "kept" : "pruned";
    const cls = ["node", st, node.c ? "chosen" : "", node.d ? "differs" : "", node.dup ? "dup" : "", node.t === null ? "carried" : ""];
    const head = h("div", {cls: "head", role: "button", tabindex: "0"},
      h("span", {cls: "tw"}, "▸"), h("span", {cls: "badge val"}, "v " + fmt(node.v)),
      h("span", {cls: "badge st"}, node.k !== null ? "kept #" + (node.k + 1) : "pruned"),
      node.d ? h("span", {cls: "badge diff"}, "differs") : null,
      node.n !== undefined ? h("span", {cls: "badge st", title: "MCTS: visits, mean reward"}, "N " + node.n + " Q " + fmt(node.q)) : null,
      node.o !== undefined ? h("span", {cls: "badge st", title: "MCTS: expansion order"}, "#" + (node.o + 1) + " expanded") : null,
      node.pr !== undefined ? h("span", {cls: "badge val", title: "CoT-SC: this chain's prediction"}, "→ " + node.pr) : null,
      h("span", {cls: "thought"}, node.t === null ? "(carried: " + (statePath(p, node).slice(-1)[0] || "") + ")" : node.t),
      node.t === "" ? h("span", {cls: "na"}, "(empty thought)") : null,
      node.x !== undefined && node.t !== null ? h("span", {cls: "shown", title: "the state as the task holds it"}, " → " + node.x) : null);
    const li = h("li", {cls: cls.filter(Boolean).join(" "), "data-step": node.s, "data-idx": node.i}, head);
    const toggle = () => {
      if (!li.querySelector(":scope > .body")) head.after(nodeBody(p, node));  // built on first open
      const open = li.classList.toggle("open");
      head.firstChild.textContent = open ? "▾" : "▸";
    };
    head.addEventListener("click", toggle);
    head.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); toggle(); } });
    const children = kids.get(p.nodes.indexOf(node)) || [];
    if (children.length) li.append(h("ul", {cls: "children"}, children.map((c) => drawNode(p, c, kids))));
    return li;
  }
  function drawTree(p, run) {
    const col = h("div", {cls: "tree-col", "data-run": run.label}, h("h3", {}, run.label));
    if (!p) return col.append(h("div", {cls: "na"}, "this problem is not in this run")), col;
    col.append(h("table", {cls: "grid"},
      h("tr", {}, h("th", {}, "prediction"), h("td", {}, longText(p.prediction))), h("tr", {}, h("th", {}, "gold"), h("td", {}, fmt(p.gold))),
      h("tr", {}, h("th", {}, "result"), h("td", {}, verdict(p))), h("tr", {}, h("th", {}, "value of the chosen state"), h("td", {}, fmt(p.value))),
      h("tr", {}, h("th", {}, "wall s"), h("td", {}, fmt(p.wall_s, 2))),
      h("tr", {}, h("th", {}, "answer completion"), h("td", {}, p.answer === undefined || p.answer === null ? fmt(null) : longText(p.answer)))));
    if (p.votes) col.append(h("div", {cls: "kv"}, "Vote: " + Object.entries(p.votes).map(([pr, c]) => JSON.stringify(pr) + " " + c).join(", ")));
    if (p.error) col.append(h("div", {cls: "missing"}, "This problem failed: " + p.error));
    if (p.missing.length) col.append(h("div", {cls: "missing"}, "Missing in this record: " + p.missing.join(", ")));
    col.append(h("h3", {}, "Engine work per step"), stepTable(p), h("h3", {}, "Tree"));
    const kids = new Map();
    p.nodes.forEach((n) => { if (!kids.has(n.p)) kids.set(n.p, []); kids.get(n.p).push(n); });
    col.append(h("div", {cls: "root"}, "Question"), h("ul", {cls: "tree"}, (kids.get(-1) || []).map((n) => drawNode(p, n, kids))));
    return col;
  }
  function openProblem(index) {
    const prob = DATA.problems[index];
    for (const p of prob.runs) {
      if (!p || p.unpacked) continue;
      p.nodes.forEach((n) => { n.w = unpack(n.w); n.vw = unpack(n.vw); });
      p.steps.forEach((st) => { for (const phase of Object.keys(st.cw)) st.cw[phase] = unpack(st.cw[phase]); });
      p.unpacked = true;
    }
    ITEMS.forEach((it, i) => it.li.classList.toggle("active", i === index));
    const detail = document.getElementById("detail");
    detail.replaceChildren(h("h2", {}, "Problem " + prob.id), longText(prob.q, "question"));
    if (RUNS.length > 1) {
      const d = prob.diff;
      detail.append(d
        ? h("div", {cls: "differs-banner"}, "The runs differ" + (d.first_step !== null ? " from step " + (d.first_step + 1) : "") +
            (d.predictions_differ ? "; their predictions differ" : "") + (DATA.greedy ? ". All runs are greedy, so they should match." : ". Marked nodes differ."))
        : h("div", {cls: "same-banner"}, "The runs' trees match."), h("h3", {}, "Speed per step"), speedTable(prob));
    }
    const trees = h("div", {cls: "trees"}, prob.runs.map((p, i) => drawTree(p, RUNS[i])));
    trees.style.setProperty("--runs", String(RUNS.length));
    detail.append(trees);
    if (location.hash !== "#" + encodeURIComponent(prob.id)) history.replaceState(null, "", "#" + encodeURIComponent(prob.id));
  }

  drawHeader();
  drawList();
  document.getElementById("filter").addEventListener("change", applyFilter);
  document.getElementById("search").addEventListener("input", applyFilter);
  applyFilter();
  const wanted = decodeURIComponent(location.hash.slice(1));
  const at = DATA.problems.findIndex((p) => p.id === wanted);
  if (at >= 0) openProblem(at);
  else if (DATA.problems.length === 1) openProblem(0);  // a one-problem page shows its tree at once
  document.body.dataset.readyMs = performance.now().toFixed(1);  // time to a usable page, for benchmarks/view_page.py
  document.body.dataset.ready = "1";
})();
