// Live status page: one EventSource; every event carries the whole snapshot (it is small).
"use strict";

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (cls) td.className = cls;
  return td;
}

function fill(id, rows, empty) {
  const body = document.getElementById(id);
  body.replaceChildren();
  if (!rows.length && empty) rows = [[cell(empty)]];
  for (const cells of rows) {
    const tr = document.createElement("tr");
    tr.append(...cells);
    body.append(tr);
  }
}

function setText(id, value) {
  document.getElementById(id).textContent = String(value);
}

// Times in the viewer's own time zone (24-hour clock; the date too when not today) and how long ago, kept
// current by ageTick. `seconds` is a Unix time (the bus's and the render log's clock).
function pad(n) {
  return String(n).padStart(2, "0");
}

function localTime(seconds) {
  const t = new Date(seconds * 1000), now = new Date();
  const clock = `${pad(t.getHours())}:${pad(t.getMinutes())}:${pad(t.getSeconds())}`;
  return t.toDateString() === now.toDateString()
    ? clock : `${t.getFullYear()}-${pad(t.getMonth() + 1)}-${pad(t.getDate())} ${clock}`;
}

function age(seconds) {
  const s = Math.max(0, Math.round(Date.now() / 1000 - seconds));
  if (s < 5) return "just now";
  if (s < 90) return `${s} s ago`;
  if (s < 90 * 60) return `${Math.round(s / 60)} min ago`;
  if (s < 36 * 3600) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

function timeCell(seconds, prefix) {
  const td = document.createElement("td");
  if (typeof seconds !== "number" || !Number.isFinite(seconds)) return td;
  const time = document.createElement("time");
  time.dateTime = new Date(seconds * 1000).toISOString();
  time.title = new Date(seconds * 1000).toString();
  time.textContent = (prefix ? prefix + " " : "") + localTime(seconds);
  const ago = document.createElement("span");
  ago.className = "age";
  ago.dataset.seconds = String(seconds);
  ago.textContent = age(seconds);
  td.append(time, " ", ago);
  return td;
}

function ageTick() {
  document.querySelectorAll(".age[data-seconds]").forEach((el) => {
    el.textContent = age(Number(el.dataset.seconds));
  });
}

// A finished job's phase is its last: "done", or the phase a failed or cancelled job stopped in.
function phaseCell(job) {
  const finished = ["succeeded", "failed", "cancelled"].includes(job.state);
  if (!finished || job.phase === "done") return cell(job.phase);
  return cell(job.state === "succeeded" ? "done" : `stopped in ${job.phase}`);
}

function jobTimeCell(job) {
  if (job.finished_at) return timeCell(job.finished_at, "finished");
  if (job.started_at) return timeCell(job.started_at, "started");
  return timeCell(job.submitted_at, "submitted");
}

function progressCell(job) {
  const td = document.createElement("td");
  const spark = job.spark || {};
  if (spark.tasks) {
    const bar = document.createElement("progress");
    bar.max = spark.tasks;
    bar.value = spark.tasks_completed || 0;
    td.append(bar, ` ${spark.tasks_completed || 0}/${spark.tasks} tasks`);
  } else if (job.counters && Object.keys(job.counters).length) {
    td.textContent = Object.entries(job.counters).map(([k, v]) => `${k} ${v}`).join(", ");
  }
  return td;
}

function render(s) {
  const q = s.queues;
  setText("queue-total", q.total);
  setText("queue-missing", q.missing);
  setText("queue-important", q.important);
  setText("queue-expired", q.expired);
  setText("queue-bulk", q.bulk);
  setText("queue-rendering", q.rendering);
  const qm = s.queuemaster;
  const state = document.getElementById("qm-state");
  state.textContent = qm.online ? "" : `(queuemaster offline: ${qm.error || "no answer yet"})`;
  state.className = qm.online ? "" : "error";
  fill("by-zoom", Object.entries(q.expired_by_zoom).map(([z, n]) => [cell(z), cell(n, "num")]), "none");
  fill("counters", Object.entries(qm.counters || {}).map(([k, v]) => [cell(k), cell(v, "num")]));
  setText("renderer-count", s.renderers.length);
  fill("renderers", s.renderers.map((r) => [
    cell(r.renderer), cell(r.strategy), cell(r.state, "state-" + r.state), cell(r.metatile || "–"),
    cell(r.rendered, "num"), cell(r.rate_per_minute, "num"), cell(r.failures, "num"),
  ]), "no render threads registered");
  const ended = (r) => (typeof r.start === "number" ? r.start + (r.duration || 0) : null);
  fill("recent", s.recent_renders.map((r) => [cell(r.metatile), cell(r.renderer), cell(r.duration, "num"),
    timeCell(ended(r))]), "none yet");
  fill("failures", s.recent_failures.map((r) => [cell(r.metatile), cell(r.renderer), cell(r.reason),
    timeCell(ended(r))]), "none");
  const spark = document.getElementById("spark-state");
  spark.textContent = s.spark.error ? "(bridge not answering)" : "";
  spark.title = s.spark.error || "";
  fill("jobs", s.spark.jobs.map((j) => [
    cell((j.job_id || "").slice(0, 12)), cell(j.kind), cell(j.state), phaseCell(j), progressCell(j),
    jobTimeCell(j),
  ]), "no jobs");
  fill("dead-letters", Object.entries(s.dead_letters).map(([k, v]) => [cell(k), cell(v, "num")]), "none");
  fill("units", s.units.map((u) => [cell(u.app), cell(u.host), cell(u.pid, "num")]));
  document.querySelectorAll("#counters tr").forEach((tr) => {
    tr.dataset.counter = tr.firstChild.textContent;
  });
  document.body.dataset.version = String(s.version);
}

function connect() {
  const live = document.getElementById("live");
  const events = new EventSource("/events");
  events.onopen = () => { live.textContent = "live"; live.className = "live"; };
  events.onmessage = (event) => render(JSON.parse(event.data));
  events.onerror = () => { live.textContent = "reconnecting…"; live.className = "live off"; };
}

connect();
setInterval(ageTick, 5000);
