// fanout report --html: the page draws itself from the JSON in the script element #data.
// Nothing is fetched; the file's Content-Security-Policy allows nothing but this
// script and its style.
//
// Every string from the data (answers, prompts, reasoning, tool calls, explanations,
// model names, ids) reaches the page only as text: textContent and text nodes,
// never innerHTML or anything else that parses markup.  Charts are SVG elements
// made with createElementNS.
"use strict";

(() => {
  const SVG = "http://www.w3.org/2000/svg";
  const DATA = JSON.parse(document.getElementById("data").textContent);
  const EVAL = DATA.evaluation;
  const CUT = 220; // characters of an answer shown in the grid

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function svg(tag, attributes, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function add(parent, ...children) {
    for (const child of children) if (child) parent.appendChild(child);
    return parent;
  }

  // ---- formats: "–" is unknown ----
  const score = (v) => (v === null || v === undefined ? "–" : v.toFixed(2));
  const pct = (v) => (v === null || v === undefined ? "–" : `${Math.round(v * 100)}%`);
  const seconds = (v) => (v === null || v === undefined ? "–"
    : v < 1 ? `${Math.round(v * 1000)}ms` : `${v.toFixed(2)}s`);
  const rate = (v) => (v === null || v === undefined ? "–" : v >= 100 ? `${Math.round(v)}` : v.toFixed(1));
  const pValue = (v) => (v === null || v === undefined ? "–" : v < 0.001 ? "<0.001" : v.toFixed(3));
  function dollars(total, unknown) {
    if (total === null || total === undefined) return "–";
    const text = total === 0 ? "$0" : total >= 100 ? `$${Math.round(total)}` : `$${Number(total.toPrecision(4))}`;
    return text + (unknown ? "+" : "");
  }
  const signed = (v) => `${v > 0 || Object.is(v, 0) ? "+" : v < 0 ? "−" : ""}${Math.abs(v).toFixed(2)}`;
  const interval = (e, f) => (e ? `${f(e.low)}–${f(e.high)}` : "–");

  function table(headers, rows, className) {
    const node = el("table", className);
    const head = add(node, el("thead")).lastChild.appendChild(el("tr"));
    for (const header of headers) head.appendChild(el("th", null, header));
    const body = node.appendChild(el("tbody"));
    for (const row of rows) {
      const tr = body.appendChild(el("tr"));
      for (const cell of row) tr.appendChild(cell instanceof Node ? add(el("td"), cell) : el("td", null, cell));
    }
    return node;
  }

  function section(title, id) {
    const node = el("section", "panel");
    if (id) node.id = id;
    node.appendChild(el("h2", null, title));
    document.body.appendChild(node);
    return node;
  }

  // ---- header ----
  function header() {
    const top = el("header", "top");
    add(top, el("h1", null, "fanout report"), el("span", "file", DATA.title || ""));
    const facts = [`${DATA.prompts.length} prompts`, `${DATA.models.length} models`,
      `${DATA.samples} sample${DATA.samples === 1 ? "" : "s"} a prompt`,
      `${DATA.scorers.length} scorer${DATA.scorers.length === 1 ? "" : "s"}`,
      `generated ${DATA.generated}`];
    top.appendChild(el("span", "facts", facts.join(" · ")));
    document.body.appendChild(top);
  }

  // ---- the summary: a table per scorer, and cost ----
  function summary() {
    const node = section("Summary", "summary");
    const iv = EVAL.interval;
    node.appendChild(el("p", "note", iv.method === "bootstrap"
      ? `95% intervals: bootstrap over prompts (${iv.resamples.toLocaleString("en")} resamples, seed ${iv.seed}).`
      : "95% intervals: Wilson for pass rates, normal over prompt means for scores."));
    if (EVAL.stale_scores) node.appendChild(el("p", "note", `${EVAL.stale_scores} stale scores (of older answers) left out.`));
    const k = EVAL.samples;
    for (const scorer of DATA.scorers) {
      node.appendChild(el("h3", null, `scorer: ${scorer}`));
      const headers = ["model", "units", "scored", "unscored", "errors", "no score", "mean", "95% CI", "pass", "95% CI"];
      if (k > 1) headers.push("pass@1", `pass@${k}`, `pass^${k}`, "flaky");
      const rows = EVAL.models.map((m) => {
        const s = m.scorers[scorer];
        const row = [label(m), s.units, s.scored, s.unscored, s.errors, s.missing,
          score(s.mean && s.mean.value), interval(s.mean, score),
          pct(s.pass_rate && s.pass_rate.value), interval(s.pass_rate, pct)];
        if (k > 1) row.push(pct(s.pass_at_k["1"]), pct(s.pass_at_k[String(k)]), pct(s.pass_hat_k[String(k)]), s.flaky.length);
        return row;
      });
      node.appendChild(table(headers, rows, "numbers summary-table"));
    }
    // The cost's text is Python's (fanout.eval.cost.format_cost): one rounding in every view.
    const costs = EVAL.models.map((m) => [label(m), m.cost.text ?? dollars(m.cost.total, m.cost.unknown), m.cost.known, m.cost.unknown,
      seconds(m.ttft.p50), seconds(m.ttft.p95), rate(m.tokens_per_second.p50), rate(m.tokens_per_second.p95)]);
    node.appendChild(el("h3", null, "cost and speed"));
    node.appendChild(table(["model", "cost", "known", "unknown", "TTFT p50", "TTFT p95", "tok/s p50", "tok/s p95"],
      costs, "numbers"));
    const judge = EVAL.cost.judge;
    node.appendChild(el("p", "note", `total ${EVAL.cost.text ?? dollars(EVAL.cost.total, EVAL.cost.unknown)}` +
      (EVAL.cost.unknown ? ` (${EVAL.cost.unknown} records of unknown cost)` : "") +
      (judge.calls ? `; the judge ${judge.text ?? dollars(judge.total, judge.unknown)} over ${judge.calls} calls` : "")));
  }

  const label = (m) => (m.group === null ? m.model : `${m.model} · ${m.group}`);

  // ---- charts ----
  function axis(group, x, y, width, max, format, ticks) {
    group.appendChild(svg("line", { x1: x, y1: y, x2: x + width, y2: y, class: "axis" }));
    for (let i = 0; i <= ticks; i += 1) {
      const value = (max * i) / ticks;
      const at = x + (width * i) / ticks;
      group.appendChild(svg("line", { x1: at, y1: y, x2: at, y2: y + 4, class: "axis" }));
      group.appendChild(svg("text", { x: at, y: y + 16, class: "tick", "text-anchor": "middle" }, format(value)));
    }
  }

  function scoreChart(parent, scorer) {
    const rows = EVAL.models.filter((m) => m.scorers[scorer] && m.scorers[scorer].mean);
    const left = 170, width = 420, line = 26, top = 10;
    const height = top + rows.length * line + 30;
    const chart = svg("svg", { class: "chart score-chart", "data-scorer": scorer, width: left + width + 40, height,
      viewBox: `0 0 ${left + width + 40} ${height}`, role: "img" });
    chart.appendChild(svg("title", {}, `mean ${scorer} score per model with its 95% interval`));
    rows.forEach((m, i) => {
      const mean = m.scorers[scorer].mean;
      const y = top + i * line + line / 2;
      const at = (v) => left + v * width;
      chart.appendChild(svg("text", { x: left - 8, y: y + 4, "text-anchor": "end", class: "name" }, label(m)));
      chart.appendChild(svg("line", { x1: at(mean.low), y1: y, x2: at(mean.high), y2: y, class: "whisker" }));
      for (const end of [mean.low, mean.high]) {
        chart.appendChild(svg("line", { x1: at(end), y1: y - 5, x2: at(end), y2: y + 5, class: "whisker" }));
      }
      const mark = svg("circle", { cx: at(mean.value), cy: y, r: 5, class: "mark", "data-model": label(m) });
      mark.appendChild(svg("title", {}, `${label(m)}: ${score(mean.value)} (${score(mean.low)}–${score(mean.high)})`));
      chart.appendChild(mark);
    });
    axis(chart, left, top + rows.length * line + 4, width, 1, (v) => v.toFixed(2), 4);
    parent.appendChild(chart);
  }

  function quantile(sorted, q) {
    const position = q * (sorted.length - 1);
    const below = Math.floor(position), above = Math.min(below + 1, sorted.length - 1);
    return sorted[below] + (sorted[above] - sorted[below]) * (position - below);
  }

  function distributionChart(parent, metric, title, format) {
    const rows = EVAL.models.filter((m) => m[metric].values.length);
    if (!rows.length) {
      parent.appendChild(el("p", "note", `${title}: no values.`));
      return;
    }
    const max = Math.max(...rows.map((m) => m[metric].values[m[metric].values.length - 1])) || 1;
    const left = 170, width = 420, line = 34, top = 10;
    const height = top + rows.length * line + 30;
    const chart = svg("svg", { class: `chart dist-chart dist-${metric}`, width: left + width + 40, height,
      viewBox: `0 0 ${left + width + 40} ${height}`, role: "img" });
    chart.appendChild(svg("title", {}, `${title} per model: box (quartiles, median) and every value`));
    rows.forEach((m, i) => {
      const values = m[metric].values;
      const y = top + i * line + line / 2;
      const at = (v) => left + (v / max) * width;
      chart.appendChild(svg("text", { x: left - 8, y: y + 4, "text-anchor": "end", class: "name" }, label(m)));
      const q1 = quantile(values, 0.25), q2 = quantile(values, 0.5), q3 = quantile(values, 0.75);
      chart.appendChild(svg("line", { x1: at(values[0]), y1: y, x2: at(values[values.length - 1]), y2: y, class: "whisker" }));
      const box = svg("rect", { x: at(q1), y: y - 8, width: Math.max(1, at(q3) - at(q1)), height: 16, class: "box",
        "data-model": label(m) });
      box.appendChild(svg("title", {}, `${label(m)}: median ${format(q2)}, p95 ${format(m[metric].p95)}, ${values.length} values`));
      chart.appendChild(box);
      chart.appendChild(svg("line", { x1: at(q2), y1: y - 8, x2: at(q2), y2: y + 8, class: "median" }));
      values.forEach((v, j) => {
        // a fixed jitter (no randomness): the same file draws the same picture
        const dy = (((j * 7919) % 13) - 6) * 0.9;
        chart.appendChild(svg("circle", { cx: at(v), cy: y + dy, r: 1.8, class: "dot" }));
      });
    });
    axis(chart, left, top + rows.length * line + 4, width, max, format, 4);
    parent.appendChild(add(el("figure"), el("figcaption", null, title), chart));
  }

  function charts() {
    const node = section("Charts", "charts");
    if (DATA.scorers.length) {
      const pick = el("select");
      pick.id = "chart-scorer";
      for (const scorer of DATA.scorers) pick.appendChild(el("option", null, scorer)).value = scorer;
      const holder = el("div");
      const draw = () => { holder.replaceChildren(); scoreChart(holder, pick.value); };
      pick.addEventListener("change", draw);
      add(node, add(el("label", "pick"), document.createTextNode("mean score per model, scorer "), pick), holder);
      draw();
    } else {
      node.appendChild(el("p", "note", "No scores: fanout score RESULTS.jsonl --score NAME scores the answers."));
    }
    const row = add(el("div", "dists"));
    distributionChart(row, "ttft", "time to first token (seconds)", (v) => seconds(v));
    distributionChart(row, "tokens_per_second", "tokens per second", (v) => rate(v));
    node.appendChild(row);
  }

  // ---- the comparison ----
  function comparison() {
    const against = EVAL.against;
    if (!against) return;
    const node = section(`Against ${DATA.against} (B, the baseline): A − B`, "against");
    node.appendChild(el("p", "counts", `${against.both} keys in both (${against.not_both_completed} not completed in both), ` +
      `${against.only_a} only in A, ${against.only_b} only in B`));
    const rows = against.rows.map((r) => [r.model, r.scorer, r.pairs, score(r.mean_a), score(r.mean_b),
      r.difference ? signed(r.difference.value) : "–",
      r.difference ? `[${signed(r.difference.low)}, ${signed(r.difference.high)}]` : "–",
      pValue(r.difference && r.difference.p_value), r.pass_to_fail.length, r.fail_to_pass.length,
      pValue(r.mcnemar.p_value)]);
    node.appendChild(table(["model", "scorer", "pairs", "A", "B", "A−B", "95% CI", "p (bootstrap)", "pass→fail",
      "fail→pass", "McNemar p"], rows, "numbers"));
    for (const r of against.rows) {
      for (const [what, flips] of [["pass→fail", r.pass_to_fail], ["fail→pass", r.fail_to_pass]]) {
        if (!flips.length) continue;
        const line = add(el("p", `flips ${what === "pass→fail" ? "worse" : "better"}`),
          el("span", null, `${r.model} · ${r.scorer} · ${what} (${flips.length}): `));
        for (const flip of flips) {
          const button = el("button", "flip", DATA.samples > 1 ? `${flip.id}#${flip.sample}` : String(flip.id));
          button.addEventListener("click", () => { search.value = String(flip.id); filterRows(); });
          line.appendChild(button);
        }
        node.appendChild(line);
      }
    }
  }

  // ---- the grid ----
  const FILTERS = [["all", "all"], ["failures", "failures"], ["errors", "errors"], ["truncated", "truncated"],
    ["empty", "flagged empty"], ["different", "different"]];
  let filter = "all";
  let search;
  const rowsById = new Map();

  function byPrompt() {
    const cells = new Map();
    for (const cell of DATA.cells) {
      if (!cells.has(cell.id)) cells.set(cell.id, new Map());
      const models = cells.get(cell.id);
      if (!models.has(cell.model)) models.set(cell.model, []);
      models.get(cell.model).push(cell);
    }
    for (const models of cells.values()) for (const list of models.values()) list.sort((a, b) => a.sample - b.sample);
    return cells;
  }

  function failed(cell) { return Object.values(cell.scores).some((s) => s.status === "scored" && s.passed === false); }
  function errored(cell) {
    return ["error", "timed_out", "cancelled"].includes(cell.state) || Object.values(cell.scores).some((s) => s.status === "error");
  }

  function different(models) {
    // pass/fail per scorer and model ("pass", "fail", "mixed"); unscored, the answers' text
    const scored = DATA.scorers.filter((scorer) => [...models.values()].some((list) => list.some((c) => c.scores[scorer] && c.scores[scorer].status === "scored")));
    if (scored.length) {
      return scored.some((scorer) => {
        const verdicts = new Set([...models.values()].map((list) => {
          const passes = list.filter((c) => c.scores[scorer] && c.scores[scorer].status === "scored").map((c) => c.scores[scorer].passed);
          return passes.length === 0 ? "none" : passes.every(Boolean) ? "pass" : passes.some(Boolean) ? "mixed" : "fail";
        }));
        verdicts.delete("none");
        return verdicts.size > 1;
      });
    }
    const texts = new Set([...models.values()].map((list) => JSON.stringify(list.map((c) => c.text.trim()).sort())));
    return models.size > 1 && texts.size > 1;
  }

  function badge(text, className) { return el("span", `badge ${className}`, text); }

  function grid() {
    const node = section("Answers", "answers");
    const bar = el("div", "filters");
    bar.id = "filters";
    for (const [name, text] of FILTERS) {
      const button = el("button", name === filter ? "filter on" : "filter", text);
      button.dataset.filter = name;
      button.addEventListener("click", () => {
        filter = name;
        for (const other of bar.querySelectorAll(".filter")) other.classList.toggle("on", other === button);
        filterRows();
      });
      bar.appendChild(button);
    }
    search = el("input", "search");
    search.id = "search";
    search.type = "search";
    search.placeholder = "search ids and answers";
    search.addEventListener("input", filterRows);
    bar.appendChild(search);
    const shown = el("span", "shown");
    shown.id = "shown";
    bar.appendChild(shown);
    node.appendChild(bar);

    const wrap = add(el("div", "grid-wrap"));
    const grid = el("table", "grid");
    grid.id = "grid";
    const head = grid.appendChild(el("thead")).appendChild(el("tr"));
    head.appendChild(el("th", null, "prompt"));
    for (const model of DATA.models) head.appendChild(el("th", null, model));
    const body = grid.appendChild(el("tbody"));
    const cellsByPrompt = byPrompt();
    // In the prompts file's order (DATA.prompts), never by id or by arrival.
    for (const prompt of DATA.prompts) {
      const id = prompt.id;
      const models = cellsByPrompt.get(id);
      if (!models) continue;
      const tr = body.appendChild(el("tr", "row"));
      tr.dataset.id = id;
      const first = tr.appendChild(el("th", "prompt"));
      first.appendChild(el("div", "prompt-id", id));
      const last = prompt.messages.length ? prompt.messages[prompt.messages.length - 1].content : "";
      first.appendChild(el("div", "prompt-text", last.length > 160 ? `${last.slice(0, 160)}…` : last));
      if (prompt.category || prompt.tags.length) first.appendChild(el("div", "labels", [prompt.category, ...prompt.tags].filter(Boolean).join(" · ")));
      const all = [];
      for (const model of DATA.models) {
        const td = tr.appendChild(el("td", "cell"));
        for (const cell of models.get(model) || []) {
          all.push(cell);
          const entry = td.appendChild(el("div", `sample state-${cell.state}`));
          entry.tabIndex = 0;
          entry.dataset.model = cell.model;
          entry.dataset.sample = String(cell.sample);
          entry.dataset.state = cell.state;
          const badges = entry.appendChild(el("div", "badges"));
          if (DATA.samples > 1) badges.appendChild(badge(`#${cell.sample}`, "sample-no"));
          badges.appendChild(badge(cell.state.replace("_", " "), `outcome ${cell.state}`));
          for (const [scorer, s] of Object.entries(cell.scores)) {
            const verdict = s.status !== "scored" ? s.status : s.passed ? "pass" : "fail";
            const b = badges.appendChild(badge(`${scorer} ${s.status === "scored" ? score(s.score) : s.status}`, `score ${verdict}`));
            b.title = s.explanation;
          }
          const text = cell.text || (cell.tool_calls.length ? `→ ${cell.tool_calls.map((c) => c.name).join(", ")}` : cell.reason || "");
          entry.appendChild(el("div", "answer", text.length > CUT ? `${text.slice(0, CUT)}…` : text));
          entry.addEventListener("click", () => detail(cell, prompt));
          entry.addEventListener("keydown", (event) => { if (event.key === "Enter") detail(cell, prompt); });
        }
      }
      rowsById.set(id, { tr, cells: all, models, haystack: [id, ...all.map((c) => c.text)].join("\n").toLowerCase() });
    }
    wrap.appendChild(grid);
    node.appendChild(wrap);
    filterRows();
  }

  function keep(row) {
    switch (filter) {
      case "failures": return row.cells.some(failed);
      case "errors": return row.cells.some(errored);
      case "truncated": return row.cells.some((c) => c.state === "truncated");
      case "empty": return row.cells.some((c) => c.state === "empty" || c.flags.includes("empty_answer"));
      case "different": return different(row.models);
      default: return true;
    }
  }

  function filterRows() {
    const query = search.value.trim().toLowerCase();
    let shown = 0;
    for (const row of rowsById.values()) {
      const visible = keep(row) && (!query || row.haystack.includes(query));
      row.tr.hidden = !visible;
      shown += visible ? 1 : 0;
    }
    document.getElementById("shown").textContent = `${shown} of ${rowsById.size} prompts`;
  }

  // ---- the detail of one answer ----
  function field(parent, name, value, className) {
    if (value === null || value === undefined || value === "") return;
    add(parent, el("dt", null, name), el("dd", className || null, value));
  }

  function detail(cell, prompt) {
    const panel = document.getElementById("detail");
    const body = panel.querySelector(".detail-body");
    body.replaceChildren();
    panel.querySelector(".detail-title").textContent = `${cell.id} · ${cell.model}${DATA.samples > 1 ? ` · sample ${cell.sample}` : ""}`;
    const head = body.appendChild(el("dl", "facts"));
    field(head, "outcome", cell.state === cell.outcome ? cell.outcome : `${cell.outcome} (${cell.state})`);
    field(head, "reason", cell.reason);
    field(head, "finish reason", cell.finish_reason);
    field(head, "flags", (cell.flag_labels && cell.flag_labels.length === cell.flags.length
      ? cell.flag_labels : cell.flags.map((f) => f.replaceAll("_", " "))).join(", "));
    field(head, "model id", cell.model_id);
    body.appendChild(el("h3", null, "prompt"));
    for (const message of prompt.messages) {
      add(body, add(el("div", "message"), el("span", "role", message.role), el("pre", "text", message.content)));
    }
    if (prompt.has_expected) add(body, el("h3", null, "expected"), el("pre", "text expected", prompt.expected));
    add(body, el("h3", null, "answer"), el("pre", "text answer-text", cell.text));
    if (cell.reasoning) add(body, el("h3", null, "reasoning"), el("pre", "text reasoning", cell.reasoning));
    if (cell.refusal) add(body, el("h3", null, "refusal"), el("pre", "text refusal", cell.refusal));
    if (cell.tool_calls.length) {
      body.appendChild(el("h3", null, "tool calls"));
      for (const call of cell.tool_calls) {
        let args = call.arguments;
        try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (error) { /* shown as sent */ }
        add(body, el("div", "tool-name", `→ ${call.name}${call.valid_json === false ? " (not valid JSON)" : ""}${call.schema_valid === false ? " (against the schema: invalid)" : ""}`),
          el("pre", "text tool-args", args));
      }
    }
    const scores = Object.entries(cell.scores);
    if (scores.length) {
      body.appendChild(el("h3", null, "scores"));
      body.appendChild(table(["scorer", "status", "score", "pass", "explanation"], scores.map(([name, s]) => [
        name, s.status, score(s.score), s.passed === null || s.passed === undefined ? "–" : s.passed ? "pass" : "fail",
        s.judge ? `${s.explanation} (judge ${s.judge.model}: ${s.judge.text})` : s.explanation]), "scores-table"));
    }
    body.appendChild(el("h3", null, "metrics"));
    const metrics = body.appendChild(el("dl", "facts"));
    field(metrics, "TTFT", seconds(cell.metrics.ttft));
    field(metrics, "first text", seconds(cell.metrics.ttfc));
    field(metrics, "latency", seconds(cell.metrics.e2e_latency));
    field(metrics, "tokens/s", rate(cell.metrics.tokens_per_second));
    field(metrics, "chars", cell.metrics.output_chars ?? "–");
    if (cell.usage) field(metrics, "tokens", `${cell.usage.prompt_tokens ?? "–"} in, ${cell.usage.completion_tokens ?? "–"} out`);
    field(metrics, "cost", cell.cost === null || cell.cost === undefined ? "unknown" : `${cell.cost_text ?? dollars(cell.cost, 0)} (${cell.cost_source})`);
    panel.hidden = false;
    panel.querySelector(".close").focus();
  }

  function detailPanel() {
    const panel = el("aside", "detail");
    panel.id = "detail";
    panel.hidden = true;
    const head = panel.appendChild(el("div", "detail-head"));
    head.appendChild(el("h2", "detail-title"));
    const close = head.appendChild(el("button", "close", "close"));
    close.addEventListener("click", () => { panel.hidden = true; });
    panel.appendChild(el("div", "detail-body"));
    document.addEventListener("keydown", (event) => { if (event.key === "Escape") panel.hidden = true; });
    document.body.appendChild(panel);
  }

  header();
  summary();
  charts();
  comparison();
  grid();
  detailPanel();
  document.body.dataset.ready = "1";
})();
