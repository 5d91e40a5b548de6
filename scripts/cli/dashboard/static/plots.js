// Plots for the loop-org dashboard: line, scatter and bar charts drawn as inline SVG.
// Hand-written because the page must work offline and needs only three chart kinds; each
// <svg> carries data-plot (its name) and data-points (how many marks it drew).
"use strict";
(function () {
  const NS = "http://www.w3.org/2000/svg";
  const W = 420, H = 190, L = 52, R = 12, T = 12, B = 34;
  const CHAR_W = 6.6;    // the width of one character of the plots' 12px text, in viewBox units
  const PALETTE = ["#2557d6", "#1a7f37", "#c62828", "#b26a00", "#7b3fb8", "#0f7c8a", "#8a5a00", "#d63384"];

  function node(tag, attrs, parent) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function text(parent, x, y, s, anchor) {
    const t = node("text", { x: x, y: y, "text-anchor": anchor || "start" }, parent);
    t.textContent = s;
    return t;
  }
  // A bar's label, whole: on one line when it fits the bar's width, else broken after its "_" or "-"
  // onto two lines; never cut (a cut "repeated_failu" names no stop reason).
  function label(svg, x, s, room) {
    const t = text(svg, x, H - B + 14, "", "middle");
    const parts = s.length * CHAR_W <= room ? [s] : split(s);
    parts.forEach((p, i) => {
      const span = node("tspan", { x: x, dy: i ? 12 : 0 }, t);
      span.textContent = p;
    });
    t.setAttribute("data-label", s);
    return t;
  }
  function split(s) {
    const cut = Math.max(s.lastIndexOf("_", Math.ceil(s.length / 2)), s.lastIndexOf("-", Math.ceil(s.length / 2)));
    const at = cut > 0 ? cut + 1 : s.indexOf("_") + 1;
    return at > 0 && at < s.length ? [s.slice(0, at), s.slice(at)] : [s];
  }
  function frame(name) {
    return node("svg", { class: "plot", viewBox: `0 0 ${W} ${H}`, "data-plot": name, role: "img" });
  }
  function range(values) {
    let lo = Math.min(...values), hi = Math.max(...values);
    if (!isFinite(lo)) { lo = 0; hi = 1; }
    if (lo === hi) { hi = lo + (lo === 0 ? 1 : Math.abs(lo) * 0.1); }
    return [lo, hi];
  }
  function empty(svg, why) {
    svg.setAttribute("data-points", "0");
    text(svg, W / 2, H / 2, why || "no data yet", "middle");
    return svg;
  }
  function colorOf(key) {
    let h = 0;
    for (const c of String(key)) h = (h * 31 + c.charCodeAt(0)) >>> 0;
    return PALETTE[h % PALETTE.length];
  }

  // series: [{name, color?, points: [{x, y, title?}]}]; opts: {xfmt, yfmt, lines (default true), y0 (start y at 0)}
  function line(name, series, opts) {
    opts = opts || {};
    const svg = frame(name);
    const all = series.flatMap(s => s.points);
    if (!all.length) return empty(svg, opts.empty);
    const [x0, x1] = range(all.map(p => p.x));
    let [y0, y1] = range(all.map(p => p.y));
    if (opts.y0 !== false) y0 = Math.min(0, y0);
    if (opts.y1 !== undefined) y1 = Math.max(y1, opts.y1);
    const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R);
    const sy = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
    node("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }, svg);
    node("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }, svg);
    const yf = opts.yfmt || (v => String(+v.toPrecision(3)));
    const xf = opts.xfmt || (v => String(+v.toPrecision(3)));
    text(svg, L - 4, sy(y1) + 4, yf(y1), "end");
    text(svg, L - 4, sy(y0), yf(y0), "end");
    text(svg, L, H - B + 14, xf(x0));
    text(svg, W - R, H - B + 14, xf(x1), "end");
    if (opts.hline !== undefined) {
      node("line", { x1: L, x2: W - R, y1: sy(opts.hline), y2: sy(opts.hline), stroke: "#c62828",
                     "stroke-dasharray": "4 3" }, svg);
    }
    let count = 0;
    series.forEach((s, i) => {
      const color = s.color || PALETTE[i % PALETTE.length];
      if (opts.lines !== false && s.points.length > 1) {
        node("polyline", { fill: "none", stroke: color, "stroke-width": 1.6,
                           points: s.points.map(p => `${sx(p.x).toFixed(1)},${sy(p.y).toFixed(1)}`).join(" ") }, svg);
      }
      for (const p of s.points) {
        const c = node("circle", { class: "pt", cx: sx(p.x).toFixed(1), cy: sy(p.y).toFixed(1), r: 2.6,
                                   fill: p.color || color, "data-series": s.name || "" }, svg);
        node("title", {}, c).textContent = p.title || `${s.name || ""} ${xf(p.x)}: ${yf(p.y)}`;
        count++;
      }
    });
    svg.setAttribute("data-points", String(count));
    return svg;
  }

  // items: [{label, value, color?, title?}]
  function bars(name, items, opts) {
    opts = opts || {};
    const svg = frame(name);
    if (!items.length) return empty(svg, opts.empty);
    const hi = Math.max(1, ...items.map(i => i.value));
    const bw = (W - L - R) / items.length;
    node("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }, svg);
    text(svg, L - 4, T + 8, String(+hi.toPrecision(3)), "end");
    text(svg, L - 4, H - B, "0", "end");
    items.forEach((it, i) => {
      const h = it.value / hi * (H - T - B);
      const r = node("rect", { class: "pt", x: (L + i * bw + bw * 0.12).toFixed(1), y: (H - B - h).toFixed(1),
                               width: (bw * 0.76).toFixed(1), height: Math.max(h, 0.5).toFixed(1),
                               fill: it.color || PALETTE[0] }, svg);
      node("title", {}, r).textContent = it.title || `${it.label}: ${it.value}`;
      if (items.length <= 12) label(svg, L + i * bw + bw / 2, String(it.label), bw);
    });
    svg.setAttribute("data-points", String(items.length));
    return svg;
  }

  window.Plots = { line: line, bars: bars, colorOf: colorOf };
})();
