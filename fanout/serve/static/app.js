// fanout serve: the comparison page.  No build step, no dependency, nothing fetched
// from anywhere but this service.
//
// Everything that comes from the server (model text, reasoning, tool calls, reasons,
// error messages, model names) reaches the page only as text: textContent, Text nodes
// and their appendData.  Never innerHTML or anything else that parses markup.
//
// Records arrive as server-sent events over a fetch() body (EventSource cannot POST);
// they only update state.  The DOM is updated once per animation frame.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // ---- Server-sent events: the WHATWG parsing rules, fed decoded text ----
  class SSEParser {
    constructor(onEvent, onComment) {
      this.onEvent = onEvent;
      this.onComment = onComment || (() => {});
      this.rest = "";
      this.skipLF = false; // a CR ended the last piece: a LF starting the next is the same line end
      this.data = [];
      this.event = "";
    }

    feed(text) {
      if (!text) return;
      if (this.skipLF && text.charCodeAt(0) === 10) text = text.slice(1);
      this.skipLF = text.length > 0 && text.charCodeAt(text.length - 1) === 13;
      const lines = (this.rest + text).split(/\r\n|\r|\n/);
      this.rest = lines.pop();
      for (const line of lines) this.line(line);
    }

    end() {
      // An event not ended by a blank line is never dispatched (the spec's rule).
      this.rest = "";
      this.data = [];
      this.event = "";
    }

    line(line) {
      if (line === "") {
        if (this.data.length) this.onEvent(this.event || "message", this.data.join("\n"));
        this.data = [];
        this.event = "";
        return;
      }
      if (line.charCodeAt(0) === 58) { // ":" a comment: a keep-alive
        this.onComment(line.slice(1));
        return;
      }
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.charCodeAt(0) === 32) value = value.slice(1);
      if (field === "data") this.data.push(value);
      else if (field === "event") this.event = value;
      // id and retry mean nothing to a fetch() reader
    }
  }

  // ---- formatting ----
  function seconds(value) {
    if (value === null || value === undefined) return "–";
    return value < 1 ? `${Math.round(value * 1000)}ms` : `${value.toFixed(2)}s`;
  }

  function perSecond(value, estimated) {
    if (value === null || value === undefined) return "– tok/s";
    return `${estimated ? "≈" : ""}${value >= 100 ? Math.round(value) : value.toFixed(1)} tok/s`;
  }

  const STATUS = {
    queued: ["queued", "live"],
    waiting: ["waiting", "live"],
    streaming: ["streaming", "live"],
    retrying: ["retrying", "live"],
    completed: ["done", "ok"],
    truncated: ["TRUNCATED", "bad"],
    error: ["ERROR", "bad"],
    timed_out: ["TIMED OUT", "bad"],
    cancelled: ["CANCELLED", "cancel"],
    lost: ["LOST", "bad"],
  };
  // A stream the page's Stop ended reads "stopped": the user's own act, not a fault.
  // (Its outcome stays "cancelled", in data-status and in the server's records.)
  function statusLabel(outcome, stoppedByPage) {
    if (outcome === "cancelled" && stoppedByPage) return ["stopped", "cancel"];
    return STATUS[outcome] || [outcome, "live"];
  }
  const LOUD_FINISH = new Set(["length", "content_filter"]);
  const CONTENT = new Set(["text", "reasoning", "refusal", "tool_call"]);

  // A model's id, with its dialect in front when it is not chat (as compare's headers say).
  function dialectLabel(api, id) {
    return api && api !== "chat" ? `${api}: ${id}` : id;
  }

  // ---- one column: one stream ----
  class Column {
    constructor(info, started) {
      this.key = info.stream;
      this.stopAsked = false; // the page's Stop was pressed while this stream ran
      this.started = started; // performance.now() when the run began
      this.status = "queued";
      this.finish = null;
      this.reason = null;
      this.flags = [];
      this.timedOut = null;
      this.errorText = null;
      this.firstContent = null; // record t of the first content
      this.lastContent = null;
      this.contentEvents = 0;
      this.tokens = null;
      this.metrics = null;
      this.endedAt = null; // record t of the result
      this.ended = false;
      this.choices = new Map();
      this.pending = []; // [node, text] to append on the next frame
      this.dirty = true;

      const root = el("article", "column");
      root.dataset.stream = info.stream;
      root.dataset.status = "queued";
      const head = el("header", "col-head");
      const title = el("div", "col-title");
      title.append(el("span", "col-name", info.stream));
      title.append(el("span", "col-id", dialectLabel(info.api, info.model_id)));
      const badges = el("div", "col-badges");
      this.statusNode = el("span", "status live", "queued");
      this.finishNode = el("span", "finish");
      this.finishNode.hidden = true;
      this.flagsNode = el("span", "flags");
      badges.append(this.statusNode, this.finishNode, this.flagsNode);
      this.reasonNode = el("div", "col-reason");
      this.reasonNode.hidden = true;
      this.metricsNode = el("div", "col-metrics", "TTFT – · – tok/s · – tokens · –");
      head.append(title, badges, this.reasonNode, this.metricsNode);
      this.body = el("div", "col-body");
      this.errorNode = el("div", "col-error");
      this.errorNode.hidden = true;
      root.append(head, this.body, this.errorNode);
      this.root = root;
    }

    choice(index) {
      let view = this.choices.get(index);
      if (view) return view;
      const root = el("section", "choice");
      if (index !== 0) root.append(el("div", "choice-label", `choice ${index}`));
      const reasoning = el("details", "reasoning");
      reasoning.open = true;
      reasoning.hidden = true;
      reasoning.append(el("summary", null, "reasoning"));
      const reasoningText = el("div", "reasoning-text");
      const reasoningNode = document.createTextNode("");
      reasoningText.append(reasoningNode);
      reasoning.append(reasoningText);
      const text = el("div", "text");
      const textNode = document.createTextNode("");
      text.append(textNode);
      const refusal = el("div", "refusal");
      refusal.hidden = true;
      const refusalNode = document.createTextNode("");
      refusal.append(refusalNode);
      const tools = el("div", "tools");
      tools.hidden = true;
      root.append(reasoning, text, refusal, tools);
      this.body.append(root);
      view = { root, reasoning, reasoningNode, textNode, refusal, refusalNode, tools,
               calls: new Map() };
      this.choices.set(index, view);
      return view;
    }

    call(view, index) {
      let call = view.calls.get(index);
      if (call) return call;
      const root = el("div", "tool");
      const name = el("span", "tool-name", "→ ?");
      const check = el("span", "tool-check");
      const args = el("pre", "tool-args");
      root.append(name, check, args);
      view.tools.append(root);
      view.tools.hidden = false;
      call = { root, name, check, args, nameText: null, raw: "", dirty: true };
      view.calls.set(index, call);
      return call;
    }

    apply(record) {
      const type = record.type;
      if (CONTENT.has(type)) {
        if (this.firstContent === null) this.firstContent = record.t;
        this.lastContent = record.t;
        this.contentEvents += 1;
        if (this.status !== "streaming" && !this.ended) this.status = "streaming";
      }
      if (type === "text") {
        this.pending.push([this.choice(record.choice).textNode, record.text]);
      } else if (type === "reasoning") {
        const view = this.choice(record.choice);
        view.reasoning.hidden = false;
        this.pending.push([view.reasoningNode, record.text]);
      } else if (type === "refusal") {
        const view = this.choice(record.choice);
        view.refusal.hidden = false;
        this.pending.push([view.refusalNode, record.text]);
      } else if (type === "tool_call") {
        const call = this.call(this.choice(record.choice), record.tool_index ?? 0);
        if (record.name && call.nameText === null) call.nameText = record.name;
        call.raw += record.arguments || "";
        call.dirty = true;
      } else if (type === "finish") {
        if (record.choice === 0 || this.finish === null) this.finish = record.finish_reason;
      } else if (type === "usage") {
        if (record.completion_tokens !== null && record.completion_tokens !== undefined) {
          this.tokens = record.completion_tokens;
        }
      } else if (type === "started") {
        if (!this.ended && this.status !== "streaming") this.status = "waiting";
      } else if (type === "retrying") {
        this.status = "retrying";
        const error = record.error ? record.error.message : "";
        this.reason = `attempt ${record.attempt} failed: ${error}; retrying in ${seconds(record.wait)}`;
      } else if (type === "error") {
        this.errorText = record.message;
      } else if (type === "result") {
        this.result(record);
      }
      this.dirty = true;
    }

    result(record) {
      this.ended = true;
      this.status = record.outcome;
      this.reason = record.reason;
      // The labels are the server's (fanout.records.flag_label): one vocabulary in every view.
      this.flags = record.flag_labels || (record.flags || []).map((f) => f.replaceAll("_", " "));
      this.timedOut = record.timed_out;
      this.metrics = record.metrics;
      this.endedAt = record.t;
      if (record.usage && record.usage.completion_tokens !== null) {
        this.tokens = record.usage.completion_tokens;
      }
      const first = (record.choices || []).find((c) => c.index === 0) || (record.choices || [])[0];
      this.finish = first ? first.finish_reason : null;
      if (record.error && record.error.message) this.errorText = record.error.message;
      // The result is the whole truth: what streamed is replaced by it.
      this.pending = [];
      for (const choice of record.choices || []) {
        const view = this.choice(choice.index);
        view.textNode.data = choice.text;
        view.reasoningNode.data = choice.reasoning;
        view.reasoning.hidden = !choice.reasoning;
        view.refusalNode.data = choice.refusal;
        view.refusal.hidden = !choice.refusal;
        for (const tool of choice.tool_calls || []) {
          const call = this.call(view, tool.index);
          call.nameText = tool.name;
          call.raw = tool.arguments;
          call.final = tool;
          call.dirty = true;
        }
      }
    }

    lose(status, reason) {
      if (this.ended) return;
      this.ended = true;
      this.status = status;
      this.reason = reason;
      this.dirty = true;
    }

    render(now) {
      const body = this.body;
      const stick = body.scrollHeight - body.scrollTop - body.clientHeight < 32;
      for (const [node, text] of this.pending) node.appendData(text);
      this.pending = [];
      for (const view of this.choices.values()) {
        for (const call of view.calls.values()) {
          if (!call.dirty) continue;
          call.dirty = false;
          call.name.textContent = `→ ${call.nameText ?? "?"}`;
          const final = call.final;
          if (final && final.valid_json) {
            call.args.textContent = JSON.stringify(final.parsed, null, 2);
            call.check.textContent = final.schema_valid === false
              ? `schema: ${(final.schema_errors || []).join("; ")}` : "";
            call.check.className = final.schema_valid === false ? "tool-check bad" : "tool-check";
          } else {
            call.args.textContent = call.raw;
            call.check.textContent = final ? `invalid JSON: ${final.parse_error}` : "";
            call.check.className = final ? "tool-check bad" : "tool-check";
          }
        }
      }
      const [label, tone] = statusLabel(this.status, this.stopAsked);
      const statusText = this.status === "timed_out" && this.timedOut
        ? `${label} (${this.timedOut})` : label;
      this.statusNode.textContent = statusText;
      this.statusNode.className = `status ${tone}`;
      this.root.dataset.status = this.status;
      this.root.className = `column ${tone}`;
      if (this.finish) {
        this.finishNode.hidden = false;
        this.finishNode.textContent = `finish ${this.finish}`;
        this.finishNode.className = LOUD_FINISH.has(this.finish) ? "finish loud" : "finish";
        this.root.dataset.finish = this.finish;
      } else {
        this.finishNode.hidden = true;
        delete this.root.dataset.finish;
      }
      this.flagsNode.replaceChildren(
        ...this.flags.map((flag) => el("span", "flag", flag)));
      this.reasonNode.hidden = !this.reason;
      this.reasonNode.textContent = this.reason ? `⚠ ${this.reason}` : "";
      // An error the reason already says is not said twice.
      this.errorNode.hidden = !this.errorText || this.status === "completed"
        || Boolean(this.reason && this.reason.includes(this.errorText));
      this.errorNode.textContent = this.errorText ? `error: ${this.errorText}` : "";
      this.renderMetrics(now);
      if (stick) body.scrollTop = body.scrollHeight; // follow the text unless scrolled up
      this.dirty = false;
    }

    renderMetrics(now) {
      const m = this.metrics;
      let ttft;
      let rate;
      let tokens;
      let elapsed;
      if (m) {
        ttft = seconds(m.ttft);
        rate = perSecond(m.tokens_per_second, m.tokens_estimated);
        tokens = this.tokens !== null ? `${this.tokens} tokens` : `≈${m.chunks} chunks`;
        // The stream's own time, as the summary table gives it (from its request being
        // sent; the record's t counts from the fan-out's start, queueing included).
        elapsed = seconds(m.e2e_latency ?? this.endedAt);
      } else {
        ttft = this.firstContent !== null ? `≈${seconds(this.firstContent)}` : "–";
        const span = this.lastContent - this.firstContent;
        rate = this.contentEvents > 1 && span > 0
          ? perSecond((this.contentEvents - 1) / span, true) : "– tok/s";
        tokens = this.tokens !== null ? `${this.tokens} tokens` : `≈${this.contentEvents} tokens`;
        elapsed = this.ended && this.endedAt !== null ? seconds(this.endedAt)
          : seconds((now - this.started) / 1000);
      }
      this.metricsNode.textContent = `TTFT ${ttft} · ${rate} · ${tokens} · ${elapsed}`;
    }
  }

  // ---- one run: one POST /v1/fanout ----
  class Run {
    constructor(body, page) {
      this.body = body;
      this.page = page;
      this.id = null;
      this.columns = new Map();
      this.controller = new AbortController();
      this.started = performance.now();
      this.finished = false;
      this.stopped = false;
      this.sawDone = false;
      this.summary = null;
      this.keepalives = 0;
      this.lastTick = 0;
    }

    async start() {
      let response;
      try {
        response = await fetch("/v1/fanout", {
          method: "POST",
          headers: { "content-type": "application/json", accept: "text/event-stream" },
          body: JSON.stringify(this.body),
          signal: this.controller.signal,
        });
      } catch (error) {
        this.end(`could not reach fanout: ${error.message}`);
        return;
      }
      if (!response.ok) {
        this.end(await errorText(response));
        return;
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder("utf-8");
      const parser = new SSEParser((name, data) => this.dispatch(name, data),
                                   () => { this.keepalives += 1; });
      try {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          parser.feed(decoder.decode(value, { stream: true }));
        }
        parser.feed(decoder.decode());
        parser.end();
      } catch (error) {
        if (this.stopped) {
          this.loseAll("cancelled", "stopped in the page (the connection was closed)");
        } else {
          this.loseAll("lost", `the connection to fanout broke: ${error.message}`);
        }
      }
      if (!this.sawDone) {
        this.loseAll("lost", "the response ended before this stream's result");
      }
      this.end(null);
    }

    dispatch(name, data) {
      if (data === "[DONE]") {
        this.sawDone = true;
        return;
      }
      let record;
      try {
        record = JSON.parse(data);
      } catch {
        return; // not a record: nothing to show
      }
      const type = record.type || name;
      if (type === "fanout") {
        this.id = record.id;
        for (const info of record.streams) {
          const column = new Column(info, this.started);
          this.columns.set(info.stream, column);
          this.page.columns.append(column.root);
        }
      } else if (type === "summary") {
        this.summary = record;
      } else {
        const column = this.columns.get(record.stream);
        if (column) column.apply(record);
      }
      this.page.schedule();
    }

    loseAll(status, reason) {
      for (const column of this.columns.values()) column.lose(status, reason);
      this.page.schedule();
    }

    async stop() {
      if (this.finished || this.stopped) return;
      this.stopped = true;
      // Only the streams still running are the Stop's: one cancelled before (mode first)
      // keeps its own label.
      for (const column of this.columns.values()) {
        if (!column.ended) column.stopAsked = true;
      }
      this.page.setStatus("stopping…");
      const cancel = this.id ? fetch(`/v1/fanout/${encodeURIComponent(this.id)}/cancel`,
                                     { method: "POST" }) : null;
      // The streams end on the server, each with its result; if that does not arrive
      // soon, close the connection (the server then cancels them just the same).
      setTimeout(() => { if (!this.finished) this.controller.abort(); }, 3000);
      if (cancel === null) {
        this.controller.abort();
        return;
      }
      try {
        const response = await cancel;
        if (!response.ok && !this.finished) this.controller.abort();
      } catch {
        if (!this.finished) this.controller.abort();
      }
    }

    end(problem) {
      if (this.finished) return;
      this.finished = true;
      this.page.finished(this, problem);
    }

    render(now) {
      const tick = now - this.lastTick > 100;
      if (tick) this.lastTick = now;
      for (const column of this.columns.values()) {
        if (column.dirty) column.render(now);
        else if (tick && !column.ended) column.renderMetrics(now);
      }
    }
  }

  async function errorText(response) {
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) {
        return `HTTP ${response.status}: ${body.error.message}`;
      }
    } catch {
      // not JSON
    }
    return `HTTP ${response.status}`;
  }

  // ---- the page ----
  class Page {
    constructor() {
      this.columns = $("columns");
      this.run = null;
      this.frameRequested = false;
      this.frame = this.frame.bind(this);
    }

    setStatus(text) {
      $("run-status").textContent = text;
    }

    schedule() {
      if (!this.frameRequested) {
        this.frameRequested = true;
        requestAnimationFrame(this.frame);
      }
    }

    frame(now) {
      this.frameRequested = false;
      const run = this.run;
      if (!run) return;
      run.render(now);
      const live = [...run.columns.values()].filter((c) => !c.ended).length;
      if (!run.finished) {
        this.setStatus(run.stopped ? "stopping…" : `${live} streaming · ${run.columns.size} streams`);
        this.schedule(); // keep the clocks ticking while it runs
      } else if (run.summary) {
        this.renderSummary(run.summary, run.columns);
      }
    }

    async loadModels() {
      const note = $("models-note");
      let body;
      try {
        const response = await fetch("/v1/models");
        if (!response.ok) {
          note.textContent = `${await errorText(response)}; type any model id`;
          return;
        }
        body = await response.json();
      } catch (error) {
        note.textContent = `could not load the models: ${error.message}; type any model id`;
        return;
      }
      const list = body.data || [];
      // The config's models first (the [compare] ones checked), then the ones the
      // endpoint's GET /models lists (none checked); any other id can be typed.
      const configured = list.filter((m) => m.source !== "endpoint");
      const listed = list.filter((m) => m.source === "endpoint");
      const anyDefault = configured.some((m) => m.default);
      configured.forEach((model, index) => {
        $("configured").append(
          this.modelBox(model, anyDefault ? Boolean(model.default) : index < 4));
      });
      const options = $("model-ids");
      for (const model of list) {
        const option = el("option");
        option.value = model.id;
        options.append(option);
      }
      if (listed.length) {
        for (const model of listed) $("listed-models").append(this.modelBox(model, false));
        $("listed-summary").textContent =
          `${listed.length} more model${listed.length === 1 ? "" : "s"} the endpoint lists`;
        $("listed").open = configured.length === 0;
        $("listed").hidden = false;
      }
      const problem = body.endpoint_list && body.endpoint_list.error;
      if (problem) {
        note.textContent = `the endpoint's model list is missing: ${problem}; type any model id`;
      } else if (!list.length) {
        note.textContent = "no models configured or listed: type any model id";
      } else {
        note.textContent = "";
        note.hidden = true;
      }
      $("service").textContent = `${list.length} models`;
    }

    modelBox(model, checked) {
      const label = el("label", "model");
      const check = el("input");
      check.type = "checkbox";
      check.value = model.id;
      check.checked = checked;
      label.append(check, el("span", "model-name", model.id));
      if (model.upstream_id !== undefined && model.upstream_id !== model.id) {
        label.append(el("span", "model-id", dialectLabel(model.api, model.upstream_id)));
      } else if (model.api && model.api !== "chat") {
        label.append(el("span", "model-id", dialectLabel(model.api, model.upstream_id)));
      }
      return label;
    }

    // A typed model id: checked, in the list once (an id already offered is checked).
    addModel() {
      const input = $("model-id");
      const id = input.value.trim();
      if (!id) return;
      const box = this.boxes().find((b) => b.value === id);
      if (box) {
        box.checked = true;
      } else {
        $("added").append(this.modelBox({ id }, true));
      }
      input.value = "";
      this.setStatus("");
    }

    boxes() {
      return [...document.querySelectorAll("#models input[type=checkbox]")];
    }

    selected() {
      // A typed id not yet added is run too.
      const typed = $("model-id").value.trim();
      if (typed) this.addModel();
      return [...new Set(this.boxes().filter((box) => box.checked).map((box) => box.value))];
    }

    start() {
      if (this.run && !this.run.finished) return;
      const prompt = $("prompt").value;
      const models = this.selected();
      if (!prompt.trim()) {
        this.setStatus("write a prompt first");
        return;
      }
      if (!models.length) {
        this.setStatus("pick at least one model, or type a model id");
        return;
      }
      const messages = [];
      const system = $("system").value;
      if (system.trim()) messages.push({ role: "system", content: system });
      messages.push({ role: "user", content: prompt });
      const body = { messages, models, stream: true, mode: $("mode").value };
      const maxTokens = parseInt($("max-tokens").value, 10);
      if (maxTokens > 0) body.max_tokens = maxTokens;
      this.columns.replaceChildren();
      $("summary").hidden = true;
      $("summary-rows").replaceChildren();
      $("run").disabled = true;
      $("stop").disabled = false;
      this.setStatus("starting…");
      document.body.dataset.run = "running";
      this.run = new Run(body, this);
      this.run.start();
      this.schedule();
    }

    finished(run, problem) {
      if (run !== this.run) return;
      $("run").disabled = false;
      $("stop").disabled = true;
      const columns = [...run.columns.values()];
      const done = columns.filter((c) => c.status === "completed").length;
      if (problem) this.setStatus(problem);
      else if (run.stopped) this.setStatus(`stopped: ${done} of ${columns.length} completed`);
      else this.setStatus(`finished: ${done} of ${columns.length} completed`);
      document.body.dataset.run = "finished";
      this.schedule();
    }

    renderSummary(summary, columns) {
      const rows = $("summary-rows");
      rows.replaceChildren();
      for (const row of summary.results) {
        const tr = el("tr");
        const [label, tone] = statusLabel(row.outcome, columns.get(row.stream)?.stopAsked);
        const outcome = el("td");
        outcome.append(el("span", `status ${tone}`, label));
        const finish = el("td");
        finish.append(el("span", LOUD_FINISH.has(row.finish_reason) ? "finish loud" : "finish",
                         row.finish_reason ?? "–"));
        const notes = [row.reason, ...(row.flag_labels || [])]
          .filter(Boolean).join(" · ");
        tr.append(el("td", "name", row.stream), outcome, finish, el("td", "num", seconds(row.ttft)),
                  el("td", "num", perSecond(row.tokens_per_second, row.tokens_estimated).replace(" tok/s", "")),
                  el("td", "num", `${row.tokens_estimated ? "≈" : ""}${row.tokens}`),
                  el("td", "num", row.output_chars), el("td", "num", seconds(row.e2e_latency)),
                  el("td", "notes", notes));
        tr.dataset.stream = row.stream;
        rows.append(tr);
      }
      const winner = summary.winner ? ` · first answer: ${summary.winner}` : "";
      $("summary").querySelector("h2").textContent =
        `Summary: ${summary.completed} of ${summary.streams} completed in ${seconds(summary.elapsed)}${winner}`;
      $("summary").hidden = false;
    }
  }

  const page = new Page();
  page.SSEParser = SSEParser;
  window.fanoutPage = page; // for a developer's console, and the browser test

  document.addEventListener("DOMContentLoaded", () => {
    $("ask").addEventListener("submit", (event) => {
      event.preventDefault();
      page.start();
    });
    $("stop").addEventListener("click", () => { if (page.run) page.run.stop(); });
    $("add-model").addEventListener("click", () => page.addModel());
    $("model-id").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.ctrlKey && !event.metaKey) {
        event.preventDefault(); // adds the id; it does not run
        page.addModel();
      }
    });
    document.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        page.start();
      }
    });
    page.loadModels();
  });
})();
