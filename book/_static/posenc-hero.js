/* The front page's figure (book/intro.md): the four 2-D pairs of an 8-dimensional query q and key k, each pair
   rotated by (position x its own frequency), as RoPE does. Moving the query's position turns q's pairs and changes
   q.k; shifting both positions by s turns every pair of both vectors by the same angle, and q.k, computed here
   from the rotated vectors themselves, does not change. No library, no network: plain SVG. */
function posencHero() {
  "use strict";
  var root = document.getElementById("posenc-hero");
  if (!root) return;
  var SVG = "http://www.w3.org/2000/svg";
  var base = 10, dim = 8, pairs = dim / 2;
  var theta = [];
  for (var i = 0; i < pairs; i++) theta.push(Math.pow(base, -2 * i / dim));  // RoPE's frequencies
  var q = [0.9, 0.5, 0.35, 0.9, -0.7, 0.45, 0.6, -0.55];
  var k = [0.8, -0.3, 0.75, 0.45, 0.2, 0.85, -0.65, 0.4];
  var KEY_POSITION = 0;
  var svg = root.querySelector("svg");
  var position = root.querySelector("#posenc-hero-position");
  var shift = root.querySelector("#posenc-hero-shift");
  var positionOut = root.querySelector("#posenc-hero-position-value");
  var shiftOut = root.querySelector("#posenc-hero-shift-value");
  var dotOut = root.querySelector("#posenc-hero-dot");
  var whereOut = root.querySelector("#posenc-hero-where");

  function rotate(v, pos) {  // RoPE: pair i of v turned by pos * theta_i
    var out = [];
    for (var i = 0; i < pairs; i++) {
      var a = pos * theta[i], c = Math.cos(a), s = Math.sin(a);
      out.push(c * v[2 * i] - s * v[2 * i + 1], s * v[2 * i] + c * v[2 * i + 1]);
    }
    return out;
  }

  function el(name, attrs, text) {
    var e = document.createElementNS(SVG, name);
    for (var key in attrs) e.setAttribute(key, attrs[key]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function arrow(group, cx, cy, r, x, y, color, id) {
    var ex = cx + r * x, ey = cy - r * y;
    group.appendChild(el("line", {x1: cx, y1: cy, x2: ex, y2: ey, stroke: color, "stroke-width": 4,
                                  "stroke-linecap": "round", "marker-end": "url(#" + id + ")"}));
  }

  function draw() {
    var m = parseInt(position.value, 10), s = parseInt(shift.value, 10);
    var qr = rotate(q, m + s), kr = rotate(k, KEY_POSITION + s);
    var dot = 0;
    for (var i = 0; i < dim; i++) dot += qr[i] * kr[i];
    var narrow = root.clientWidth < 560;  // a phone: two rows of two circles, so the labels stay legible
    var cols = narrow ? 2 : 4, rows = pairs / cols;
    var cell = 200, width = cols * cell, height = rows * (cell + 20);
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var defs = el("defs", {});
    [["posenc-hero-q", "#c0392b"], ["posenc-hero-k", "#1f6fb2"]].forEach(function (spec) {
      var marker = el("marker", {id: spec[0], viewBox: "0 0 10 10", refX: 7, refY: 5, markerWidth: 4,
                                 markerHeight: 4, orient: "auto-start-reverse"});
      marker.appendChild(el("path", {d: "M 0 0 L 10 5 L 0 10 z", fill: spec[1]}));
      defs.appendChild(marker);
    });
    svg.appendChild(defs);
    for (i = 0; i < pairs; i++) {
      var col = i % cols, row = Math.floor(i / cols);
      var cx = col * cell + cell / 2, cy = row * (cell + 20) + 30 + (cell - 40) / 2, r = (cell - 60) / 2;
      var g = el("g", {"class": "posenc-hero-pair", "data-pair": i});
      g.appendChild(el("circle", {cx: cx, cy: cy, r: r, fill: "none", stroke: "currentColor",
                                  "stroke-opacity": 0.3, "stroke-width": 1.5}));
      g.appendChild(el("text", {x: cx, y: row * (cell + 20) + 20, "text-anchor": "middle", "font-size": 19,
                                fill: "currentColor"}, "pair " + i + ",  \u03b8 = " + theta[i].toFixed(2)));
      var scale = 1 / 1.1;
      arrow(g, cx, cy, r * scale, kr[2 * i], kr[2 * i + 1], "#1f6fb2", "posenc-hero-k");
      arrow(g, cx, cy, r * scale, qr[2 * i], qr[2 * i + 1], "#c0392b", "posenc-hero-q");
      svg.appendChild(g);
    }
    positionOut.textContent = String(m);
    shiftOut.textContent = String(s);
    svg.setAttribute("aria-label", "The four pairs of q (red, at position " + (m + s) + ") and k (blue, at position "
                     + (KEY_POSITION + s) + ") as arrows on circles");
    dotOut.textContent = dot.toFixed(4);
    whereOut.textContent = "(q at position " + (m + s) + ", k at position " + (KEY_POSITION + s) + ", distance " + m + ")";
  }

  position.addEventListener("input", draw);
  shift.addEventListener("input", draw);
  var lastNarrow = null;
  window.addEventListener("resize", function () {
    var narrow = root.clientWidth < 560;
    if (narrow !== lastNarrow) { lastNarrow = narrow; draw(); }
  });
  draw();
}
// loaded in <head> on every page (html_js_files): wait for the page's body
if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", posencHero);
else posencHero();
