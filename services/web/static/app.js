// The live view: reads the JSON of /api/..., re-fetches what a pushed fact affects.
"use strict";
const $ = (id) => document.getElementById(id);
const state = { queue: null, share: "", job: null, charts: {}, util: null };
const shown = (share) => !state.share || share === state.share;  // the share filter
const COLOURS = { own: "#1976d2", borrowed: "#f57c00", lent: "#7cb342", idle: "#e0e0e0" };

async function get(path) {
  const response = await fetch(path, { cache: "no-store" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text == null ? "–" : String(text);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function fmt(n) { return Number.isInteger(n) ? String(n) : n.toFixed(2); }
function pairs(map) {
  const parts = Object.entries(map || {}).filter(([, v]) => v > 0)
    .map(([k, v]) => `${fmt(v)} ${k ? "from/to " + k : "not backed by idle quota"}`);
  return parts.length ? parts.join(", ") : "";
}

async function loadQueues() {
  const answer = await get("/api/queues");
  const select = $("queue");
  const before = state.queue;
  select.innerHTML = "";
  for (const name of answer.jobQueues) {
    const option = document.createElement("option");
    option.textContent = name;
    select.appendChild(option);
  }
  state.queue = answer.jobQueues.includes(before) ? before : (answer.jobQueues[0] || null);
  if (state.queue) select.value = state.queue;
}

function shareChart(unit, shares) {
  const id = "chart-" + unit.replace(/[^A-Za-z0-9]/g, "_");
  let box = document.getElementById(id);
  if (!box) {
    box = document.createElement("div");
    box.id = id;
    box.appendChild(document.createElement("canvas"));
    $("share-charts").appendChild(box);
  }
  const labels = shares.map((s) => `${s.quotaShareName} (limit ${s.units[unit].limit})`);
  const series = (key) => shares.map((s) => s.units[unit][key]);
  const datasets = [
    { label: "in use, own quota", data: series("own"), backgroundColor: COLOURS.own },
    { label: "borrowed", data: series("borrowed"), backgroundColor: COLOURS.borrowed },
    { label: "lent to other shares", data: series("lent"), backgroundColor: COLOURS.lent },
    { label: "idle", data: series("idle"), backgroundColor: COLOURS.idle },
  ];
  let chart = state.charts[unit];
  if (chart) {
    chart.data.labels = labels;
    chart.data.datasets.forEach((d, i) => { d.data = datasets[i].data; });
    chart.update("none");
    return;
  }
  state.charts[unit] = new Chart(box.querySelector("canvas"), {
    type: "bar",
    data: { labels, datasets },
    options: {
      indexAxis: "y", animation: false, maintainAspectRatio: false,
      plugins: { title: { display: true, text: `${unit}: instances per quota share` } },
      scales: { x: { stacked: true, beginAtZero: true, ticks: { precision: 0 } },
                y: { stacked: true } },
    },
  });
}

async function loadQueue() {
  if (!state.queue) return;
  const answer = await get("/api/queue?name=" + encodeURIComponent(state.queue));
  $("units").textContent = answer.units.join(", ");
  const env = answer.environment;
  $("environment").textContent = env ? `service environment ${env.name} (${env.state}): ` +
    env.capacity.map((c) => `${fmt(c.inUse)} of ${c.maxCapacity} ${c.capacityUnit} in use`).join(", ")
    : "";
  const body = $("shares").tBodies[0];
  body.innerHTML = "";
  const filter = $("share-filter");
  filter.innerHTML = '<option value="">all</option>';
  for (const share of answer.shares) {
    const option = document.createElement("option");
    option.textContent = share.quotaShareName;
    filter.appendChild(option);
  }
  filter.value = answer.shares.some((s) => s.quotaShareName === state.share) ? state.share : "";
  for (const share of answer.shares) {
    if (!shown(share.quotaShareName)) continue;
    for (const unit of answer.units) {
      const u = share.units[unit];
      const row = body.insertRow();
      row.dataset.share = share.quotaShareName;
      cell(row, share.quotaShareName);
      cell(row, share.strategy + (share.borrowLimit != null ? ` (borrow limit ${share.borrowLimit}%)` : ""));
      cell(row, share.jobs ? `${share.jobs.pending || 0} / ${share.jobs.admitted || 0}` : "–");
      cell(row, unit);
      cell(row, `${u.inUse} / ${u.limit}`);
      cell(row, u.borrowed ? `${u.borrowed} (${pairs(u.borrowedFrom)})` : "0");
      cell(row, u.lent ? `${fmt(u.lent)} (to ${pairs(u.lentTo)})` : "0");
      cell(row, fmt(u.idle));
    }
  }
  for (const unit of answer.units) shareChart(unit, answer.shares);
  const heads = $("heads").tBodies[0];
  heads.innerHTML = "";
  const listed = answer.heads.filter((head) => shown(head.quotaShareName));
  for (const head of listed) {
    const row = heads.insertRow();
    cell(row, head.quotaShareName);
    cell(row, head.jobName === head.jobId ? head.jobId : `${head.jobName} (${head.jobId})`);
    cell(row, head.schedulingPriority);
    cell(row, head.status);
    cell(row, head.waitingReason || "");
  }
  if (!listed.length) cell(heads.insertRow(), "no job waits at the head of " +
                              (state.share ? state.share : "any share"));
}

async function loadActivity() {
  if (!state.queue) return;
  const answer = await get("/api/activity?name=" + encodeURIComponent(state.queue));
  const list = $("activity");
  list.innerHTML = "";
  const events = answer.events.filter((event) => shown(event.quotaShareName));
  for (const event of events) {
    const item = document.createElement("li");
    item.className = event.kind;
    const when = event.at ? new Date(event.at * 1000).toLocaleTimeString() + " " : "";
    item.textContent = `${when}${event.sentence}`;
    list.appendChild(item);
  }
  if (!events.length) list.textContent = "nothing dispatched, preempted or ended yet";
}

async function loadJob() {
  const box = $("job");
  if (!state.job) return;
  let answer;
  try {
    answer = await get("/api/job?id=" + encodeURIComponent(state.job));
  } catch (error) {
    box.textContent = String(error.message);
    return;
  }
  box.innerHTML = "";
  const job = answer.job || {};
  const summary = document.createElement("p");
  summary.textContent = job.error ? job.error
    : `${job.jobName} in ${job.jobQueue}/${job.quotaShareName}: ${job.status}` +
      (job.statusReason ? ` (${job.statusReason})` : "") +
      `, priority ${job.schedulingPriority}, attempts ${(job.attempts || []).length}`;
  box.appendChild(summary);
  if (job.attempts && job.attempts.length) {
    const table = document.createElement("table");
    const head = table.createTHead().insertRow();
    for (const name of ["attempt", "started", "stopped", "reason"]) cell(head, name);
    job.attempts.forEach((a, i) => {
      const row = table.insertRow();
      cell(row, i + 1);
      cell(row, a.startedAt ? new Date(a.startedAt).toLocaleTimeString() : null);
      cell(row, a.stoppedAt ? new Date(a.stoppedAt).toLocaleTimeString() : null);
      cell(row, a.statusReason);
    });
    box.appendChild(table);
  }
  const story = document.createElement("pre");
  story.textContent = answer.text;
  box.appendChild(story);
}

async function loadUtilization() {
  const answer = await get("/api/utilization?per=share&window=" + $("window").value);
  const note = $("util-note");
  if (!answer.available) {
    note.textContent = answer.reason;
    if (state.util) { state.util.destroy(); state.util = null; }
    return;
  }
  const rows = answer.rows.filter((r) => !state.queue || r.job_queue === state.queue);
  note.textContent = rows.length ? `average instances in use per ${answer.bucketSeconds} s, ` +
    `from the projection (position ${answer.position})` : "nothing ran in this window";
  const starts = [...new Set(rows.map((r) => r.bucket_start))].sort((a, b) => a - b);
  const series = {};
  for (const r of rows) {
    const key = `${r.quota_share} ${r.capacity_unit}`;
    series[key] = series[key] || {};
    series[key][r.bucket_start] = r.used_s / Math.max(1e-9, r.bucket_end - r.bucket_start);
  }
  const labels = starts.map((t) => new Date(t * 1000).toLocaleTimeString());
  const datasets = Object.entries(series).map(([label, values]) => ({
    label, data: starts.map((t) => values[t] || 0), stepped: true, fill: false,
  }));
  if (state.util) {
    state.util.data.labels = labels;
    state.util.data.datasets = datasets;
    state.util.update("none");
  } else {
    state.util = new Chart($("util-chart"), {
      type: "line", data: { labels, datasets },
      options: { animation: false, maintainAspectRatio: false,
                 scales: { y: { beginAtZero: true, title: { display: true, text: "instances" } } } },
    });
  }
}

// -- server push: re-fetch what a fact affects, at most a few times a second ------------------
const pending = new Set();
let timer = null;
function refresh(...parts) {
  parts.forEach((p) => pending.add(p));
  if (timer) return;
  timer = setTimeout(async () => {
    const todo = [...pending];
    pending.clear();
    timer = null;
    const loaders = { queues: loadQueues, queue: loadQueue, activity: loadActivity,
                      job: loadJob, utilization: loadUtilization };
    for (const part of todo) {
      try { await loaders[part](); } catch (error) { console.warn(part, error); }
    }
  }, 250);
}

let lastUtil = 0;
function connect() {
  const source = new EventSource("/api/events");
  const live = $("live");
  source.addEventListener("hello", () => { live.textContent = "live"; live.className = "live"; });
  source.addEventListener("fact", (message) => {
    const event = JSON.parse(message.data);
    live.textContent = `live: fact ${event.seq || ""} ${event.kind}`;
    if (event.kind === "Resync" || !event.jobQueue) refresh("queues", "queue", "activity");
    else if (event.jobQueue === state.queue) refresh("queue", "activity");
    if (state.job && (event.jobId === state.job || event.kind === "Resync")) refresh("job");
    if (Date.now() - lastUtil > 5000) { lastUtil = Date.now(); refresh("utilization"); }
  });
  source.onerror = () => { live.textContent = "reconnecting…"; live.className = "live off"; };
}

$("queue").addEventListener("change", (e) => {
  state.queue = e.target.value;
  refresh("queue", "activity", "utilization");
});
$("share-filter").addEventListener("change", (e) => {
  state.share = e.target.value;
  const params = new URLSearchParams(location.search);
  if (state.share) params.set("share", state.share); else params.delete("share");
  history.replaceState(null, "", "?" + params);
  refresh("queue", "activity");
});
$("window").addEventListener("change", () => refresh("utilization"));
$("search").addEventListener("submit", (e) => {
  e.preventDefault();
  state.job = $("job-id").value.trim() || null;
  const params = new URLSearchParams(location.search);
  if (state.job) params.set("job", state.job); else params.delete("job");
  history.replaceState(null, "", "?" + params);
  refresh("job");
});

(async () => {
  const params = new URLSearchParams(location.search);
  state.job = params.get("job");
  state.share = params.get("share") || "";
  if (state.job) $("job-id").value = state.job;
  try { await loadQueues(); } catch (error) { $("util-note").textContent = String(error); }
  if (params.get("queue")) state.queue = params.get("queue");
  refresh("queue", "activity", "utilization", "job");
  connect();
})();
