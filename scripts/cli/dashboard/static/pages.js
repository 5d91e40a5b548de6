// The dashboard's transcript timeline (on a run's page), its cost page and its knowledge page.
// dashboard.js calls these with its helpers (D: h, section, table, pill, usd, num, link, figure,
// candidateForm, showDiff); every string from the org is set as text, never as markup.
"use strict";
window.DashPages = (function () {
  const SHORT = 90;
  const short = s => { s = String(s === undefined || s === null ? "" : s); return s.length > SHORT ? s.slice(0, SHORT) + "…" : s; };
  const json = v => JSON.stringify(v === undefined ? null : v);
  const opened = new Set();      // tool calls a person opened: still open after a redraw of a live run

  function attemptState(a) {
    if (a.wrapup) return "wrap-up";
    if (a.discarded) return "discarded: " + a.outcome;
    return a.outcome === null ? "acting" : a.outcome;
  }

  // one tool call with its result, folded: the summary is the call, the body its input and output
  function toolCall(D, call, result) {
    const h = D.h;
    const ok = !result || result.data.ok !== false;
    const id = `${call.attempt}:${call.seq}`;
    return h("details", { class: "tool", "data-tool": call.data.id || "", "data-name": call.data.name || "", open: opened.has(id),
                          ontoggle: ev => { if (ev.target.open) opened.add(id); else opened.delete(id); } },
      h("summary", {}, h("span", { class: "arrow", text: "→ " }), h("b", { text: call.data.name || "?" }), " ",
        h("span", { class: "muted", text: short(json(call.data.input)) }), " ",
        D.pill(result ? (ok ? "ok" : "error" + (result.data.code ? " " + result.data.code : "")) : "no result")),
      h("div", { class: "muted", text: "input" }), h("pre", { class: "input", text: JSON.stringify(call.data.input, null, 2) }),
      result ? [h("div", { class: "muted", text: "output" }), h("pre", { class: "output", text: String(result.data.output || "") })] : "");
  }

  function entries(D, list) {
    const h = D.h, out = [], results = {};
    list.forEach(e => { if (e.kind === "tool_result" && e.data.id) results[e.data.id] = e; });
    list.forEach(e => {
      const d = e.data;
      if (e.kind === "prompt") out.push(h("details", { class: "prompt" }, h("summary", { class: "muted",
        text: `${d.wrapup ? "wrap-up prompt" : "prompt"} (${String(d.text || "").length} characters)` }), h("pre", { text: String(d.text || "") })));
      else if (e.kind === "turn") out.push(h("div", { class: "turn muted", text: `turn ${d.turn || "?"} · ${d.model || "?"}` +
        (d.input_tokens !== undefined ? ` · in ${D.num(d.input_tokens)} out ${D.num(d.output_tokens)} cache-w ${D.num(d.cache_write_tokens)} cache-r ${D.num(d.cache_read_tokens)}` : "") +
        (d.stop_reason ? ` · ${d.stop_reason}` : "") }));
      else if (e.kind === "text") out.push(h("p", { class: "said", text: String(d.text || "") }));
      else if (e.kind === "tool_call") out.push(toolCall(D, e, results[d.id]));
      else if (e.kind === "tool_result" && !list.some(c => c.kind === "tool_call" && c.data.id === d.id))
        out.push(h("pre", { class: "output", text: String(d.output || "") }));
      else if (e.kind === "outcome") out.push(h("div", { class: "outcome" }, "act ", D.pill(d.status), ` after ${d.turns} turn(s)`,
        d.error_code ? h("span", { class: "muted", text: ` — ${d.error_code}: ${d.error || ""}` }) : ""));
      else if (e.kind === "cut") out.push(h("div", { class: "note err", text: `transcript cut: ${d.note || ""}` }));
    });
    return out;
  }

  function failing(D, v) {
    const h = D.h;
    return v.failing.map(f => h("div", { class: "failing" }, h("div", {}, h("b", { text: "failing " }), h("code", { text: f.command || f.name || "" }),
      h("span", { class: "muted", text: f.code ? ` could not run (${f.code})` : f.timed_out ? " timed out" : ` exit ${f.exit_code}` })),
      h("pre", { class: "output", text: f.output })));
  }

  // the run page's timeline: per iteration, its attempts (discarded ones marked), each act's
  // turns and tool calls, the verdict with its failing output, the lesson, the iteration's diff;
  // ``empty`` says what no attempt means (an ended run's page never says "yet")
  function transcript(D, data, empty) {
    const h = D.h;
    if (!data.attempts.length) return h("div", { class: "muted", text: empty || "no act yet" });
    const byIteration = [];
    data.attempts.forEach(a => {
      let g = byIteration.find(x => x.n === a.iteration);
      if (!g) { g = { n: a.iteration, attempts: [] }; byIteration.push(g); }
      g.attempts.push(a);
    });
    return byIteration.map(g => h("div", { class: "iteration", "data-iteration": g.n },
      h("h3", {}, `iteration ${g.n} `, h("button", { "data-diff": g.n, onclick: () => D.showDiff(g.n), text: "diff" })),
      g.attempts.map(a => h("div", { class: "attempt" + (a.discarded ? " discarded" : ""), "data-attempt": a.attempt },
        h("div", { class: "attempt-head" }, h("b", { text: `attempt ${a.attempt} ` }), D.pill(attemptState(a)),
          a.usage.length ? h("span", { class: "muted", text: ` · ${a.usage.length} model call(s), ` +
            `${D.num(a.usage.reduce((t, u) => t + u.input_tokens + u.output_tokens + u.cache_write_tokens, 0))} budget tokens, ` +
            D.usd(a.usage.reduce((t, u) => t + u.cost_usd, 0)) }) : ""),
        entries(D, a.entries),
        a.verdict !== undefined ? h("div", { class: "verdict" }, h("div", {}, "verdict ", D.pill(a.verdict ? a.verdict.outcome : "pending")),
          a.verdict ? failing(D, a.verdict) : "",
          a.lesson ? h("div", { class: "lesson" }, h("b", { text: "lesson " }), a.lesson) : "",
          (a.decisions || []).map(d => h("div", { class: "muted", text: `decision ${d.id} (${d.kind}, ${d.status}): ${d.command || d.question}` }))) : ""))));
  }

  // the cost page: one grouping at a time, its plot and its table; totals as org cost prints them
  function cost(D, data, choose) {
    const h = D.h, rows = data.rows, t = data.total;
    const pick = by => h("button", { class: by === data.by ? "primary" : "", "data-by": by, onclick: () => choose(by), text: by });
    const cells = r => [h("td", { class: "num", text: r.items }), h("td", { class: "num", text: r.calls }),
      h("td", { class: "num", text: D.num(r.input_tokens) }), h("td", { class: "num", text: D.num(r.output_tokens) }),
      h("td", { class: "num", text: D.num(r.cache_write_tokens) }), h("td", { class: "num", text: D.num(r.cache_read_tokens) }),
      h("td", { class: "num cost", text: D.usd(r.cost_usd) })];
    return [
      h("div", { class: "actions" }, "by ", ["item", "goal", "model", "day"].map(pick)),
      h("div", { id: "cost-total", "data-cost": t.cost_usd, "data-tokens": t.tokens, "data-calls": t.calls,
                 text: `total ${D.usd(t.cost_usd)} · ${D.num(t.tokens)} tokens (${D.num(t.budget_tokens)} without cache reads) · ${D.num(t.calls)} model calls` }),
      h("div", { class: "plots" }, ["cost", "tokens"].map(what => D.figure(
        what === "cost" ? `cost by ${data.by} (USD)` : `tokens by ${data.by} (all four kinds)`,
        Plots.bars(`${what}-${data.by}`, rows.slice(0, 24).map(r => ({
          label: data.by === "item" ? r.key.slice(-6) : r.key.slice(0, 14), value: what === "cost" ? r.cost_usd : r.tokens,
          color: Plots.colorOf(r.key), title: `${r.key}: ${D.usd(r.cost_usd)}, ${D.num(r.tokens)} tokens` })))))),
      D.table([data.by, "items#", "calls#", "input#", "output#", "cache write#", "cache read#", "cost#", "models"],
        rows.map(r => h("tr", { "data-key": r.key }, h("td", {}, data.by === "item" && r.key.startsWith("w-")
          ? h("a", { href: D.link(`/runs/${r.key}`), text: r.key }) : r.key), cells(r),
          h("td", { class: "muted", text: Object.keys(r.models).join(", ") }))).concat(
          [h("tr", { class: "total" }, h("td", { text: "total" }), cells(t), h("td", {}))]))];
  }

  // the knowledge page: the pipeline with counts, each stage's evidence, the open batches with
  // their candidates (approve / reject / defer / edit), decided candidates, skills and their use
  function knowledge(D, k) {
    const h = D.h, c = k.counts;
    const runs = ids => (ids || []).slice(0, 4).join(", ") + ((ids || []).length > 4 ? ` +${ids.length - 4}` : "");
    const open = new Set(k.open_batches.map(b => b.id));
    const forms = k.candidate_forms;
    const evidence = {};
    k.candidates.forEach(x => { evidence[x.id] = x; });
    return {
      pipeline: [h("div", { id: "pipeline", class: "pipeline" },
          [["raw notes", c.raw, "raw"], ["curated", c.curated, "curated"], ["candidates", c.candidates, "candidates"], ["skills", c.skills, "skills"]]
            .flatMap(([label, n, id], i) => [i ? h("span", { class: "muted", text: " → " }) : "", h("span", { class: "stage", "data-stage": id },
              h("b", { text: String(n) }), " " + label)])),
        h("div", { class: "muted", text: `${c.recommended} curated note(s) recommended · ${c.pending} candidate(s) pending · raw notes from ${k.raw.runs} run(s)` }),
        ...k.raw.skipped_runs.map(s => h("div", { class: "muted", text: `no notes from ${s.run}: ${s.why}` }))],
      batches: k.open_batches.length ? k.open_batches.map(b => h("div", { class: "batch", "data-batch": b.id },
          h("h3", { text: `batch ${b.id}` }),
          forms.filter(f => f.batch_id === b.id).flatMap(f => [D.candidateForm(f),
            evidence[f.id] ? h("div", { class: "muted evidence", text: `from ${evidence[f.id].curated || "-"} · runs ${runs(evidence[f.id].runs)}` }) : ""])))
        : h("div", { class: "muted", text: "no open batch: candidates come when curated patterns score high enough" }),
      decided: forms.filter(f => !open.has(f.batch_id)).length ? D.table(["candidate", "status", "score#", "batch"],
          forms.filter(f => !open.has(f.batch_id)).map(f => h("tr", { "data-candidate": f.id }, h("td", { text: f.name }),
            h("td", {}, D.pill(f.status)), h("td", { class: "num", text: f.score }), h("td", { text: f.batch_id || "" }))))
        : h("div", { class: "muted", text: "none" }),
      curated: k.curated.length ? D.table(["note", "kind", "tier", "score#", "notes#", "runs", "topic"], k.curated.map(x =>
          h("tr", { "data-curated": x.id }, h("td", { text: x.id }), h("td", { text: x.kind }), h("td", {}, D.pill(x.tier)),
            h("td", { class: "num", text: x.score === null ? "-" : x.score }), h("td", { class: "num", text: x.notes.length }),
            h("td", { text: runs(x.runs) }), h("td", { text: x.topic })))) : h("div", { class: "muted", text: "none yet" }),
      skills: k.skills.length ? D.table(["skill", "status", "uses#", "used in", "learned from"], k.skills.map(x =>
          h("tr", { "data-skill": x.name }, h("td", { text: x.name }), h("td", {}, D.pill(x.status)), h("td", { class: "num", text: x.uses }),
            h("td", { text: runs(x.used_in) }), h("td", { text: runs(x.learned_from) })))) : h("div", { class: "muted", text: "none yet" }),
    };
  }

  return { transcript: transcript, cost: cost, knowledge: knowledge, failing: failing };
})();
