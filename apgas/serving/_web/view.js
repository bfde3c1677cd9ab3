// Draws a view model (see apgas/_webview.py) as SVG charts and tables.
// Text always goes in through textContent: job names and labels are data.
"use strict";
(function () {
  const NS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939",
    "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1"];
  const W = 1000;

  function colour(key) {
    const s = String(key);
    let n = /^[0-9]+$/.test(s) ? parseInt(s, 10) : 0;
    if (!/^[0-9]+$/.test(s)) for (const c of s) n = (n * 31 + c.charCodeAt(0)) >>> 0;
    return PALETTE[n % PALETTE.length];
  }

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function svgEl(tag, attrs, text) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function fmtTime(t, span) {
    if (span >= 7200) return (t / 3600).toFixed(t % 3600 === 0 ? 0 : 1) + "h";
    if (span >= 20) return Math.round(t) + "s";
    if (span >= 2) return t.toFixed(1) + "s";
    return t.toFixed(2) + "s";
  }

  function fmtValue(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "number") {
      if (Number.isInteger(v)) return v.toLocaleString("en-US");
      if (Math.abs(v) >= 100) return v.toFixed(0);
      return String(parseFloat(Math.abs(v) >= 1 ? v.toFixed(2) : v.toPrecision(3)));
    }
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }

  function ticks(lo, hi, count) {
    const span = Math.max(hi - lo, 1e-9);
    const raw = span / count;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return out;
  }

  function timeAxis(svg, x, t0, t1, top, bottom) {
    const g = svgEl("g", {class: "axis"});
    for (const t of ticks(t0, t1, 10)) {
      const xx = x(t);
      g.append(svgEl("line", {class: "grid-line", x1: xx, x2: xx, y1: top, y2: bottom}));
      g.append(svgEl("text", {x: xx, y: bottom + 13, "text-anchor": "middle"}, fmtTime(t, t1 - t0)));
    }
    g.append(svgEl("line", {x1: x(t0), x2: x(t1), y1: bottom, y2: bottom}));
    svg.append(g);
  }

  function drawMarks(svg, marks, x, rowTop, rowBottom, top, bottom) {
    let lastEnd = -Infinity;
    for (const m of [...(marks || [])].sort((a, b) => a.t - b.t)) {
      const g = svgEl("g", {class: "mark " + m.kind, "data-key": String(m.key)});
      const xx = x(m.t);
      const rows = m.rows && m.rows.length ? m.rows : null;
      const y1 = rows ? Math.min(...rows.map(rowTop)) : top;
      const y2 = rows ? Math.max(...rows.map(rowBottom)) : bottom;
      g.append(svgEl("title", {}, m.label));
      g.append(svgEl("line", {x1: xx, x2: xx, y1: y1, y2: y2}));
      g.append(svgEl("line", {x1: xx, x2: xx, y1: top - 4, y2: y1, "stroke-opacity": 0.35}));
      const short = m.short || m.kind;
      if (xx > lastEnd + 4) {
        g.append(svgEl("text", {x: xx + 2, y: top - 6}, short));
        lastEnd = xx + 2 + short.length * 5.6;
      }
      svg.append(g);
    }
  }

  function legend(entries) {
    const box = el("div", {class: "legend"});
    for (const [key, label] of entries) {
      const item = el("span", {"data-key": String(key)});
      const swatch = el("i");
      swatch.style.background = colour(key);
      item.append(swatch, document.createTextNode(label));
      box.append(item);
    }
    return box;
  }

  const MARK_NAMES = {grow: "grow", shrink: "shrink", failed: "failed"};

  function markLegend(marks) {
    const kinds = [...new Set((marks || []).map(m => m.kind))].filter(k => MARK_NAMES[k]);
    const box = el("div", {class: "legend"});
    for (const kind of kinds) {
      const item = el("span", {class: "mark-key " + kind});
      item.append(el("i"), document.createTextNode(MARK_NAMES[kind]));
      box.append(item);
    }
    return kinds.length ? [box] : [];
  }

  function gantt(section, model) {
    const rows = section.rows || [];
    const t0 = model.t0 || 0, t1 = Math.max(model.t1 || 0, t0 + 1e-6);
    const rowH = rows.length > 40 ? Math.max(4, 640 / rows.length) : 16;
    const labelW = Math.min(170, 12 + 6.2 * Math.max(4, ...rows.map(r => String(r).length)));
    const top = 26, bottom = top + rowH * Math.max(rows.length, 1);
    const x = t => labelW + (t - t0) / (t1 - t0) * (W - labelW - 16);
    const svg = svgEl("svg", {viewBox: `0 0 ${W} ${bottom + 22}`, role: "img",
      "aria-label": section.title || ""});
    timeAxis(svg, x, t0, t1, top, bottom);
    rows.forEach((label, i) => {
      if (rowH >= 9) svg.append(svgEl("text", {class: "row-label", x: labelW - 6,
        y: top + i * rowH + rowH * 0.72, "text-anchor": "end"}, label));
    });
    for (const [row, a, b, key, text] of section.bars || []) {
      const xa = x(Math.max(a, t0)), xb = x(Math.min(b, t1));
      const rect = svgEl("rect", {class: "bar", x: xa, y: top + row * rowH + 1,
        width: Math.max(xb - xa, 0.8), height: Math.max(rowH - 2, 1), fill: colour(key),
        "data-key": String(key)});
      rect.append(svgEl("title", {}, `${rows[row]}: ${text} from ${fmtTime(a, t1 - t0)} to ` +
        fmtTime(b, t1 - t0)));
      svg.append(rect);
      if (text && xb - xa > 7 * String(text).length + 6 && rowH >= 11) {
        svg.append(svgEl("text", {class: "bar-text", x: (xa + xb) / 2, y: top + row * rowH + rowH * 0.72,
          "text-anchor": "middle"}, text));
      }
    }
    drawMarks(svg, section.marks, x, r => top + r * rowH, r => top + (r + 1) * rowH, top, bottom);
    if (!rows.length) svg.append(svgEl("text", {x: W / 2, y: top + 12, "text-anchor": "middle"}, "nothing yet"));
    const out = [svg];
    const entries = Object.entries(section.legend || {});
    if (entries.length) out.push(legend(entries));
    return out.concat(markLegend(section.marks));
  }

  function series(section, model) {
    const t0 = model.t0 || 0, t1 = Math.max(model.t1 || 0, t0 + 1e-6);
    const all = (section.series || []).flatMap(s => s.points.map(p => p[1]));
    const ymax = Math.max(section.ymax || 0, ...all, 1e-9);
    const top = 26, bottom = 226;
    const left = 12 + 6.5 * Math.max(3, ...ticks(0, ymax, 5).map(v => fmtValue(v).length));
    const x = t => left + (t - t0) / (t1 - t0) * (W - left - 16);
    const y = v => bottom - v / ymax * (bottom - top);
    const svg = svgEl("svg", {viewBox: `0 0 ${W} ${bottom + 22}`, role: "img",
      "aria-label": section.title || ""});
    timeAxis(svg, x, t0, t1, top, bottom);
    const axis = svgEl("g", {class: "axis"});
    for (const v of ticks(0, ymax, 5)) {
      axis.append(svgEl("line", {class: "grid-line", x1: left, x2: W - 16, y1: y(v), y2: y(v)}));
      axis.append(svgEl("text", {x: left - 6, y: y(v) + 4, "text-anchor": "end"}, fmtValue(v)));
    }
    if (section.unit) axis.append(svgEl("text", {x: 4, y: top - 10}, section.unit));
    svg.append(axis);
    for (const s of section.series || []) {
      if (!s.points.length) continue;
      let d = "";
      s.points.forEach(([t, v], i) => {
        if (i === 0) d += `M${x(t)},${y(v)}`;
        else if (section.step) d += `H${x(t)}V${y(v)}`;
        else d += `L${x(t)},${y(v)}`;
      });
      if (section.step) d += `H${x(t1)}`;
      const path = svgEl("path", {class: "line", d: d, stroke: colour(s.key), "data-key": String(s.key)});
      path.append(svgEl("title", {}, s.name));
      svg.append(path);
    }
    drawMarks(svg, section.marks, x, () => top, () => bottom, top, bottom);
    return [svg, legend((section.series || []).map(s => [s.key, s.name]))].concat(
      markLegend(section.marks));
  }

  function table(section) {
    if (!(section.rows || []).length) return [el("div", {class: "empty"}, section.empty || "none")];
    const t = el("table");
    const head = el("tr");
    for (const c of section.columns || []) head.append(el("th", {}, c));
    t.append(head);
    for (const row of section.rows) {
      const tr = el("tr");
      row.forEach((cell, i) => {
        const td = el("td", {}, fmtValue(cell));
        if (i === 0 && section.keyed) td.setAttribute("data-key", String(cell));
        tr.append(td);
      });
      t.append(tr);
    }
    return [t];
  }

  function metrics(section) {
    return table({rows: section.items || [], columns: ["metric", "value"], empty: "no metrics yet"});
  }

  const DRAW = {gantt, series, table, metrics};

  function render(model, app, status) {
    const header = el("header");
    header.append(el("h1", {}, model.title || ""));
    if (model.subtitle) header.append(el("span", {class: "subtitle"}, model.subtitle));
    header.append(status);
    const parts = [header];
    let grid = null;
    for (const section of model.sections || []) {
      const draw = DRAW[section.kind];
      if (!draw) continue;
      const box = el("section", {id: section.id, "data-kind": section.kind});
      box.append(el("h2", {}, section.title || ""), ...draw(section, model));
      if (section.kind === "table" || section.kind === "metrics") {
        if (!grid) { grid = el("div", {class: "grid"}); parts.push(grid); }
        grid.append(box);
      } else {
        grid = null;
        parts.push(box);
      }
    }
    app.replaceChildren(...parts);
  }

  function start() {
    const app = document.getElementById("app");
    let model = JSON.parse(document.getElementById("model").textContent);
    const status = el("span", {class: "status", id: "status"});
    let updates = 0;
    const show = () => {
      render(model, app, status);
      document.body.dataset.updates = String(updates);
    };
    if (model.live && model.live.stream && window.EventSource) {
      status.className = "status live";
      status.textContent = "live";
      const source = new EventSource(model.live.stream);
      source.onmessage = (e) => {
        model = JSON.parse(e.data);
        updates += 1;
        status.className = "status live";
        status.textContent = "live · updated " + new Date().toLocaleTimeString();
        show();
      };
      source.onerror = () => {
        status.className = "status lost";
        status.textContent = "connection lost, retrying";
      };
    }
    show();
  }

  start();
})();
