// The loop-org dashboard page: polls the JSON API once a second and redraws what changed.
// Reads and writes carry the session cookie (HttpOnly: this script never sees it); writes are JSON
// POSTs with the page's token in X-Org-Token and an idempotency key made once per button, so a
// double click decides once. Letting a gated command run asks again, showing the whole command.
"use strict";
(function () {
  const B = document.body.dataset;
  const TOKEN = B.token, PAGE = B.page, RUN = B.run;
  const POLL_MS = 1000;
  const NONCE = Math.random().toString(36).slice(2) + Date.now().toString(36);
  const main = document.getElementById("main");
  const drawn = {};

  // ---- small helpers ------------------------------------------------------------------
  function h(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) {
      const v = attrs[k];
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (k === "text") e.textContent = v;
      else if (k === "style") Object.assign(e.style, v);   // CSSOM, which the page's CSP allows
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const kid of kids.flat()) if (kid !== null && kid !== undefined) e.append(kid instanceof Node ? kid : String(kid));
    return e;
  }
  const link = path => path;      // no secret in any URL: the session is a cookie
  const usd = x => "$" + (x || 0).toFixed(4);
  const num = x => (x || 0).toLocaleString("en");
  const counted = (n, noun) => `${n} ${n === 1 ? noun : noun + "s"}`;
  const clock = t => t ? new Date(t * 1000).toLocaleTimeString("en-GB") : "-";
  const pill = s => h("span", { class: "pill " + (s || ""), text: s || "-" });
  const key = (...parts) => parts.join(":") + ":" + NONCE;

  async function api(path) {
    const r = await fetch(path, { headers: { "X-Org-Token": TOKEN }, cache: "no-store" });
    const json = (r.headers.get("content-type") || "").startsWith("application/json");
    const body = json ? await r.json() : await r.text();
    if (!r.ok) throw new Error(json && body.error ? body.error.line : `HTTP ${r.status}`);
    return body;
  }
  async function post(path, body) {
    const r = await fetch(path, { method: "POST", body: JSON.stringify(body),
                                  headers: { "X-Org-Token": TOKEN, "Content-Type": "application/json" } });
    const out = await r.json();
    if (!r.ok) throw new Error(out.error ? out.error.line : `HTTP ${r.status}`);
    return out;
  }
  // a <section>, redrawn only when its data changed (so inputs keep what the user typed)
  function section(id, title, data, draw, cls) {
    let s = document.getElementById(id);
    if (!s) { s = h("section", { id: id, class: cls || "" }); main.append(s); }
    const sig = JSON.stringify(data);
    if (drawn[id] === sig) return;
    drawn[id] = sig;
    s.replaceChildren(h("h2", { text: title }), ...[].concat(draw(data)));
  }
  function table(headers, rows) {
    return h("table", {}, h("tr", {}, headers.map(c => h("th", { class: c.endsWith("#") ? "num" : "", text: c.replace("#", "") }))),
             rows);
  }
  function bar(used, cap, label) {
    const frac = cap ? used / cap : 0;
    return h("div", {}, h("div", { class: "muted", text: label }),
             h("div", { class: "bar" + (frac >= 1 ? " over" : "") }, h("div", { style: { width: `${Math.min(100, frac * 100).toFixed(1)}%` } })));
  }
  function figure(caption, svg, ...extra) { return h("figure", {}, h("figcaption", { text: caption }), svg, ...extra); }

  // ---- actions ------------------------------------------------------------------------
  function decisionForm(d) {
    const input = h("input", { type: "text", placeholder: "edit: the command to run instead · respond: your answer · reject: a reason" });
    const note = h("div", { class: "note" });
    const act = (verdict, stop) => async ev => {
      const buttons = ev.target.parentNode.querySelectorAll("button");
      const command = verdict === "edit" ? input.value : (d.action || {}).command;
      const gated = (verdict === "approve" || verdict === "edit") && (d.action || {}).command;
      if (gated && !window.confirm(`Let this command run with ${d.kind} allowed?\n\n${command}`)) return;
      buttons.forEach(b => b.disabled = true);
      try {
        const out = await post(`/api/decisions/${encodeURIComponent(d.id)}`, {
          verdict: verdict, text: input.value || null, stop: !!stop, confirm: gated ? d.id : undefined,
          idempotency_key: key("decide", d.id, verdict, stop ? "stop" : "") });
        note.className = "note"; note.textContent = `${d.id}: ${out.status}` + (out.replayed ? " (already decided)" : "");
      } catch (e) { note.className = "note err"; note.textContent = e.message; buttons.forEach(b => b.disabled = false); }
    };
    const btn = (label, verdict, stop, cls) => h("button", { class: cls, "data-decision": d.id, "data-verdict": verdict + (stop ? "-stop" : ""),
                                                             onclick: act(verdict, stop), text: label });
    return h("div", { class: "decision", "data-decision": d.id },
      h("div", {}, h("b", { text: d.id }), " ", pill(d.status), " ", h("a", { href: link(`/runs/${d.work_id}`), text: d.work_id }),
        h("span", { class: "muted", text: ` · ${d.kind}` })),
      h("div", { text: d.question }),
      d.status === "pending" ? [input, h("div", { class: "actions" }, btn("approve", "approve", false, "primary"), btn("edit", "edit"),
        btn("respond", "respond"), btn("reject", "reject", false, "danger"), btn("reject & stop the run", "reject", true, "danger")), note] : []);
  }

  function candidateForm(c) {
    const note = h("div", { class: "note" });
    const fields = { name: h("input", { type: "text", value: c.name }), description: h("input", { type: "text", value: c.description }),
                     body: h("textarea", { rows: 6 }) };
    fields.body.value = c.body || "";
    const editor = h("div", { hidden: true }, h("label", { text: "name" }), fields.name, h("label", { text: "description" }),
                     fields.description, h("label", { text: "body" }), fields.body);
    const run = (path, body) => async ev => {
      ev.target.disabled = true;
      try {
        const out = await post(path, body());
        note.className = "note"; note.textContent = out.results ? out.results.map(r => `${r.id}: ${r.status}`).join(", ")
                                                               : `${out.id}: ${out.changed.length ? "changed " + out.changed.join(", ") : "no change"}`;
      } catch (e) { note.className = "note err"; note.textContent = e.message; }
      ev.target.disabled = false;
    };
    const decide = action => run(`/api/candidates/${action}`, () => ({ ids: [c.id], idempotency_key: key("candidate", c.id, action) }));
    const save = run(`/api/candidates/${encodeURIComponent(c.id)}/edit`, () => ({
      name: fields.name.value, description: fields.description.value, body: fields.body.value,
      idempotency_key: key("edit", c.id, fields.name.value, fields.description.value, fields.body.value.length) }));
    return h("div", { class: "candidate", "data-candidate": c.id },
      h("div", {}, h("b", { text: c.name }), " ", pill(c.status), h("span", { class: "muted", text: ` score ${c.score}/5 · ${c.id}` })),
      h("div", { text: c.description }),
      h("div", { class: "actions" },
        h("button", { class: "primary", onclick: decide("approve"), text: "approve" }),
        h("button", { class: "danger", onclick: decide("reject"), text: "reject" }),
        h("button", { onclick: decide("defer"), text: "defer" }),
        h("button", { onclick: () => { editor.hidden = !editor.hidden; }, text: "edit…" }),
        h("button", { onclick: save, text: "save edit" })), editor, note);
  }

  // ---- the org page -------------------------------------------------------------------
  function drawOrg(st, plots, cands) {
    const you = st.needs_you;
    const failed = you.failed_roles.concat(you.unrunnable.map(r => `run ${r.id}`));
    const needs = { decisions: you.decisions, batches: you.batches, candidates: cands.candidates, failed: failed, proposals: you.proposals || [] };
    section("needs", "Needs you", needs, n => {
      const out = [];
      if (!n.decisions.length && !n.batches.length && !n.failed.length && !n.proposals.length) out.push(h("div", { class: "muted", text: "nothing waits for you" }));
      n.failed.forEach(what => out.push(h("div", { class: "note err", text: what.startsWith("run ")
        ? `${what} stopped: its verify commands cannot run (verify_unrunnable)` : `role ${what} failed and is not restarted` })));
      n.decisions.forEach(d => out.push(decisionForm(d)));
      if (n.batches.length) out.push(h("h3", { text: `skill candidates (${n.batches.length} open batch(es))` }), n.candidates.map(candidateForm));
      if (n.proposals.length) out.push(h("h3", { text: `work proposals (${n.proposals.length}): org discover accept ID` }),
        n.proposals.map(p => h("div", { class: "proposal", "data-proposal": p.id }, pill(p.kind), " ", h("b", { text: p.title }),
          h("span", { class: "muted", text: ` · ${p.id}${p.recommended ? " · recommended" : ""}` }))));
      return out;
    }, (needs.decisions.length || needs.batches.length || failed.length || needs.proposals.length) ? "attention" : "");

    const sp = plots.spend;
    section("spend", "Spend", { sp: sp, usage: st.usage }, d => [
      bar(d.sp.usd, d.sp.cap_usd, `${usd(d.sp.usd)} of the org cap ${usd(d.sp.cap_usd)} (limits.total_spend_usd)`),
      h("div", { class: "note muted", text: `${num(d.usage.calls)} model calls · ${num(d.usage.tokens)} tokens` })]);

    const now = Date.now() / 1000;
    section("roles", "Roles", st.roles.map(r => [r.instance, r.activity || r.status, r.pid, r.restarts, r.current_work, Math.round(now - (r.heartbeat_at || now))]),
      rows => table(["role", "status", "pid#", "restarts#", "heartbeat#", "work"], rows.map(([inst, status, pid, restarts, work, age]) =>
        h("tr", { "data-role": inst }, h("td", { text: inst }), h("td", {}, pill(status)), h("td", { class: "num", text: pid || "" }),
          h("td", { class: "num", text: restarts }), h("td", { class: "num", text: `${age}s ago` }),
          h("td", {}, work ? h("a", { href: link(`/runs/${work}`), text: work }) : "")))));

    const views = {};
    st.runs.running.concat(st.runs.recent_ended).forEach(r => { views[r.id] = r; });
    const work = st.work.active.concat(st.work.recent_ended).map(w => Object.assign({}, w, { view: views[w.id] || null }));
    section("runs", "Runs", work, ws => ws.length ? table(["run", "status", "phase", "iteration#", "tokens#", "cost#", "reason", "workspace", "goal"], ws.map(w =>
      h("tr", { "data-run": w.id }, h("td", {}, h("a", { href: link(`/runs/${w.id}`), text: w.id })), h("td", { class: "status" }, pill(w.status)),
        h("td", { class: "phase" }, pill(w.view ? w.view.phase : "")),
        h("td", { class: "num", text: w.view ? `${w.view.iteration.n}` + (w.view.iteration.max === null ? "" : ` of ${w.view.iteration.max}`) : w.iterations }), h("td", { class: "num", text: num(w.tokens) }), h("td", { class: "num", text: usd(w.cost_usd) }),
        h("td", { class: "reason", text: w.stop_reason || (w.status === "waiting" ? w.stop_detail || "" : "") }),
        h("td", { class: "workspace", text: w.workspace }),
        h("td", { text: w.goal.slice(0, 70) })))) : h("div", { class: "muted", text: "no runs yet: org submit" }), "wide");

    section("orders", "Schedules and triggers", st.standing_orders || [], os => os.length ? table(["order", "kind", "rule", "state", "next", "fired#", "skipped#", "last item"],
      os.map(o => h("tr", { "data-order": o.name }, h("td", { text: o.name }), h("td", { text: o.what }), h("td", { text: o.rule }),
        h("td", {}, pill(o.status)), h("td", { text: o.next_due === null ? (o.status === "active" ? "on an event" : "") : new Date(o.next_due * 1000).toLocaleString("en-GB") }),
        h("td", { class: "num", text: o.fired }), h("td", { class: "num", title: o.last_skip || "", text: `${o.skipped_busy} busy · ${o.skipped_spend} cap` }),
        h("td", {}, o.last_work_id ? h("a", { href: link(`/runs/${o.last_work_id}`), text: o.last_work_id }) : "")))
    ) : h("div", { class: "muted", text: "none: org schedule add, org trigger add" }), "wide");

    section("plots", "Plots", plots, drawOrgPlots, "wide");
  }

  function drawOrgPlots(p) {
    const u = p.usage_over_time, runs = p.runs, v = p.verification, L = p.learning;
    const reasons = {};
    runs.forEach(r => { reasons[r.stop_reason] = (reasons[r.stop_reason] || 0) + 1; });
    const passed = v.filter(x => x.outcome === "pass").length;
    const uses = Object.entries(L.skill_uses).map(([name, pts]) => ({ name: name, color: Plots.colorOf(name),
                                                                       points: pts.map(q => ({ x: q.at, y: q.runs })) }));
    return h("div", { class: "plots" },
      figure("org tokens over time (cumulative)", Plots.line("org-tokens", [{ name: "tokens", points: u.map(q => ({ x: q.at, y: q.tokens })) }], { xfmt: clock })),
      figure("org cost over time (cumulative, USD; dashed: the org cap)", Plots.line("org-cost", [{ name: "cost", color: "#1a7f37",
        points: u.map(q => ({ x: q.at, y: q.cost_usd })) }], { xfmt: clock, yfmt: usd, hline: u.length && u[u.length - 1].cost_usd > p.spend.cap_usd / 2 ? p.spend.cap_usd : undefined })),
      figure("iterations per run, recent runs (colour: stop reason)", Plots.bars("runs-iterations", runs.map(r => ({
        label: r.id.slice(-4), value: r.iterations, color: Plots.colorOf(r.stop_reason), title: `${r.id}: ${counted(r.iterations, "iteration")}, ${r.stop_reason}` }))),
        h("div", { class: "legend" }, Object.keys(reasons).map(k => h("span", {}, h("i", { style: { background: Plots.colorOf(k) } }), k)))),
      figure("stop reasons, recent runs", Plots.bars("stop-reasons", Object.entries(reasons).map(([k, n]) => ({ label: k, value: n, color: Plots.colorOf(k) })))),
      figure(`verification time per verdict (s) · pass rate ${v.length ? Math.round(100 * passed / v.length) : 0}% of ${v.length}`,
        Plots.line("verification", [{ name: "verdicts", points: v.map(x => ({ x: x.at, y: x.duration_s, color: x.outcome === "pass" ? "#1a7f37" : "#c62828",
          title: `${x.work_id} #${x.iteration}: ${x.outcome}, ${x.duration_s}s` })) }], { xfmt: clock, lines: false })),
      figure("learning pipeline: raw notes → curated → candidates → skills", Plots.bars("learning", [
        ["raw", L.counts.raw_notes], ["curated", L.counts.curated_notes], ["candidates", L.counts.skill_candidates], ["skills", L.counts.skills]]
        .map(([label, value], i) => ({ label: label, value: value, color: ["#6b7280", "#0f7c8a", "#b26a00", "#1a7f37"][i] })))),
      figure("skill uses over time (runs that carried each skill)", Plots.line("skill-uses", uses, { xfmt: clock, empty: "no skill used yet" })));
  }

  // ---- the run page -------------------------------------------------------------------
  // a cap the run has is a bar (used of cap); a quantity it has no cap on is its number alone
  function capped(name, used, cap, fmt, label) {
    const none = cap === null || cap === undefined;
    return h("div", { class: "cap", "data-cap": name, "data-used": used, "data-limit": none ? "" : cap },
      none ? [h("span", { class: "muted", text: `${label} ` }), fmt(used)] : bar(used, cap, `${label} ${fmt(used)} of ${fmt(cap)}`));
  }

  function drawRun(item, plots, decisions, transcript) {
    // what an empty part of the page means: still to come while the run goes on, never once it ended
    const ended = item.status === "ended";
    const never = what => `${what}: the run ended ${item.stop_reason || ""}`.trim();
    const lastVerdict = item.verdicts.length ? item.verdicts[item.verdicts.length - 1] : null;
    const failingNow = transcript.attempts.filter(a => a.verdict && a.verdict.outcome !== "pass").slice(-1)
      .filter(a => lastVerdict && a.verdict.id === lastVerdict.id).map(a => a.verdict);
    section("summary", item.id, { item: item, failing: failingNow }, ({ item: w, failing: fv }) => [
      h("div", { id: "run-status" }, pill(w.status), w.stop_reason ? [" ", h("b", { class: "stop-reason", text: w.stop_reason }),
        h("span", { class: "stop-detail", text: ` — ${w.stop_detail || ""}` })] : ""),
      w.run.stop ? h("div", { id: "run-hint", class: "note", text: `next: ${w.run.stop.hint}` }) : "",
      fv.length ? h("div", { id: "run-failing" }, DashPages.failing(D, fv[0])) : "",
      h("div", { class: "kv" }, h("span", { class: "muted", text: "phase" }), h("span", { id: "run-phase" }, pill(w.run.phase),
          ` iteration ${w.run.iteration.n}` + (w.run.iteration.max === null ? "" : ` of ${w.run.iteration.max}`),
          w.run.current_tool ? ` · now: ${w.run.current_tool.call}` : "",
          w.run.ladder ? ` · model ladder ${w.run.ladder.label}` : ""),
        h("span", { class: "muted", text: "verdict" }), h("span", { text: w.run.verdict ? `#${w.run.verdict.iteration}: ${w.run.verdict.line}` : "-" }),
        h("span", { class: "muted", text: "goal" }), h("span", { text: w.goal }),
        h("span", { class: "muted", text: "workspace" }), h("span", { text: w.workspace }),
        h("span", { class: "muted", text: "caps" }), h("span", { id: "run-caps", text: Object.entries(w.run.caps || {}).map(([k, c]) =>
          `${k}=${c.value === null ? "none" : c.value}${c.from ? ` (${c.from})` : ""}`).join(", ") || "-" }),
        h("span", { class: "muted", text: "backend" }), h("span", { text: `${w.backend} · ${w.assigned_to || "unassigned"}` })),
      capped("iterations", w.run.iteration.committed, w.run.iteration.max, String, "iterations committed"),
      capped("tokens", w.run.tokens.used, w.run.tokens.cap, num, "budget tokens"),
      capped("cost", w.run.cost_usd.used, w.run.cost_usd.cap, usd, "cost"),
      capped("elapsed", w.run.elapsed_s.used, w.run.elapsed_s.cap, x => `${(x || 0).toFixed(1)}s`, "elapsed"),
      w.stop_history.map(s => h("div", { class: "note muted", text: `ending ${s.seq}: ${s.stop_reason} after ${counted(s.iterations, "iteration")}, continued by ${s.continued_by}` }))]);

    const mine = decisions.filter(d => d.work_id === RUN);
    section("run-decisions", "Decisions", mine, ds => ds.length ? ds.map(decisionForm) : h("div", { class: "muted", text: "none asked" }),
            mine.some(d => d.status === "pending") ? "attention" : "");

    section("run-plots", "Tokens and cost", plots, p => h("div", { class: "plots" },
      figure(`tokens over time (cumulative, ${p.calls} model calls)`, Plots.line("run-tokens", [{ name: "tokens",
        points: p.usage_over_time.map(q => ({ x: q.at, y: q.tokens, title: `iteration ${q.iteration}: ${num(q.tokens)} tokens` })) }],
        { xfmt: clock, empty: ended ? never("no model call was made") : "no model call yet" })),
      figure("cost over time (cumulative, USD)", Plots.line("run-cost", [{ name: "cost", color: "#1a7f37",
        points: p.usage_over_time.map(q => ({ x: q.at, y: q.cost_usd })) }],
        { xfmt: clock, yfmt: usd, empty: ended ? never("nothing was spent") : "no cost yet" })),
      figure("tokens per iteration", Plots.bars("run-iterations", p.per_iteration.map(i => ({ label: `#${i.n}`, value: i.tokens,
        title: `iteration ${i.n}: ${num(i.tokens)} tokens, ${usd(i.cost_usd)}, ${i.elapsed_s.toFixed(1)}s` })),
        { empty: ended ? never("no iteration was committed") : "no iteration yet" }))), "wide");

    const verdicts = {};
    item.verdicts.forEach(v => { verdicts[v.iteration] = v; });
    const rows = item.iterations_detail.map(it => ({ it: it, v: verdicts[it.n] || null }));
    section("timeline", "Iterations", rows, rs => rs.length ? table(["#", "attempt#", "act", "verdict", "lesson", "tokens#", "cost#", "time#", ""],
      rs.map(({ it, v }) => h("tr", { "data-iteration": it.n }, h("td", { text: it.n }), h("td", { class: "num", text: it.attempt }),
        h("td", {}, pill(it.act_status)), h("td", {}, pill(v ? v.outcome : "pending")), h("td", { text: it.lesson || "" }),
        h("td", { class: "num", text: num(it.input_tokens + it.output_tokens + it.cache_write_tokens + it.cache_read_tokens) }),
        h("td", { class: "num", text: usd(it.cost_usd) }), h("td", { class: "num", text: `${it.elapsed_s.toFixed(1)}s` }),
        h("td", {}, h("button", { "data-diff": it.n, onclick: () => showDiff(it.n), text: "diff" })))))
      : h("div", { class: "muted", text: ended ? never("no iteration was committed") : "no iteration committed yet" }), "wide");

    const last = lastVerdict;
    section("verdict", "Latest verdict", last, v => v ? [h("div", {}, `iteration ${v.iteration}: `, pill(v.outcome), h("span", { class: "muted", text: ` by ${v.written_by}` })),
      v.feedback ? h("pre", { class: "feedback", text: v.feedback }) : ""] : h("div", { class: "muted", text: ended ? never("never verified") : "not verified yet" }));

    section("transcript", "Transcript: what the doer did", transcript, t => DashPages.transcript(D, t,
      ended ? never("the doer never acted") : "no act yet"), "wide");
  }

  // ---- the cost and knowledge pages ---------------------------------------------------
  let costBy = new URLSearchParams(location.search).get("by") || "item";
  function drawCost(data) {
    section("cost", "Cost per task: tokens and dollars", data, d => DashPages.cost(D, d, by => { costBy = by; tick(true); }), "wide");
  }
  function drawKnowledge(k) {
    const parts = DashPages.knowledge(D, k);
    section("knowledge-pipeline", "What the org learned: raw notes → curated → candidates → skills", k.counts, () => parts.pipeline, "wide");
    section("knowledge-batches", "Open batches: review the candidates", { b: k.open_batches, f: k.candidate_forms }, () => parts.batches,
            k.open_batches.length ? "attention wide" : "wide");
    section("knowledge-curated", "Curated notes and their evidence", k.curated, () => parts.curated, "wide");
    section("knowledge-decided", "Decided and earlier candidates", k.candidate_forms, () => parts.decided);
    section("knowledge-skills", "Skills and their use", k.skills, () => parts.skills);
  }

  async function showDiff(n) {
    let s = document.getElementById("diff");
    if (!s) { s = h("section", { id: "diff", class: "wide" }); main.append(s); }
    try {
      const patch = await api(`/api/runs/${encodeURIComponent(RUN)}/diff?iteration=${n}`);
      const pre = h("pre", { class: "diff" }, patch.split("\n").map(l => h("span", {
        class: l.startsWith("@@") ? "hunk" : l.startsWith("+") && !l.startsWith("+++") ? "add" : l.startsWith("-") && !l.startsWith("---") ? "del" : "",
        text: l + "\n" })));
      s.replaceChildren(h("h2", { text: `What iteration ${n} changed` }), patch ? pre : h("div", { class: "muted", text: "no change" }));
    } catch (e) { s.replaceChildren(h("h2", { text: `Iteration ${n}` }), h("div", { class: "note err", text: e.message })); }
    s.scrollIntoView();
  }

  // ---- polling ------------------------------------------------------------------------
  const D = { h: h, section: section, table: table, pill: pill, usd: usd, num: num, link: link, figure: figure,
              candidateForm: candidateForm, showDiff: showDiff };
  const live = document.getElementById("live");
  document.getElementById("home").href = link("/");
  document.querySelectorAll("nav a[data-path]").forEach(a => { a.href = link(a.dataset.path); });
  if (PAGE === "run") document.getElementById("crumb").textContent = `run ${RUN}`;
  if (PAGE === "cost" || PAGE === "knowledge") document.getElementById("crumb").textContent = PAGE;
  let timer = null, lastTranscript = { mark: null, data: null };
  async function tick(once) {
    if (once && timer) clearTimeout(timer);
    try {
      if (PAGE === "run") {
        const [item, plots, ds] = await Promise.all([api(`/api/runs/${encodeURIComponent(RUN)}`), api(`/api/runs/${encodeURIComponent(RUN)}/plots`),
                                                     api("/api/decisions")]);
        // the transcript grows with each model response and each close of an attempt: read again only then
        const mark = `${plots.calls}:${item.updated_at}:${item.attempts.length}:${item.run.current_tool ? item.run.current_tool.call : ""}`;
        if (mark !== lastTranscript.mark) lastTranscript = { mark: mark, data: await api(`/api/runs/${encodeURIComponent(RUN)}/transcript`) };
        drawRun(item, plots, ds, lastTranscript.data);
      } else if (PAGE === "cost") {
        drawCost(await api(`/api/cost?by=${encodeURIComponent(costBy)}`));
      } else if (PAGE === "knowledge") {
        drawKnowledge(await api("/api/knowledge"));
      } else {
        const [st, plots, cands] = await Promise.all([api("/api/org"), api("/api/plots"), api("/api/candidates")]);
        drawOrg(st, plots, cands);
      }
      live.className = ""; live.textContent = `live · updated ${clock(Date.now() / 1000)}`;
    } catch (e) { live.className = "down"; live.textContent = e.message; }
    timer = setTimeout(tick, POLL_MS);
  }
  tick();
})();
