"""The page's scripts: Chart.js itself, read from the web view's vendored copy (one copy in
the package, services/web/static/vendor, with its LICENSE.md and PROVENANCE), and the short
script that draws each chart from the report's JSON (series.py says what the datasets mean).

Both are inlined, so the report stays one file that works offline; `inline` checks that a
text is safe inside a <script> element.
"""

from __future__ import annotations

from importlib import resources

CHART_JS = ("static", "vendor", "chart.umd.min.js")

DRAW_JS = r"""
"use strict";
(() => {
  const report = JSON.parse(document.getElementById("report-data").textContent);
  const patterns = new Map();

  function hatch(colour, background) {  // stripes in the colour, on a light wash of it
    const key = colour + (background || "");
    if (!patterns.has(key)) {
      const tile = document.createElement("canvas");
      tile.width = tile.height = 8;
      const ctx = tile.getContext("2d");
      ctx.fillStyle = background || colour + "30";
      ctx.fillRect(0, 0, 8, 8);
      ctx.strokeStyle = colour;
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      for (const o of [-8, 0, 8]) { ctx.moveTo(o, 8); ctx.lineTo(o + 8, 0); }
      ctx.stroke();
      patterns.set(key, ctx.createPattern(tile, "repeat"));
    }
    return patterns.get(key);
  }

  function when(t) {  // the tooltip's title, by the page's time rule (timeaxis.py)
    if (report.time.mode === "utc") {
      return new Date(t * 1000).toISOString().replace("T", " ").replace(/(\.000)?Z$/, " UTC");
    }
    let s = Math.abs(t - report.time.origin);
    const parts = [[86400, "d"], [3600, "h"], [60, "min"]].map(([unit, name]) => {
      const n = Math.floor(s / unit);
      s -= n * unit;
      return n ? `${n} ${name}` : "";
    }).filter(Boolean);
    if (s || !parts.length) parts.push(`${+s.toFixed(3)} s`);
    return `${t < report.time.origin ? "-" : "+"}${parts.join(" ")} (t=${t} s)`;
  }

  // Hovering a step chart names the step under the pointer (the last point at or before it),
  // not the nearest point, which may be the next step's; markers when the pointer is on them.
  Chart.Interaction.modes.step = (chart, event) => {
    const x = chart.scales.x.getValueForPixel(event.x);
    const items = [];
    chart.data.datasets.forEach((dataset, datasetIndex) => {
      const meta = chart.getDatasetMeta(datasetIndex);
      if (!chart.isDatasetVisible(datasetIndex)) return;
      if (dataset.type === "scatter") {
        meta.data.forEach((element, index) => {
          if (Math.hypot(element.x - event.x, element.y - event.y) < 9) {
            items.push({ element, datasetIndex, index });
          }
        });
        return;
      }
      let low = 0, high = dataset.data.length - 1;
      if (high < 0 || dataset.data[0][0] > x) return;
      while (low < high) {  // the last point at or before x
        const middle = Math.ceil((low + high) / 2);
        if (dataset.data[middle][0] <= x) low = middle; else high = middle - 1;
      }
      items.push({ element: meta.data[low], datasetIndex, index: low });
    });
    return items;
  };
  Chart.Tooltip.positioners.pointer = (items, position) => position;

  // Chart.js draws a lower `order` later: the usage areas first, then what is over capacity,
  // the capacity line and the markers on top.
  const ORDER = { area: 0, over: -1, line: -2, marker: -3 };

  function dataset(d) {
    const common = { label: d.label, data: d.points, stack: d.stack, borderColor: d.colour,
                     pointRadius: 0, pointHitRadius: 4,
                     order: ORDER[d.key === "over" ? "over" : d.kind] };
    if (d.kind === "marker") {
      return { ...common, type: "scatter", pointStyle: "triangle", pointRadius: 7,
               pointHoverRadius: 9, backgroundColor: d.colour, clip: false };
    }
    if (d.kind === "line") {
      return { ...common, stepped: true, fill: false, borderWidth: 2.5, backgroundColor: d.colour };
    }
    return { ...common, stepped: true, fill: d.fill, borderWidth: d.hatch ? 1 : 0,
             backgroundColor: d.hatch ? hatch(d.colour, d.background) : d.colour + "d0" };
  }

  const byIndex = (a, b) => a.datasetIndex - b.datasetIndex;  // the shares first, as given

  function draw(spec, canvas) {
    const labels = new Map(spec.ticks.map((tick) => [tick.value, tick.label]));
    new Chart(canvas, {
      type: "line",
      data: { datasets: spec.datasets.map(dataset) },
      options: {
        animation: false, maintainAspectRatio: false,
        interaction: { mode: "step", intersect: false },
        scales: {
          x: { type: "linear", min: spec.t0, max: spec.t1,
               title: { display: true, text: report.time.title },
               afterBuildTicks: (axis) => {
                 axis.ticks = spec.ticks.map((tick) => ({ value: tick.value }));
               },
               ticks: { callback: (value) => labels.get(value) ?? "", maxRotation: 0 } },
          y: { stacked: true, beginAtZero: true, ticks: { precision: 0 },
               title: { display: true, text: spec.yTitle } },
        },
        plugins: {
          legend: { labels: { boxWidth: 14, boxHeight: 10, font: { size: 11 }, sort: byIndex } },
          tooltip: {
            position: "pointer",
            itemSort: byIndex,
            filter: (item) => Boolean(item.raw.text) || item.parsed.y !== 0,
            callbacks: {
              title: (items) => (!items.length ? ""
                : items[0].raw.text ? when(items[0].parsed.x) : `from ${when(items[0].parsed.x)}`),
              label: (item) => item.raw.text
                || `${item.dataset.label}: ${+item.parsed.y.toFixed(2)}`,
            },
          },
        },
      },
    });
  }

  document.querySelectorAll("canvas[data-chart]").forEach(
    (canvas) => draw(report.charts[Number(canvas.dataset.chart)], canvas));
  // For the PNG (png.py): the height of the content, so the screenshot ends where it does,
  // and its width, so a table wider than the window is not cut off at the window's edge.
  const bottom = document.querySelector("main").getBoundingClientRect().bottom + window.scrollY;
  document.documentElement.dataset.contentHeight = String(Math.ceil(bottom) + 24);
  document.documentElement.dataset.contentWidth = String(document.documentElement.scrollWidth);
})();
"""


def chart_js() -> str:
    """Chart.js, as vendored for the web view (package data of quotasched.services.web)."""
    path = resources.files("quotasched.services.web").joinpath(*CHART_JS)
    return path.read_text(encoding="utf-8")


def inline(text: str) -> str:
    """A script's text, checked to be safe inside <script>...</script> (neither Chart.js nor
    DRAW_JS has "</" or "<!--"; the JSON data is escaped where it is written, page.py)."""
    if "</" in text or "<!--" in text:
        raise ValueError("a script to inline holds '</' or '<!--'")
    return text
