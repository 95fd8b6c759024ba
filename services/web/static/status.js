// Live status page: one EventSource; every event carries the whole snapshot (it is small). What does not
// answer is said in plain words with since when, and the figures it gave last are greyed (class "stale").
"use strict";

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (cls) td.className = cls;
  return td;
}

// rows: arrays of cells, or {cells, cls, title} for a row of its own class.
function fill(id, rows, empty) {
  const body = document.getElementById(id);
  body.replaceChildren();
  if (!rows.length && empty) {
    const td = cell(empty, "empty");
    td.colSpan = 9;  // across the table
    rows = [[td]];
  }
  for (const row of rows) {
    const tr = document.createElement("tr");
    const cells = Array.isArray(row) ? row : row.cells;
    if (!Array.isArray(row)) {
      if (row.cls) tr.className = row.cls;
      if (row.title) tr.title = row.title;
    }
    tr.append(...cells);
    body.append(tr);
  }
}

function setText(id, value) {
  document.getElementById(id).textContent = String(value);
}

function timeCell(seconds, prefix) {
  const td = document.createElement("td");
  if (typeof seconds !== "number" || !Number.isFinite(seconds)) return td;
  td.append(timeElement(seconds, prefix), " ", ageElement(seconds));
  return td;
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

// A polled source's line: what does not answer and since when (the technical error in the tooltip), or
// that it answers again after an outage; hidden while all is well. `name`: "queuemaster", "Spark bridge".
// `optional`: one that never answered is a notice, not an error (a deployment may run without it).
function sourceLine(id, src, name, optional) {
  const line = document.getElementById(id);
  line.replaceChildren();
  line.title = src.detail || "";
  line.hidden = false;
  if (src.down_since !== null && src.down_since !== undefined) {
    const headline = document.createElement("strong");
    if (src.never_heard && optional) {
      headline.append(`no ${name} answers`);
      line.className = "state-line notice";
    } else {
      headline.append(src.never_heard ? `${name} has not answered since toposm-web started at `
        : `${name} not answering since `, timeElement(src.down_since), " (", elapsedElement(src.down_since), ")");
      line.className = "state-line error";
    }
    line.append(headline, `: ${src.error}`);
  } else if (src.recovered) {
    line.append(`${name} answering ${src.first_answer ? "" : "again "}since `, timeElement(src.back_at),
      `, after ${duration(src.was_down_for)} without an answer`);
    line.className = "state-line recovered";
  } else if (!src.online) {
    line.append(`asking the ${name}…`);
    line.className = "state-line pending";
  } else {
    line.hidden = true;
  }
}

function lastHeardNote(id, src, name) {
  const note = document.getElementById(id);
  note.hidden = src.online || src.never_heard;
  if (!note.hidden) {
    note.replaceChildren("As last heard at ", timeElement(src.heard_at), " (", ageElement(src.heard_at),
      `): the ${name} is not answering.`);
  }
}

function render(s) {
  const qm = s.queuemaster;
  const known = !qm.never_heard;  // figures the queuemaster gave, stale or not
  const stale = known && !qm.online;
  const q = s.queues;
  for (const kind of ["total", "missing", "important", "expired", "bulk", "rendering"]) {
    setText(`queue-${kind}`, known ? q[kind] : "–");
  }
  sourceLine("qm-state", qm, "queuemaster", false);
  const noAnswer = "no answer from the queuemaster yet";
  document.getElementById("queue").classList.toggle("stale", stale);
  document.getElementById("threads").classList.toggle("stale", stale);
  lastHeardNote("threads-note", qm, "queuemaster");
  fill("by-zoom", Object.entries(q.expired_by_zoom).map(([z, n]) => [cell(z), cell(n, "num")]),
    known ? "none" : noAnswer);
  fill("counters", Object.entries(qm.counters || {}).map(([k, v]) => [cell(k), cell(v, "num")]),
    known ? "none" : noAnswer);
  setText("renderer-count", known ? s.renderers.length : "–");
  fill("renderers", s.renderers.map((r) => [
    cell(r.renderer), cell(r.strategy), cell(r.state, "state-" + r.state), cell(r.metatile || "–"),
    cell(r.rendered, "num"), cell(r.rate_per_minute, "num"), cell(r.failures, "num"),
  ]), known ? "no render threads registered" : noAnswer);
  const ended = (r) => (typeof r.start === "number" ? r.start + (r.duration || 0) : null);
  fill("recent", s.recent_renders.map((r) => [cell(r.metatile), cell(r.renderer), cell(r.duration, "num"),
    timeCell(ended(r))]), "none yet");
  fill("failures", s.recent_failures.map((r) => [cell(r.metatile), cell(r.renderer), cell(r.reason),
    timeCell(ended(r))]), "none");
  const spark = s.spark;
  sourceLine("spark-state", spark, "Spark bridge", true);
  document.getElementById("spark").classList.toggle("stale", !spark.online && spark.jobs.length > 0);
  fill("jobs", spark.jobs.map((j) => [
    cell((j.job_id || "").slice(0, 12)), cell(j.kind), cell(j.state), phaseCell(j), progressCell(j),
    jobTimeCell(j),
  ]), "no jobs");
  const meanings = s.dead_letter_meanings || {};
  fill("dead-letters", Object.entries(s.dead_letters).map(([k, v]) => {
    const m = meanings[k] || { meaning: "", level: "notice" };
    return { cells: [cell(k), cell(v, "num"), cell(m.meaning)], cls: `dead-${m.level}`, title: m.meaning };
  }), "none");
  fill("units", s.units.map((u) => [cell(u.app), cell(u.host), cell(u.pid, "num")]));
  document.querySelectorAll("#counters tr").forEach((tr) => {
    tr.dataset.counter = tr.firstChild.textContent;
  });
  document.body.dataset.version = String(s.version);
}

// The badge in the header says "live" only when it is: the stream is open, updates keep coming and the
// queuemaster answers; otherwise what is wrong.
const stream = { open: false, lastEventAt: null, snapshot: null };

function badge() {
  const live = document.getElementById("live");
  const s = stream.snapshot;
  let text = "live", cls = "live";
  if (!stream.open || !s) {
    text = stream.lastEventAt ? `reconnecting… (last update ${localTime(stream.lastEventAt)})` : "connecting…";
    cls = "live off";
  } else if (sinceNow(stream.lastEventAt) > s.updates_within) {
    text = `no update since ${localTime(stream.lastEventAt)}`;
    cls = "live off";
  } else if (!s.queuemaster.online) {
    text = s.queuemaster.never_heard && !s.queuemaster.down_since ? "live, asking the queuemaster…"
      : "degraded: queuemaster down";
    cls = "live degraded";
  }
  if (live.textContent !== text) live.textContent = text;
  live.className = cls;
}

function connect() {
  const events = new EventSource("/events");
  events.onopen = () => { stream.open = true; badge(); };
  events.onmessage = (event) => {
    stream.open = true;
    stream.lastEventAt = Date.now() / 1000;
    stream.snapshot = JSON.parse(event.data);
    render(stream.snapshot);
    badge();
  };
  events.onerror = () => { stream.open = false; badge(); };
}

connect();
setInterval(badge, 1000);
