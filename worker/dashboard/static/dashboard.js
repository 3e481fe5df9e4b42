// The overview's live refresh: counts every 5 s, sparklines of depth and per-minute charts drawn with uPlot.
(function () {
  "use strict";
  if (document.body.dataset.page !== "overview") return;
  const colors = { succeeded: "#2f855a", retried: "#b7791f", dead_lettered: "#c53030" };
  const charts = {};
  const sparks = {};

  function chart(el, key, data, opts) {
    if (charts[key]) { charts[key].setData(data); return; }
    charts[key] = new uPlot(opts, data, el);
  }

  function draw(overview) {
    for (const q of overview.queues) {
      const row = document.querySelector(`tr[data-queue="${CSS.escape(q.name)}"]`);
      if (!row) continue;
      for (const field of ["visible", "in_flight", "delayed", "oldest"]) {
        row.querySelector(`[data-field="${field}"]`).textContent = q[field];
      }
      const points = overview.depth[q.name] || [];
      const el = row.querySelector(".spark");
      const data = [points.map((p) => p[0]), points.map((p) => p[1])];
      if (sparks[q.name]) { sparks[q.name].setData(data); continue; }
      sparks[q.name] = new uPlot({
        width: 220, height: 36, legend: { show: false }, cursor: { show: false },
        axes: [{ show: false }, { show: false }], scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max)] } },
        series: [{}, { stroke: q.role === "dlq" ? colors.dead_lettered : "#2f6fde", fill: "rgba(47,111,222,.08)", width: 1.5 }],
      }, data, el);
    }
    const s = overview.series;
    document.getElementById("series-source").textContent = `(${overview.series_source})`;
    for (const name of ["succeeded", "retried", "dead_lettered"]) {
      const el = document.querySelector(`[data-series="${name}"]`);
      chart(el, name, [s.t, s[name]], {
        width: Math.max(240, el.clientWidth - 4), height: 160, legend: { show: false },
        scales: {
          x: { time: true, range: () => { const now = Date.now() / 1000; return [now - 3600, now]; } },
          y: { range: (u, min, max) => [0, Math.max(5, max)] },
        },
        axes: [{}, { incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] }],
        series: [{}, { stroke: colors[name], fill: colors[name] + "22", width: 2, paths: uPlot.paths.bars({ size: [0.8, 12] }) }],
      });
    }
    document.getElementById("refreshed").textContent = "Last refreshed " + new Date().toLocaleTimeString() + ".";
    document.body.dataset.refreshed = String(Date.now());
  }

  async function refresh() {
    try {
      const response = await fetch("/api/overview", { credentials: "same-origin" });
      if (response.ok) draw(await response.json());
    } catch (e) { /* the next refresh tries again */ }
  }
  refresh();
  setInterval(refresh, 5000);
})();
