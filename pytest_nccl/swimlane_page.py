"""The swimlane page's HTML, CSS and JavaScript (``swimlane.py`` puts the data in): one file, nothing
fetched. Kept apart so that the Python beside it stays short.

The script draws on a canvas the size of the view, only the columns and lanes in view, again on
scroll. Columns: per group a separator, then a column per position, runs of positions where every
member's signature agrees folded into one band ("N collectives agree", a click unfolds it) except
the context around the diagnosed position and the last positions. Once it has drawn, it sets on
``<body>``: ``data-drawn``, ``data-diverging-drawn="group#seq"`` (when the diagnosed position was
painted), ``data-render-ms`` (``performance.now()`` at the end of the first draw: milliseconds since
the navigation started), and ``data-error`` on any script error.
"""

PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__NCCL_TITLE__</title>
<style>
:root { color-scheme: light; }
body { margin: 0; font: 13px/1.4 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
       color: #1f2328; background: #fff; }
header { padding: 10px 16px 8px; border-bottom: 1px solid #d0d7de; }
#kind { display: inline-block; font-weight: 600; color: #fff; background: #cf222e; border-radius: 10px;
        padding: 0 8px; font-size: 12px; }
#kind.none { background: #6e7781; }
h1 { font-size: 15px; margin: 6px 0 4px; color: #a40e26; font-weight: 600; word-break: break-word;
     display: -webkit-box; -webkit-box-orient: vertical; -webkit-line-clamp: 3; overflow: hidden; cursor: pointer; }
h1.open { display: block; }
#meta, #summary { color: #57606a; font-size: 12px; }
#legend { font-size: 12px; color: #57606a; margin-top: 4px; }
#legend .sw { display: inline-block; width: 14px; height: 10px; margin: 0 4px 0 12px; vertical-align: -1px;
              border: 1px solid #6e7781; }
#legend .sw:first-child { margin-left: 0; }
#wrap { position: relative; margin: 8px 16px; border: 1px solid #d0d7de; }
#lanes { position: absolute; left: 0; top: 0; }
#scroller { position: absolute; left: 0; top: 0; right: 0; bottom: 0; overflow: auto; cursor: default; }
#tip { position: fixed; pointer-events: none; background: #1f2328; color: #fff; z-index: 2;
       font: 12px/1.35 ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; white-space: pre;
       padding: 6px 8px; border-radius: 4px; max-width: 70vw; overflow: hidden; }
#detail { margin: 0 16px 12px; }
#detail h2 { font-size: 14px; margin: 8px 0 4px; }
#detail pre { background: #f6f8fa; border: 1px solid #d0d7de; padding: 8px; overflow: auto; max-height: 45vh;
              font: 12px/1.35 ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; margin: 4px 0 8px; }
#detail .hint, footer { color: #8c959f; font-size: 12px; }
footer { margin: 0 16px 12px; }
</style>
</head>
<body>
<header>
<span id="kind"></span>
<h1 id="headline" title="click to show it all"></h1>
<div id="meta"></div>
<div id="summary"></div>
<div id="legend"><span class="sw" style="background:#c9e3f7"></span>completed<span class="sw"
 style="background:#f2f8fd;border-style:dashed"></span>pending (entered, waiting) &hellip;<span class="sw"
 style="background:#fff;border:1px dashed #cf222e"></span>never entered<span class="sw"
 style="background:#fde2e2;border-color:#cf222e"></span>diagnosed position<span class="sw"
 style="background:#fdf3dc"></span>members disagree<span class="sw"
 style="background:#e8edf5"></span>N collectives agree (click to unfold)</div>
</header>
<div id="wrap"><canvas id="lanes"></canvas><div id="scroller"><div id="sizer"></div></div></div>
<div id="tip" hidden></div>
<section id="detail"><p class="hint">Hover a box for its collective; click a box or a rank for that rank's
message and stack.</p></section>
<footer id="foot"></footer>
<script type="application/json" id="nccl-data">__NCCL_DATA__</script>
<script>
"use strict";
(function () {
const body = document.body;
window.addEventListener("error", function (e) { body.dataset.error = String(e.message || e); });
try { main(); } catch (e) { body.dataset.error = String((e && e.stack) || e); throw e; }

function main() {
  const D = JSON.parse(document.getElementById("nccl-data").textContent);
  const world = D.world, groups = D.groups, pos = D.position, kinds = D.kinds;
  const CTX = 3, TAIL = 2, FOLD_MIN = 4;
  const LABEL_W = 176, HEAD_H = 38, FOLD_W = 132, GAP_W = 16;
  let COL_W = 112;  // widened to the longest label below, up to 210 px
  const LANE_H = world <= 8 ? 26 : world <= 16 ? 22 : world <= 32 ? 18 : 14;
  const FONT = (LANE_H >= 18 ? 11 : 10) + "px ui-monospace, 'DejaVu Sans Mono', Menlo, Consolas, monospace";
  const BOLD = "bold " + FONT;
  const odd = new Set(D.odd), fault = new Set(D.fault);
  const SHORT = {all_gather_into_tensor: "ag_tensor", _all_gather_base: "ag_base", all_gather: "allgather",
    all_gather_object: "ag_object", all_gather_coalesced: "ag_coal", all_reduce: "allreduce",
    all_reduce_coalesced: "ar_coal", reduce_scatter_tensor: "rs_tensor", _reduce_scatter_base: "rs_base",
    reduce_scatter: "redscat", broadcast: "bcast", broadcast_object_list: "bc_object",
    all_to_all_single: "a2a_single", all_to_all: "all2all"};
  const STATUS_COLOR = {passed: "#1a7f37", failed: "#cf222e", dead: "#cf222e", running: "#9a6700",
    skipped: "#6e7781", xfailed: "#6e7781", "not-started": "#6e7781"};
  const $ = function (id) { return document.getElementById(id); };
  const wrap = $("wrap"), canvas = $("lanes"), scroller = $("scroller"), sizer = $("sizer"), tip = $("tip");
  const ctx = canvas.getContext("2d");

  // -- header ---------------------------------------------------------------------------------
  $("kind").textContent = D.kind || "no diagnosis";
  if (!D.kind) $("kind").className = "none";
  $("headline").textContent = D.headline || "(no headline)";
  $("headline").addEventListener("click", function () { this.classList.toggle("open"); size(); schedule(); });
  $("meta").textContent = D.test + "  \u00b7  " + (D.backend || "?") + ", world " + world + "  \u00b7  " +
    Number(D.elapsed).toFixed(2) + " s of a " + D.bound + " s bound";
  const byStatus = {};
  D.ranks.forEach(function (v) { byStatus[v.status] = (byStatus[v.status] || 0) + 1; });
  $("summary").textContent = "ranks: " + Object.keys(byStatus).map(function (s) { return byStatus[s] + " " + s; })
    .join(", ") + (D.fault.length ? "  \u00b7  at fault: " + D.fault.join(",") : "") +
    (pos ? "  \u00b7  diagnosed position: #" + pos.seq + " of group " + pos.pg : "");

  // -- kinds: label and colours once --------------------------------------------------------------
  const styles = kinds.map(function (k) {
    const op = k[0], shapes = k[1], state = k[3], pending = state !== "completed";
    let h = 0;
    for (let i = 0; i < op.length; i++) h = (h * 31 + op.charCodeAt(i)) >>> 0;
    h = (h * 47) % 360;
    const label = (SHORT[op] || op) + (k[5] === "flight-recorder" ? "*" : "") +
      (shapes ? " " + shapes.replace(/, /g, ",") : "") + (pending ? (state === "waiting" ? " ..w" : " ..") : "");
    return {label: label, pending: pending,
      fill: pending ? "hsl(" + h + ",70%,96%)" : "hsl(" + h + ",62%,85%)", stroke: "hsl(" + h + ",45%,42%)"};
  });
  ctx.font = FONT;
  const cw = ctx.measureText("0123456789").width / 10 || 6.6;
  COL_W = Math.round(Math.min(210, 14 + cw * styles.reduce(function (n, st) {  // "never entered", "#12 differ"
    return Math.max(n, st.label.length); }, Math.max(15, 7 + String(D.kind).length))));
  for (const g of groups) {
    g.index = new Map(g.members.map(function (r, m) { return [r, m]; }));
    g.expanded = [];
    g.div = pos && pos.pg === g.pg ? pos.seq - 1 : -1;
  }
  function kindAt(g, i, m) {
    const s = g.same[i];
    if (s !== -1) return s;
    const c = g.cols[i];
    return c ? c[m] : -1;
  }

  // -- columns ------------------------------------------------------------------------------------
  let cols = [], xs = new Float64Array(1), folded = 0;
  function width(c) { return c.t === "pos" ? COL_W : c.t === "fold" ? FOLD_W : GAP_W; }
  function build() {
    cols = []; folded = 0;
    for (const g of groups) {
      cols.push({t: "gap", g: g});
      const keep = function (i) {
        if (g.match.charCodeAt(i) !== 49 || i >= g.n - TAIL || (g.div >= 0 && Math.abs(i - g.div) <= CTX)) return true;
        for (const e of g.expanded) if (i >= e[0] && i <= e[1]) return true;
        return false;
      };
      let i = 0;
      while (i < g.n) {
        if (keep(i)) { cols.push({t: "pos", g: g, i: i}); i++; continue; }
        let j = i;
        while (j < g.n && !keep(j)) j++;
        if (j - i >= FOLD_MIN) { cols.push({t: "fold", g: g, a: i, b: j - 1}); folded += j - i; }
        else for (let k = i; k < j; k++) cols.push({t: "pos", g: g, i: k});
        i = j;
      }
    }
    xs = new Float64Array(cols.length + 1);
    for (let c = 0; c < cols.length; c++) xs[c + 1] = xs[c] + width(cols[c]);
    sizer.style.width = (LABEL_W + xs[cols.length]) + "px";
    sizer.style.height = (HEAD_H + world * LANE_H) + "px";
  }
  function colAt(x) {  // the column under content x, or -1
    let lo = 0, hi = cols.length - 1;
    if (x < 0 || x >= xs[cols.length]) return -1;
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (xs[mid] <= x) lo = mid; else hi = mid - 1; }
    return lo;
  }

  // -- drawing ------------------------------------------------------------------------------------
  let charW = 6.6, dpr = 1, divDrawn = false;
  function fit(text, w) {
    const n = Math.floor(w / charW);
    return text.length <= n ? text : n > 1 ? text.slice(0, n - 1) + "~" : "";
  }
  function size() {
    const h = Math.min(HEAD_H + world * LANE_H + 18, Math.max(240, window.innerHeight - wrap.offsetTop - 120));
    wrap.style.height = h + "px";
    const w = scroller.clientWidth, hh = scroller.clientHeight;
    dpr = window.devicePixelRatio || 1;
    canvas.style.width = w + "px"; canvas.style.height = hh + "px";
    canvas.width = Math.round(w * dpr); canvas.height = Math.round(hh * dpr);
  }
  function draw() {
    const vw = scroller.clientWidth, vh = scroller.clientHeight;
    const sx = scroller.scrollLeft, sy = scroller.scrollTop;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.font = FONT; ctx.textBaseline = "middle";
    charW = ctx.measureText("0123456789").width / 10;
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, vw, vh);
    const lane0 = Math.max(0, Math.floor(sy / LANE_H));
    const lane1 = Math.min(world - 1, Math.floor((sy + vh - HEAD_H) / LANE_H));
    for (let r = lane0; r <= lane1; r++) {
      if (r % 2) { ctx.fillStyle = "#f6f7f9"; ctx.fillRect(LABEL_W, HEAD_H + r * LANE_H - sy, vw, LANE_H); }
    }
    ctx.save();
    ctx.beginPath(); ctx.rect(LABEL_W, HEAD_H, vw - LABEL_W, vh - HEAD_H); ctx.clip();
    const x1 = sx + vw - LABEL_W;
    let first = Math.max(0, colAt(sx)), last = first;
    for (let c = first; c < cols.length && xs[c] < x1; c++) {
      last = c;
      const col = cols[c], X = LABEL_W + xs[c] - sx, W = width(col);
      if (col.t === "gap") {
        ctx.fillStyle = "#8c959f"; ctx.fillRect(X + W / 2 - 1, HEAD_H, 2, vh - HEAD_H); continue;
      }
      if (col.t === "fold") { drawFold(col, X, W, lane0, lane1, sy, vh); continue; }
      const g = col.g, i = col.i, isDiv = i === g.div;
      if (isDiv) {
        ctx.fillStyle = "#fde2e2"; ctx.fillRect(X, HEAD_H, W, vh - HEAD_H);
        ctx.fillStyle = "#cf222e"; ctx.fillRect(X, HEAD_H, 2, vh - HEAD_H); ctx.fillRect(X + W - 2, HEAD_H, 2, vh - HEAD_H);
        divDrawn = true;
      } else if (g.match.charCodeAt(i) !== 49) {
        ctx.fillStyle = "#fdf3dc"; ctx.fillRect(X, HEAD_H, W, vh - HEAD_H);
      }
      for (let r = lane0; r <= lane1; r++) {
        const m = g.index.get(r);
        if (m === undefined) continue;
        const y = HEAD_H + r * LANE_H - sy, k = kindAt(g, i, m);
        const bx = X + 3, by = y + 2, bw = W - 6, bh = LANE_H - 4;
        if (k < 0) {
          ctx.setLineDash([3, 2]); ctx.strokeStyle = isDiv ? "#cf222e" : "#8c959f"; ctx.lineWidth = isDiv ? 1.5 : 1;
          ctx.strokeRect(bx + 0.5, by + 0.5, bw - 1, bh - 1); ctx.setLineDash([]);
          ctx.fillStyle = isDiv ? "#cf222e" : "#8c959f";
          ctx.fillText(fit(isDiv ? "never entered" : "-", bw - 6), bx + 4, y + LANE_H / 2);
          continue;
        }
        const st = styles[k];
        ctx.fillStyle = st.fill; ctx.fillRect(bx, by, bw, bh);
        if (isDiv && odd.has(r)) {
          ctx.strokeStyle = "#cf222e"; ctx.lineWidth = 2.5; ctx.strokeRect(bx + 1, by + 1, bw - 2, bh - 2);
        } else {
          if (st.pending) ctx.setLineDash([3, 2]);
          ctx.strokeStyle = st.stroke; ctx.lineWidth = 1; ctx.strokeRect(bx + 0.5, by + 0.5, bw - 1, bh - 1);
          ctx.setLineDash([]);
        }
        ctx.fillStyle = "#1f2328";
        ctx.fillText(fit(st.label, bw - 6), bx + 4, y + LANE_H / 2);
      }
    }
    ctx.restore();
    drawHeader(first, last, sx, vw);
    drawLabels(lane0, lane1, sy, vh);
  }
  function drawFold(col, X, W, lane0, lane1, sy, vh) {
    const g = col.g, n = col.b - col.a + 1;
    ctx.fillStyle = "#e8edf5"; ctx.fillRect(X + 3, HEAD_H + 2, W - 6, vh - HEAD_H - 4);
    ctx.strokeStyle = "#8ea1bf"; ctx.lineWidth = 1; ctx.strokeRect(X + 3.5, HEAD_H + 2.5, W - 7, vh - HEAD_H - 5);
    for (let r = lane0; r <= lane1; r++) {   // non-members: no band
      if (!g.index.has(r)) { ctx.fillStyle = r % 2 ? "#f6f7f9" : "#fff"; ctx.fillRect(X + 3, HEAD_H + r * LANE_H - sy, W - 6, LANE_H); }
    }
    const lines = [n.toLocaleString("en-US"), "collectives", "agree", "#" + (col.a + 1) + "-#" + (col.b + 1), "click to unfold"];
    const mid = HEAD_H + (vh - HEAD_H) / 2 - (lines.length - 1) * 7;
    ctx.fillStyle = "#3d4f6b"; ctx.textAlign = "center";
    lines.forEach(function (t, j) { ctx.font = j === 0 ? BOLD : FONT; ctx.fillText(fit(t, W - 8), X + W / 2, mid + j * 14); });
    ctx.textAlign = "left"; ctx.font = FONT;
  }
  function drawHeader(first, last, sx, vw) {
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, vw, HEAD_H);
    ctx.fillStyle = "#d0d7de"; ctx.fillRect(0, HEAD_H - 1, vw, 1);
    ctx.save(); ctx.beginPath(); ctx.rect(LABEL_W, 0, vw - LABEL_W, HEAD_H); ctx.clip();
    let gi = -1;
    for (let c = first; c <= last && c < cols.length; c++) {
      const col = cols[c], X = LABEL_W + xs[c] - sx, W = width(col);
      if (col.t === "gap" || c === first) {  // group label, kept in view at the left edge
        let end = cols.length;
        for (let e = c + 1; e < cols.length; e++) if (cols[e].t === "gap") { end = e; break; }
        const gx = Math.max(X + (col.t === "gap" ? W : 0), LABEL_W);
        const gEnd = end === cols.length ? vw : LABEL_W + xs[end] - sx;  // the last group may run on
        const g = col.g, label = "group " + g.pg + " (" + g.members.length + " ranks, " + g.n + " collectives)";
        ctx.font = BOLD; ctx.fillStyle = "#24292f";
        ctx.fillText(fit(label, gEnd - gx - 8), gx + 4, 10);
        ctx.font = FONT;
        if (col.t === "gap") continue;
      }
      if (col.t === "gap") continue;
      let text, color = "#57606a";
      if (col.t === "fold") text = "#" + (col.a + 1) + "-#" + (col.b + 1) + " agree";
      else if (col.i === col.g.div) { text = "\u25bc #" + (col.i + 1) + " " + (D.kind || ""); color = "#cf222e"; }
      else text = "#" + (col.i + 1) + (col.g.match.charCodeAt(col.i) !== 49 ? " differ" : "");
      ctx.font = col.t === "pos" && col.i === col.g.div ? BOLD : FONT; ctx.fillStyle = color;
      ctx.fillText(fit(text, W - 6), X + 4, 28);
      ctx.font = FONT;
    }
    ctx.restore();
  }
  function drawLabels(lane0, lane1, sy, vh) {
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, LABEL_W, vh);
    ctx.fillStyle = "#d0d7de"; ctx.fillRect(LABEL_W - 1, 0, 1, vh);
    ctx.fillStyle = "#57606a"; ctx.fillText("rank \u00b7 status", 8, 28);
    ctx.save(); ctx.beginPath(); ctx.rect(0, HEAD_H, LABEL_W, vh - HEAD_H); ctx.clip();
    for (let r = lane0; r <= lane1; r++) {
      const v = D.ranks[r], y = HEAD_H + r * LANE_H - sy;
      if (r % 2) { ctx.fillStyle = "#f6f7f9"; ctx.fillRect(0, y, LABEL_W - 1, LANE_H); }
      if (fault.has(r)) { ctx.fillStyle = "#cf222e"; ctx.fillRect(0, y + 2, 4, LANE_H - 4); }
      ctx.font = fault.has(r) ? BOLD : FONT; ctx.fillStyle = "#24292f";
      ctx.fillText("rank " + r, 10, y + LANE_H / 2);
      ctx.font = FONT; ctx.fillStyle = STATUS_COLOR[v.status] || "#57606a";
      const what = v.status === "dead" && v.exit ? v.exit.replace("killed by ", "").replace("exited with code ", "exit ") : v.status;
      ctx.fillText(fit(what, LABEL_W - 78), 72, y + LANE_H / 2);
    }
    ctx.restore();
  }

  // -- interaction --------------------------------------------------------------------------------
  function hit(ev) {
    const rect = canvas.getBoundingClientRect();
    const px = ev.clientX - rect.left, py = ev.clientY - rect.top;
    const lane = py >= HEAD_H ? Math.floor((py - HEAD_H + scroller.scrollTop) / LANE_H) : -1;
    const c = px >= LABEL_W ? colAt(px - LABEL_W + scroller.scrollLeft) : -1;
    return {lane: lane >= 0 && lane < world ? lane : -1, col: c >= 0 ? cols[c] : null};
  }
  function describe(g, i, r) {
    const m = g.index.get(r);
    if (m === undefined) return "rank " + r + " is not a member of group " + g.pg;
    const k = kindAt(g, i, m);
    if (k < 0) return "rank " + r + " never entered #" + (i + 1) + " of group " + g.pg;
    const K = kinds[k], d = g.durs[i] ? g.durs[i][m] : null;
    const lines = ["rank " + r + "  " + K[0] + " #" + (i + 1) + " of group " + g.pg,
      "shapes " + (K[1] || "-") + "  dtype " + (K[2] || "-") + (K[7] != null ? "  peer " + K[7] : "") +
        (K[8] != null ? "  root " + K[8] : ""),
      K[3] + (K[4] ? " (async)" : "") + (d != null ? " in " + d + " ms" : "") +
        (K[5] !== "python" ? "  [" + K[5] + "]" : "")];
    if (K[6]) lines.push("at " + K[6]);
    if (i === g.div) lines.push(odd.has(r) ? "\u25b6 differs here (" + D.kind + ")" : "diagnosed position (" + D.kind + ")");
    return lines.join("\n");
  }
  function foldText(col) {
    const g = col.g, count = {};
    for (let i = col.a; i <= col.b; i++) {
      const k = g.same[i] !== -1 ? g.same[i] : g.cols[i][0];
      const op = k >= 0 ? kinds[k][0] : "?";
      count[op] = (count[op] || 0) + 1;
    }
    const ops = Object.keys(count).sort(function (a, b) { return count[b] - count[a]; });
    return (col.b - col.a + 1) + " collectives #" + (col.a + 1) + "-#" + (col.b + 1) + " of group " + g.pg +
      ": every member issued the same op, shapes and dtype\n" +
      ops.slice(0, 6).map(function (op) { return "  " + op + " x" + count[op]; }).join("\n") + "\nclick to unfold";
  }
  function rankText(r) {
    const v = D.ranks[r];
    return "rank " + r + ": " + v.status + (v.exit ? " (" + v.exit + ")" : "") + ", " + v.count + " collectives" +
      (v.message ? "\n" + v.message.slice(0, 300) : "") + "\nclick for its stack";
  }
  scroller.addEventListener("mousemove", function (ev) {
    const h = hit(ev);
    let text = "";
    if (h.col && h.col.t === "fold") text = foldText(h.col);
    else if (h.lane >= 0 && !h.col) text = rankText(h.lane);
    else if (h.lane >= 0 && h.col && h.col.t === "pos") text = describe(h.col.g, h.col.i, h.lane);
    if (!text) { tip.hidden = true; return; }
    tip.textContent = text; tip.hidden = false;
    const x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    const y = ev.clientY + 16 + tip.offsetHeight > window.innerHeight ? ev.clientY - tip.offsetHeight - 8 : ev.clientY + 16;
    tip.style.left = Math.max(0, x) + "px"; tip.style.top = Math.max(0, y) + "px";
  });
  scroller.addEventListener("mouseleave", function () { tip.hidden = true; });
  scroller.addEventListener("click", function (ev) {
    const h = hit(ev);
    if (h.col && h.col.t === "fold") {
      const keepX = xs[cols.indexOf(h.col)] - scroller.scrollLeft;
      h.col.g.expanded.push([h.col.a, h.col.b]); build();
      const at = cols.findIndex(function (c) { return c.t === "pos" && c.g === h.col.g && c.i === h.col.a; });
      if (at >= 0) scroller.scrollLeft = xs[at] - keepX;
      schedule(); return;
    }
    if (h.lane >= 0) showRank(h.lane, h.col && h.col.t === "pos" ? describe(h.col.g, h.col.i, h.lane) : "");
  });
  function block(parent, tag, text) { const e = document.createElement(tag); e.textContent = text; parent.appendChild(e); return e; }
  function showRank(r, record) {
    const v = D.ranks[r], box = $("detail");
    box.textContent = "";
    block(box, "h2", "rank " + r + ": " + v.status + (v.exit ? " (" + v.exit + ")" : "") +
      (fault.has(r) ? "  \u2014 at fault" : ""));
    if (v.message) block(box, "p", v.message);
    if (record) block(box, "pre", record);
    if (v.traceback) { block(box, "p", "traceback"); block(box, "pre", v.traceback); }
    if (v.stack) {
      const trimmed = withoutHarness(v.stack), hidden = v.stack.split("\n").length - trimmed.split("\n").length;
      const p = block(box, "p", "Python stack (all threads)" + (hidden > 0 ? ", " + hidden + " lines of the harness hidden " : ""));
      const pre = block(box, "pre", trimmed);
      if (hidden > 0) {
        const a = block(p, "a", "show all"); a.href = "#";
        a.addEventListener("click", function (e) { e.preventDefault(); pre.textContent = v.stack; a.remove(); });
      }
    }
    else block(box, "p", "no stack: this rank was not stuck when the verdict came").className = "hint";
  }
  function withoutHarness(stack) {
    // as report.py shows it: the fork server and rank loop around the test body, and the rank's
    // reader thread, left out (our format is outermost first, faulthandler's most recent first)
    const blocks = [];
    for (const line of stack.replace(/\s+$/, "").split("\n")) {
      if (!blocks.length || /^(Thread |Current thread)/.test(line)) blocks.push([]);
      blocks[blocks.length - 1].push(line);
    }
    const marker = /pytest_nccl[\/\\]rank\.py/;
    const kept = [];
    for (const b of blocks) {
      if (b.some(function (l) { return marker.test(l) && l.indexOf("_reader") >= 0; })) continue;
      const at = b.findIndex(function (l) { return marker.test(l) && l.indexOf("run_call") >= 0; });
      if (at < 0) kept.push(b);
      else if (b[0].indexOf("most recent call first") >= 0) kept.push(b.slice(0, at));
      else {
        let rest = b.slice(at + 1);
        if (rest.length && !/^\s*File /.test(rest[0])) rest = rest.slice(1);
        kept.push(b.slice(0, 1).concat(rest));
      }
    }
    return kept.map(function (b) { return b.join("\n"); }).join("\n");
  }
  let pending = false;
  function schedule() { if (!pending) { pending = true; requestAnimationFrame(function () { pending = false; draw(); }); } }
  scroller.addEventListener("scroll", schedule, {passive: true});
  window.addEventListener("resize", function () { size(); schedule(); });

  // -- first draw, at the diagnosed position -----------------------------------------------------
  build(); size();
  if (pos) {
    const at = cols.findIndex(function (c) { return c.t === "pos" && c.g.pg === pos.pg && c.i === pos.seq - 1; });
    const view = scroller.clientWidth - LABEL_W;
    if (at >= 0) {  // the context (and the fold before it) in view, the diagnosed column left of the middle
      let left = xs[Math.max(0, at - CTX - 1)];
      if (xs[at] + COL_W - left > 0.6 * view) left = xs[at] - view / 3;
      scroller.scrollLeft = Math.max(0, left);
    }
    const r = D.odd.length ? D.odd[0] : -1;
    if (r >= 0 && (r + 1) * LANE_H > scroller.clientHeight - HEAD_H) {
      scroller.scrollTop = Math.max(0, r * LANE_H - (scroller.clientHeight - HEAD_H) / 3);
    }
  }
  draw();
  const ms = performance.now();
  const asked = /rank=(\d+)/.exec(location.hash);   // page.html#rank=3 opens rank 3
  const shown = asked ? Number(asked[1]) : D.fault.length ? D.fault[0] : D.odd.length ? D.odd[0] : -1;
  if (shown >= 0 && shown < world) {
    const c = pos ? cols.find(function (c) { return c.t === "pos" && c.g.pg === pos.pg && c.i === pos.seq - 1; }) : null;
    showRank(shown, c ? describe(c.g, c.i, shown) : "");
  }
  body.dataset.drawn = "1";
  body.dataset.renderMs = ms.toFixed(1);
  body.dataset.divergingDrawn = pos ? (divDrawn ? pos.pg + "#" + pos.seq : "no") : "none";
  const total = groups.reduce(function (s, g) { return s + g.n; }, 0);
  $("foot").textContent = "drawn in " + ms.toFixed(0) + " ms  \u00b7  " + world + " ranks, " + total +
    (total === 1 ? " position, " : " positions, ") + folded + " folded where every member agrees  \u00b7  pytest-nccl";
}
})();
</script>
</body>
</html>
"""
