// symgpu d3viz: draws the graph data embedded in this page (no library, no network).
// Every string of the graph is inserted as text (textContent / setAttribute), never as markup.
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var data = JSON.parse(document.getElementById("d3viz-data").textContent);
  var svg = document.getElementById("graph");
  var viewport = document.getElementById("viewport");
  var graphs = {};
  data.graphs.forEach(function (g) { graphs[g.id] = g; });
  var state = { graph: null, nodes: {}, elements: {}, selected: null, view: { x: 0, y: 0, k: 1 },
                matches: [], matchIndex: -1 };

  function el(tag, attrs, parent) {
    var e = document.createElementNS(SVG, tag);
    for (var k in attrs) { if (Object.prototype.hasOwnProperty.call(attrs, k)) e.setAttribute(k, attrs[k]); }
    if (parent) parent.appendChild(e);
    return e;
  }
  function html(tag, text, parent, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    if (parent) parent.appendChild(e);
    return e;
  }
  function clear(e) { while (e.firstChild) e.removeChild(e.firstChild); }
  function fmtTime(s) {
    if (s >= 1) return s.toFixed(3) + " s";
    if (s >= 1e-3) return (s * 1e3).toFixed(3) + " ms";
    return (s * 1e6).toFixed(1) + " \u00b5s";
  }

  // ------------------------------------------------------------------ pan and zoom
  function applyView() {
    var v = state.view;
    viewport.setAttribute("transform", "translate(" + v.x + "," + v.y + ") scale(" + v.k + ")");
  }
  function fit() {
    var g = state.graph, r = svg.getBoundingClientRect();
    var k = Math.min(r.width / g.width, r.height / g.height, 1.5);
    if (!isFinite(k) || k <= 0) k = 1;
    state.view = { k: k, x: (r.width - g.width * k) / 2, y: Math.max(0, (r.height - g.height * k) / 2) };
    applyView();
  }
  function centerOn(n) {
    var r = svg.getBoundingClientRect(), v = state.view;
    if (v.k < 0.6) v.k = 0.9;
    v.x = r.width / 2 - n.x * v.k;
    v.y = r.height / 2 - n.y * v.k;
    applyView();
  }
  svg.addEventListener("wheel", function (ev) {
    ev.preventDefault();
    var r = svg.getBoundingClientRect(), v = state.view;
    var px = ev.clientX - r.left, py = ev.clientY - r.top;
    var k = Math.max(0.05, Math.min(8, v.k * Math.exp(-ev.deltaY * 0.0015)));
    v.x = px - (px - v.x) * k / v.k;
    v.y = py - (py - v.y) * k / v.k;
    v.k = k;
    applyView();
  }, { passive: false });
  var drag = null;
  svg.addEventListener("pointerdown", function (ev) {
    if (ev.button !== 0) return;
    drag = { x: ev.clientX, y: ev.clientY, vx: state.view.x, vy: state.view.y, moved: false };
  });
  window.addEventListener("pointermove", function (ev) {
    if (!drag) return;
    var dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    if (!drag.moved && Math.abs(dx) + Math.abs(dy) < 4) return;
    drag.moved = true;
    svg.classList.add("panning");
    state.view.x = drag.vx + dx;
    state.view.y = drag.vy + dy;
    applyView();
  });
  window.addEventListener("pointerup", function () {
    svg.classList.remove("panning");
    if (drag && drag.moved) { state.justPanned = true; setTimeout(function () { state.justPanned = false; }, 0); }
    drag = null;
  });

  // ------------------------------------------------------------------ drawing
  function pathOf(points) {
    // straight for two points; through the virtual points of a long edge, smoothed:
    // lines to the midpoints, quadratic curves around each virtual point
    var d = "M" + points[0][0] + "," + points[0][1], last = points.length - 1;
    for (var i = 1; i < last; i++) {
      var p = points[i], q = points[i + 1];
      if (i === 1) d += " L" + (points[0][0] + p[0]) / 2 + "," + (points[0][1] + p[1]) / 2;
      d += " Q" + p[0] + "," + p[1] + " " + (p[0] + q[0]) / 2 + "," + (p[1] + q[1]) / 2;
    }
    return d + " L" + points[last][0] + "," + points[last][1];
  }
  function drawNode(n, parent) {
    var g = el("g", { "class": "node kind-" + n.kind + (n.inner.length ? " has-inner" : ""),
                      "data-id": n.id, "transform": "translate(" + n.x + "," + n.y + ")" }, parent);
    var shape;
    if (n.shape === "ellipse") {
      shape = el("ellipse", { rx: n.w / 2, ry: n.h / 2, "class": "shape" }, g);
    } else {
      shape = el("rect", { x: -n.w / 2, y: -n.h / 2, width: n.w, height: n.h, rx: 3, "class": "shape" }, g);
    }
    shape.setAttribute("fill", n.color);
    if (n.heat > 0) {
      shape.setAttribute("stroke", "#d62020");
      shape.style.strokeWidth = String(1 + 5 * n.heat);
      el("rect", { "class": "heat", x: -n.w * 0.35, y: n.h / 2 - 7, width: 0.7 * n.w * n.heat, height: 4 }, g);
    }
    var label = el("text", {}, g);
    label.textContent = n.label;
    var tip = el("title", {}, g);
    tip.textContent = n.label + (n.time !== null ? "  (" + fmtTime(n.time) + " per call, " +
                                 (100 * n.share).toFixed(1) + "%)" : "");
    g.addEventListener("click", function (ev) {
      ev.stopPropagation();
      if (state.justPanned) return;
      select(n.id);
    });
    g.addEventListener("dblclick", function (ev) {
      ev.stopPropagation();
      if (n.inner.length) show(n.inner[0][0]);
    });
    return g;
  }
  function show(gid) {
    var g = graphs[gid];
    if (!g) return;
    state.graph = g; state.nodes = {}; state.elements = {}; state.selected = null;
    clear(viewport);
    var edgeLayer = el("g", { "class": "edges" }, viewport);
    var nodeLayer = el("g", { "class": "nodes" }, viewport);
    g.nodes.forEach(function (n) { state.nodes[n.id] = n; });
    g.edges.forEach(function (e) {
      var marker = e.kind === "view" ? "arrow-view" : e.kind === "destroy" ? "arrow-destroy" : "arrow";
      el("path", { "class": "edge" + (e.kind ? " " + e.kind : ""), d: pathOf(e.points),
                   "marker-end": "url(#" + marker + ")", "data-src": e.src, "data-dst": e.dst }, edgeLayer);
      if (e.label && e.points.length >= 2) {
        var a = e.points[0], b = e.points[1];
        var t = el("text", { "class": "edge-label", x: (a[0] + b[0]) / 2 + 4, y: (a[1] + b[1]) / 2 }, edgeLayer);
        t.textContent = e.label;
      }
    });
    g.nodes.forEach(function (n) { state.elements[n.id] = drawNode(n, nodeLayer); });
    drawCrumbs(g);
    drawProfile(g);
    showHint();
    runSearch();
    fit();
  }
  svg.addEventListener("click", function () { if (!state.justPanned) unselect(); });

  // ------------------------------------------------------------------ side panel
  function showHint() {
    var box = document.getElementById("details");
    clear(box);
    html("p", "Click a node for its details. Drag to pan, wheel to zoom; double-click a node " +
         "with an inner graph (thick purple border) to open it.", box, "hint");
    html("p", state.graph.nodes.length + " nodes, " + state.graph.edges.length + " edges; shapes: " +
         state.graph.shapes + ".", box, "hint");
  }
  function unselect() {
    if (state.selected && state.elements[state.selected]) state.elements[state.selected].classList.remove("selected");
    state.selected = null;
    showHint();
  }
  function select(id) {
    var n = state.nodes[id];
    if (!n) return;
    if (state.selected && state.elements[state.selected]) state.elements[state.selected].classList.remove("selected");
    state.selected = id;
    state.elements[id].classList.add("selected");
    var box = document.getElementById("details");
    clear(box);
    html("h2", n.op ? n.op : n.label, box);
    var chip = html("span", n.kind, box, "chip");
    chip.style.background = n.color;
    if (n.time !== null) {
      var p = html("p", null, box, "timing");
      var bar = html("span", null, p, "bar");
      bar.style.width = Math.max(1, Math.round(120 * n.share)) + "px";
      html("span", fmtTime(n.time) + " per call, " + (100 * n.share).toFixed(2) + "% of the function's time", p);
    }
    var table = html("table", null, box, "kv");
    n.details.forEach(function (kv) {
      var tr = html("tr", null, table);
      html("td", kv[0], tr);
      html("td", kv[1], tr);
    });
    if (n.inner.length) {
      html("h3", "inner graphs", box);
      n.inner.forEach(function (item) {
        var b = html("button", "open " + item[1], box, "inner-link");
        b.type = "button";
        b.addEventListener("click", function () { show(item[0]); });
      });
    }
    var ins = [], outs = [];
    state.graph.edges.forEach(function (e) {
      if (e.dst === id && state.nodes[e.src]) ins.push(state.nodes[e.src]);
      if (e.src === id && state.nodes[e.dst]) outs.push(state.nodes[e.dst]);
    });
    [["inputs", ins], ["clients", outs]].forEach(function (pair) {
      if (!pair[1].length) return;
      html("h3", pair[0], box);
      pair[1].forEach(function (m) {
        var b = html("button", m.label, box, "slow-link");
        b.type = "button";
        b.addEventListener("click", function () { select(m.id); centerOn(m); });
      });
    });
  }
  function drawProfile(g) {
    var box = document.getElementById("profile");
    clear(box);
    if (!data.profile || !g.profiled) return;
    html("h3", "profile", box);
    html("p", data.profile.calls + " calls, " + fmtTime(data.profile.call_time / data.profile.calls) +
         " per call (" + fmtTime(data.profile.thunk_time / data.profile.calls) + " in nodes)", box);
    html("h3", "slowest nodes", box);
    g.nodes.filter(function (n) { return n.time !== null; })
      .sort(function (a, b) { return b.time - a.time; }).slice(0, 10)
      .forEach(function (n) {
        var b = html("button", null, box, "slow-link");
        b.type = "button";
        var bar = html("span", null, b, "bar");
        bar.style.width = Math.max(1, Math.round(80 * n.share)) + "px";
        html("span", (100 * n.share).toFixed(1) + "%  " + n.label, b);
        b.addEventListener("click", function () { select(n.id); centerOn(n); });
      });
  }
  function drawLegend() {
    var box = document.getElementById("legend");
    html("h3", "legend", box);
    data.legend.forEach(function (item) {
      var row = html("div", null, box, "legend-item");
      var s = el("svg", { viewBox: "0 0 28 16" }, row);
      if (item[2] === "ellipse") el("ellipse", { cx: 14, cy: 8, rx: 13, ry: 7, fill: item[1], stroke: "#333" }, s);
      else el("rect", { x: 1, y: 1, width: 26, height: 14, fill: item[1], stroke: "#333" }, s);
      html("span", item[0], row);
    });
    html("p", "Blue edges: the op's output is a view of that input; red: the op overwrites it. " +
         "A slow node is bigger, with a red border and bar.", box, "hint");
  }
  function drawCrumbs(g) {
    var nav = document.getElementById("crumbs");
    clear(nav);
    if (data.graphs.length === 1) return;  // no inner graphs: the title says it all
    var chain = [g];
    while (chain[0].parent) chain.unshift(graphs[chain[0].parent[0]]);
    chain.forEach(function (item, i) {
      if (i) html("span", "\u203a", nav, "sep");
      var b = html("button", item.title, nav);
      b.type = "button";
      if (item === g) b.disabled = true;
      else b.addEventListener("click", function () { show(item.id); });
    });
  }

  // ------------------------------------------------------------------ search
  var search = document.getElementById("search");
  function runSearch() {
    var q = search.value.trim().toLowerCase();
    state.matches = []; state.matchIndex = -1;
    state.graph.nodes.forEach(function (n) {
      var hit = q !== "" && (n.label + " " + n.search).toLowerCase().indexOf(q) >= 0;
      state.elements[n.id].classList.toggle("match", hit);
      if (hit) state.matches.push(n);
    });
    svg.classList.toggle("searching", q !== "");
    document.getElementById("matches").textContent = q === "" ? "" : state.matches.length + " match" +
      (state.matches.length === 1 ? "" : "es");
  }
  search.addEventListener("input", runSearch);
  search.addEventListener("keydown", function (ev) {
    if (ev.key !== "Enter" || !state.matches.length) return;
    state.matchIndex = (state.matchIndex + 1) % state.matches.length;
    var n = state.matches[state.matchIndex];
    select(n.id);
    centerOn(n);
  });
  document.getElementById("fit").addEventListener("click", fit);
  window.addEventListener("resize", fit);

  drawLegend();
  show(data.graphs[0].id);
  window.d3viz = { data: data, show: show, select: select };
}());
