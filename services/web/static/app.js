// The live view.  The server renders the first state (render.py) and embeds its JSON; this
// script draws the charts from it, then re-fetches /api/... as pushed facts affect them.
// Every value goes into the page as textContent (or an attribute), never as markup.
"use strict";
const $ = (id) => document.getElementById(id);
const state = { queue: null, share: "", offset: 0, job: null, window: "1h", charts: {},
                usage: null, position: 0 };
const shown = (share) => !state.share || share === state.share;  // the share filter
const COLOURS = { own: "#1976d2", borrowed: "#f57c00", lent: "#7cb342", idle: "#e0e0e0" };
const LINES = ["#1976d2", "#f57c00", "#7cb342", "#8e24aa", "#00897b", "#c62828", "#6d4c41"];

async function get(path) {
  const response = await fetch(path, { cache: "no-store" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text != null) node.textContent = String(text);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  return node;
}

function cell(row, text) {
  const td = el("td", text == null ? "–" : text);
  row.appendChild(td);
  return td;
}

function fmt(n) { return Number.isInteger(n) ? String(n) : n.toFixed(2); }
function pairs(map) {
  return Object.entries(map || {}).filter(([, v]) => v > 0)
    .map(([k, v]) => `${fmt(v)} ${k ? "from/to " + k : "not backed by idle quota"}`).join(", ");
}
// A fact's time as HH:MM:SS (the server writes the same), or t=… s for a logical time.
function clock(at) {
  if (at == null) return "";
  if (at < 1e9) return `t=${Number(at.toPrecision(6))} s`;
  const d = new Date(at * 1000);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, "0"))
    .join(":");
}
// A link to this page with some parameters changed (the server renders the same links).
function link(changes) {
  const params = { queue: state.queue, share: state.share, window: state.window, ...changes };
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) if (value) query.set(key, value);
  return "?" + query;
}
function remember() {
  history.replaceState(null, "", link({ offset: state.share ? state.offset : 0, job: state.job }));
}

function renderQueues(queues) {
  const select = $("queue");
  select.replaceChildren(...queues.map((name) => el("option", name)));
  if (!queues.includes(state.queue)) state.queue = queues[0] || null;
  if (state.queue) select.value = state.queue;
}

function shareChart(unit, shares) {
  const id = "chart-" + unit.replace(/[^A-Za-z0-9]/g, "_");
  let box = document.getElementById(id);
  if (!box) {
    box = el("div", null, { id });
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
  const chart = state.charts[unit];
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

function renderQueue(answer) {
  $("units").textContent = answer.units.join(", ");
  const env = answer.environment;
  $("environment").textContent = env ? `service environment ${env.name} (${env.state}): ` +
    env.capacity.map((c) => `${fmt(c.inUse)} of ${c.maxCapacity} ${c.capacityUnit} in use`)
      .join(", ") : "";
  const filter = $("share-filter");
  filter.replaceChildren(el("option", "all", { value: "" }),
                         ...answer.shares.map((s) => el("option", s.quotaShareName)));
  if (!answer.shares.some((s) => s.quotaShareName === state.share)) state.share = "";
  filter.value = state.share;
  const body = $("shares").tBodies[0];
  body.replaceChildren();
  for (const share of answer.shares) {
    if (!shown(share.quotaShareName)) continue;
    for (const unit of answer.units) {
      const u = share.units[unit];
      const row = body.insertRow();
      row.dataset.share = share.quotaShareName;
      cell(row, share.quotaShareName);
      cell(row, (share.strategy || "") +
                (share.borrowLimit != null ? ` (borrow limit ${share.borrowLimit}%)` : ""));
      cell(row, share.jobs ? `${share.jobs.pending || 0} / ${share.jobs.admitted || 0}` : "–");
      cell(row, unit);
      cell(row, `${u.inUse} / ${u.limit}`);
      cell(row, u.borrowed ? `${u.borrowed} (${pairs(u.borrowedFrom)})` : "0");
      cell(row, u.lent ? `${fmt(u.lent)} (to ${pairs(u.lentTo)})` : "0");
      cell(row, fmt(u.idle));
    }
  }
  for (const unit of answer.units) shareChart(unit, answer.shares);
  renderWaiting(answer.waiting);
}

function waitingCount(page) {
  const n = page.jobs.length;
  return n ? `${page.offset + 1}-${page.offset + n} of ${page.total} waiting`
    : `${page.total} waiting`;
}

function renderWaiting(pages) {
  const box = $("waiting");
  box.replaceChildren();
  for (const [name, page] of Object.entries(pages)) {
    if (!shown(name)) continue;
    const part = el("div", null, { class: "share-waiting", "data-share": name });
    const title = el("h3", name + " ");
    title.appendChild(el("span", waitingCount(page), { class: "sub" }));
    part.appendChild(title);
    if (!page.jobs.length) {
      part.appendChild(el("p", page.total && page.offset >= page.total
        ? `no job here: ${name} has ${page.total} waiting (offset ${page.offset})`
        : `no job waits in ${name}`, { class: "none" }));
    } else {
      const table = el("table", null, { class: "waiting" });
      const head = table.createTHead().insertRow();
      for (const label of ["#", "job", "priority", "why it waits"]) {
        head.appendChild(el("th", label));
      }
      const body = table.createTBody();
      page.jobs.forEach((job, i) => {
        const row = body.insertRow();
        row.dataset.jobId = job.jobId;
        cell(row, page.offset + i + 1);
        const who = el("a", job.jobLabel, { href: link({ job: job.jobId }),
                                            title: `job id ${job.jobId}`, class: "job" });
        who.dataset.jobId = job.jobId;
        cell(row, "").replaceChildren(who);
        cell(row, job.schedulingPriority);
        const why = cell(row, " " + job.waitingReason.message);
        why.prepend(el("code", job.waitingReason.code));
      });
      part.appendChild(table);
    }
    const links = [];
    if (page.offset > 0) {
      links.push(el("a", "previous", { class: "previous", "data-share": name,
        "data-offset": Math.max(0, page.offset - page.limit),
        href: link({ share: name, offset: Math.max(0, page.offset - page.limit) }) }));
    }
    if (page.nextOffset != null) {
      links.push(el("a", "next", { class: "next", "data-share": name,
        "data-offset": page.nextOffset, href: link({ share: name, offset: page.nextOffset }) }));
    }
    if (links.length) {
      const nav = el("nav", null, { class: "pager" });
      links.forEach((a, i) => { if (i) nav.append(" "); nav.append(a); });
      part.appendChild(nav);
    }
    box.appendChild(part);
  }
}

function renderActivity(events) {
  const list = $("activity");
  list.replaceChildren();
  const kept = events.filter((event) => shown(event.quotaShareName));
  for (const event of kept) {
    const ids = [event.jobId, event.preemptorJobId].filter(Boolean);
    const when = clock(event.at);
    list.appendChild(el("li", (when ? when + " " : "") + event.sentence,
                        { class: event.kind, "data-job-id": event.jobId || "",
                          title: "job ids: " + ids.join(", ") }));
  }
  if (!kept.length) list.textContent = "nothing dispatched, preempted or ended yet";
}

function renderJob(answer) {
  const box = $("job");
  box.replaceChildren();
  if (!answer) return;
  if (answer.error && !answer.job) { box.appendChild(el("p", answer.error)); return; }
  const job = answer.job || {};
  box.appendChild(el("p", job.error ? job.error
    : `${answer.jobLabel || job.jobName} in ${job.jobQueue}/${job.quotaShareName}: ${job.status}` +
      (job.statusReason ? ` (${job.statusReason})` : "") +
      `, priority ${job.schedulingPriority}, attempts ${(job.attempts || []).length}`,
    { title: `job id ${answer.jobId || ""}` }));
  if (job.attempts && job.attempts.length) {
    const table = el("table");
    const head = table.createTHead().insertRow();
    for (const name of ["attempt", "started", "stopped", "reason"]) cell(head, name);
    const body = table.createTBody();
    job.attempts.forEach((a, i) => {
      const row = body.insertRow();
      cell(row, i + 1);
      cell(row, a.startedAt ? clock(a.startedAt / 1000) : null);
      cell(row, a.stoppedAt ? clock(a.stoppedAt / 1000) : null);
      cell(row, a.statusReason);
    });
    box.appendChild(table);
  }
  box.appendChild(el("pre", answer.text || ""));
}

function usageNote(answer) {
  if (!answer.available) return answer.reason;
  if (!answer.series.length) return "nothing ran in this job queue yet";
  return "instances in use, stepping at each dispatch, preemption and end (from the " +
    `projection, position ${answer.position})` +
    (answer.truncated ? "; only the newest steps are drawn" : "");
}

// Instances in use as step lines: each point is a fact's own time, the level holds until the
// next one (Chart.js `stepped`), on a linear time axis labelled from the data.
function renderUsage(answer) {
  $("usage-note").textContent = usageNote(answer);
  const box = $("usage-box");
  if (!answer.available || !answer.series.length) {
    if (state.usage) { state.usage.destroy(); state.usage = null; }
    box.replaceChildren();
    return;
  }
  const lines = answer.series.map((s, i) => [s, i])
    .filter(([s]) => s.quotaShareName == null || shown(s.quotaShareName));
  const datasets = lines.map(([s, i]) => {
    const total = s.quotaShareName == null;
    const colour = total ? "#222" : LINES[i % LINES.length];
    return { label: `${s.label} (${s.points[s.points.length - 1][1]} now)`, stepped: true,
             data: s.points.map(([at, n]) => ({ x: at * 1000, y: n })), fill: false,
             borderColor: colour, backgroundColor: colour, borderDash: total ? [5, 3] : [],
             pointRadius: 0, borderWidth: 2 };
  });
  const x = { type: "linear", min: answer.t0 * 1000, max: answer.t1 * 1000,
              ticks: { maxTicksLimit: 6, callback: (v) => clock(v / 1000) } };
  if (state.usage) {
    state.usage.data.datasets = datasets;
    Object.assign(state.usage.options.scales.x, { min: x.min, max: x.max });
    state.usage.update("none");
    return;
  }
  const canvas = document.createElement("canvas");
  box.replaceChildren(canvas);
  state.usage = new Chart(canvas, {
    type: "line", data: { datasets },
    options: { animation: false, maintainAspectRatio: false, parsing: false,
               scales: { x, y: { beginAtZero: true, ticks: { precision: 0 },
                                 title: { display: true, text: "instances in use" } } } },
  });
}

const loaders = {
  queues: async () => renderQueues((await get("/api/queues")).jobQueues),
  queue: async () => {
    if (!state.queue) return;
    const query = new URLSearchParams({ name: state.queue });
    if (state.share) { query.set("share", state.share); query.set("offset", state.offset); }
    renderQueue(await get("/api/queue?" + query));
  },
  activity: async () => {
    if (!state.queue) return;
    renderActivity((await get("/api/activity?name=" + encodeURIComponent(state.queue))).events);
  },
  job: async () => {
    if (!state.job) return;
    try {
      renderJob(await get("/api/job?id=" + encodeURIComponent(state.job)));
    } catch (error) { renderJob({ error: String(error.message) }); }
  },
  usage: async () => {
    if (!state.queue) return;
    renderUsage(await get(`/api/usage?name=${encodeURIComponent(state.queue)}` +
                          `&window=${state.window}`));
  },
};

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
    for (const part of todo) {
      try { await loaders[part](); } catch (error) { console.warn(part, error); }
    }
  }, 250);
}

let lastUsage = 0;
function connect() {
  const source = new EventSource("/api/events");
  const live = $("live");
  // facts that landed between what the page shows and this stream (its first render, or a
  // reconnection) were not pushed to it: then it reads everything again
  source.addEventListener("hello", (message) => {
    live.textContent = "live";
    live.className = "live";
    const position = JSON.parse(message.data).position;
    if (position !== state.position) {
      state.position = position;
      refresh("queues", "queue", "activity", "usage", ...(state.job ? ["job"] : []));
    }
  });
  source.addEventListener("fact", (message) => {
    const event = JSON.parse(message.data);
    if (event.seq) state.position = event.seq;
    live.textContent = `live: fact ${event.seq || ""} ${event.kind}`;
    if (event.kind === "Resync" || !event.jobQueue) refresh("queues", "queue", "activity");
    else if (event.jobQueue === state.queue) refresh("queue", "activity");
    if (state.job && (event.jobId === state.job || event.kind === "Resync")) refresh("job");
    if (Date.now() - lastUsage > 2000) { lastUsage = Date.now(); refresh("usage"); }
  });
  source.onerror = () => { live.textContent = "reconnecting…"; live.className = "live off"; };
}

$("pick").addEventListener("submit", (e) => e.preventDefault());
$("queue").addEventListener("change", (e) => {
  state.queue = e.target.value;
  state.share = "";
  state.offset = 0;
  remember();
  refresh("queue", "activity", "usage");
});
$("share-filter").addEventListener("change", (e) => {
  state.share = e.target.value;
  state.offset = 0;
  remember();
  refresh("queue", "activity", "usage");
});
$("window").addEventListener("change", (e) => {
  state.window = e.target.value;
  remember();
  refresh("usage");
});
$("search").addEventListener("submit", (e) => {
  e.preventDefault();
  state.job = $("job-id").value.trim() || null;
  remember();
  refresh("job");
});
$("waiting").addEventListener("click", (e) => {
  const target = e.target.closest("a");
  if (!target) return;
  e.preventDefault();
  if (target.classList.contains("job")) {
    state.job = target.dataset.jobId;
    $("job-id").value = state.job;
    remember();
    refresh("job");
    return;
  }
  state.share = target.dataset.share;
  state.offset = Number(target.dataset.offset);
  remember();
  refresh("queue", "activity", "usage");
});

(() => {
  const first = JSON.parse($("first-state").textContent);
  const params = new URLSearchParams(location.search);
  Object.assign(state, { queue: first.queue, share: first.share || "", window: first.window,
                         job: first.job || null, offset: Number(params.get("offset")) || 0,
                         position: first.position });
  renderQueues(first.queues);
  if (first.view) renderQueue(first.view);
  renderActivity(first.activity);
  if (first.usage) renderUsage(first.usage);
  if (first.job && !first.story) refresh("job");
  // live once the page has loaded: a one-shot capture (--screenshot, --dump-dom) sees the
  // first state, and a failed read at render time is tried again here
  addEventListener("load", () => {
    connect();
    if (!first.view) refresh("queues", "queue", "activity", "usage");
  });
})();
