// Times for both pages: on the viewer's clock (24-hour; the date too when not today), how long ago, and
// how long something has lasted, kept current by tickClock. Every time given is a Unix time in seconds
// (the bus's and the render log's clock).
"use strict";

function pad(n) {
  return String(n).padStart(2, "0");
}

function localTime(seconds) {
  const t = new Date(seconds * 1000), now = new Date();
  const clock = `${pad(t.getHours())}:${pad(t.getMinutes())}:${pad(t.getSeconds())}`;
  return t.toDateString() === now.toDateString()
    ? clock : `${t.getFullYear()}-${pad(t.getMonth() + 1)}-${pad(t.getDate())} ${clock}`;
}

// A length of time: "45 s", "12 min", "3 h", "2 d".
function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 90) return `${s} s`;
  if (s < 90 * 60) return `${Math.round(s / 60)} min`;
  if (s < 36 * 3600) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}

function sinceNow(seconds) {
  return Date.now() / 1000 - seconds;
}

function age(seconds) {
  return sinceNow(seconds) < 5 ? "just now" : `${duration(sinceNow(seconds))} ago`;
}

// <time> with the local time (the exact one in its tooltip).
function timeElement(seconds, prefix) {
  const time = document.createElement("time");
  time.dateTime = new Date(seconds * 1000).toISOString();
  time.title = new Date(seconds * 1000).toString();
  time.textContent = (prefix ? prefix + " " : "") + localTime(seconds);
  return time;
}

// "12 s ago", kept current.
function ageElement(seconds) {
  const span = document.createElement("span");
  span.className = "age";
  span.dataset.seconds = String(seconds);
  span.textContent = age(seconds);
  return span;
}

// "45 s" since a time, kept current.
function elapsedElement(seconds) {
  const span = document.createElement("span");
  span.className = "elapsed";
  span.dataset.since = String(seconds);
  span.textContent = duration(sinceNow(seconds));
  return span;
}

function tickClock() {
  document.querySelectorAll(".age[data-seconds]").forEach((el) => {
    el.textContent = age(Number(el.dataset.seconds));
  });
  document.querySelectorAll(".elapsed[data-since]").forEach((el) => {
    el.textContent = duration(sinceNow(Number(el.dataset.since)));
  });
}

setInterval(tickClock, 1000);
