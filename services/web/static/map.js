// Slippy map of the tile store; overlay of metatiles expired or requested; click to request a render.
// The view lives in the URL hash as on openstreetmap.org (#map=zoom/lat/lon), so a reload or a shared link
// shows the same place; without one the map opens where the tile store has tiles (/api/extent).
"use strict";

const map = L.map("map", { worldCopyJump: true });

// The view a URL asks for: #map=zoom/lat/lon, or the older ?zoom=&lat=&lon= form; null when it asks none.
function viewInUrl() {
  const hash = /^#map=(\d{1,2})\/(-?[\d.]+)\/(-?[\d.]+)$/.exec(location.hash);
  if (hash) return { zoom: Number(hash[1]), lat: Number(hash[2]), lon: Number(hash[3]) };
  const params = new URLSearchParams(location.search);
  if (params.has("lat") && params.has("lon")) {
    return { zoom: Number(params.get("zoom") || 12), lat: Number(params.get("lat")), lon: Number(params.get("lon")) };
  }
  return null;
}

function showUrlView() {
  const view = viewInUrl();
  if (!view || ![view.zoom, view.lat, view.lon].every(Number.isFinite)) return false;
  map.setView([view.lat, view.lon], Math.min(Math.max(view.zoom, 0), 18));
  return true;
}

// As openstreetmap.org: enough decimals to place the centre within a pixel at this zoom.
function hashOfView() {
  const zoom = map.getZoom(), centre = map.getCenter().wrap();
  const decimals = Math.max(0, Math.ceil(Math.log10((256 * 2 ** zoom) / 360)));
  return `#map=${zoom}/${centre.lat.toFixed(decimals)}/${centre.lng.toFixed(decimals)}`;
}

map.on("moveend", () => {
  const hash = hashOfView();
  if (hash !== location.hash) history.replaceState(null, "", location.pathname + hash);
});
window.addEventListener("hashchange", showUrlView);

async function openOnTheData() {
  try {
    const extent = await (await fetch("/api/extent")).json();
    if (extent.bounds) {
      map.fitBounds(extent.bounds, { maxZoom: extent.zoom });
      return;
    }
  } catch (err) {
    // no extent: the world view below
  }
  map.setView([20, 0], 2);
}

if (!showUrlView()) openOnTheData();
// "?placeholder=1": while renders are unavailable, a tile not in the store comes as a grey placeholder
// (200, no-store) instead of a 503 the browser would log as an error; the banner says why, and the layer
// is redrawn when renders are back. "epoch" counts redraws (renders back, a re-render asked for): the browser
// keeps a page's images by URL whatever their cache headers say, so redrawn tiles need new URLs.
const renders = { backAt: undefined, backTimer: null, epoch: 0 };  // backAt: the last return seen

function redrawTiles() {
  renders.epoch += 1;
  tiles.redraw();
}

const tiles = L.tileLayer("/tiles/{z}/{x}/{y}.png?placeholder=1&epoch={epoch}", {
  maxZoom: 18, tileSize: 256, attribution: "© OpenStreetMap contributors", epoch: () => renders.epoch,
}).addTo(map);
// A tile refused for now (429/503: render budget full or still rendering) is asked for again, a few times.
tiles.on("tileerror", (event) => {
  const tries = Number(event.tile.dataset.tries || 0);
  if (tries >= 5) return;
  event.tile.dataset.tries = String(tries + 1);
  setTimeout(() => { event.tile.src = event.tile.src.split("&retry=")[0] + "&retry=" + (tries + 1); },
    2000 * (tries + 1));
});
const overlay = L.layerGroup().addTo(map);
const colours = { expired: "#d97706", requested: "#2563eb" };

function tileToLatLng(x, y, z) {
  const n = Math.PI - (2 * Math.PI * y) / 2 ** z;
  return [(180 / Math.PI) * Math.atan(0.5 * (Math.exp(n) - Math.exp(-n))), (x / 2 ** z) * 360 - 180];
}

// The banner over the map: renders unavailable (and why, since when), or back.
const banner = document.getElementById("banner");

function showBanner(cls, ...parts) {
  clearTimeout(renders.backTimer);
  banner.replaceChildren(...parts);
  banner.title = "";
  banner.className = `banner ${cls}`;
  banner.hidden = false;
}

function hideBanner() {
  banner.hidden = true;
  banner.className = "banner";
}

function showRenders(qm) {
  if (!qm.online && qm.down_since !== null) {
    const since = qm.never_heard
      ? ["the queuemaster has not answered since toposm-web started at ", timeElement(qm.down_since)]
      : ["since ", timeElement(qm.down_since), " (", elapsedElement(qm.down_since), ")"];
    const headline = document.createElement("strong");
    headline.append("Renders unavailable ", ...since);
    showBanner("unavailable", headline, `: ${qm.error}. Tiles already rendered are shown; the others stay`
      + " grey until renders are back, then load by themselves.");
    banner.title = qm.detail || "";
  } else if (qm.online && renders.backAt !== undefined && qm.back_at !== renders.backAt) {
    // Back after an outage: tiles served as placeholders meanwhile are asked for again.
    redrawTiles();
    showBanner("back", "Renders are back: the queuemaster answers again since ", timeElement(qm.back_at),
      "; the missing tiles are loading.");
    renders.backTimer = setTimeout(hideBanner, 10000);
  } else if (qm.online && banner.classList.contains("unavailable")) {
    hideBanner();
  }
  if (qm.online || qm.down_since !== null) renders.backAt = qm.back_at;
}

async function refreshOverlay() {
  try {
    const answer = await (await fetch("/api/overlay")).json();
    overlay.clearLayers();
    for (const m of answer.metatiles) {
      const x0 = m.mx * 8, y0 = m.my * 8;
      const bounds = [tileToLatLng(x0, y0, m.z), tileToLatLng(x0 + m.side, y0 + m.side, m.z)];
      L.rectangle(bounds, { color: colours[m.state] || "#999", weight: 1, fillOpacity: 0.15 })
        .bindTooltip(`${m.z}/${m.mx}/${m.my} ${m.state}`).addTo(overlay);
    }
    document.getElementById("overlay-count").textContent = `overlay: ${answer.total} metatiles`;
    showRenders(answer.queuemaster);
  } catch (err) {
    document.getElementById("overlay-count").textContent = "overlay: unavailable";
    showBanner("unavailable", "toposm-web is not answering: the map can show only tiles the browser already has.");
  }
}

// What a click's answer says, in the popup: requested, nothing to do, or why not (the server's reason).
async function clickAnswer(tile, answer) {
  let body = null;
  try {
    body = await answer.json();
  } catch (err) {
    // a refusal in plain text (403, 415): its status says it
  }
  if (answer.status === 200 && body && body.state === "fresh") {
    return `${tile} was re-rendered ${Math.round(body.age || 0)} s ago: nothing to do`;
  }
  if (answer.ok) return `render of ${tile} requested`;
  const retry = answer.headers.get("Retry-After");
  const reason = body && body.error ? body.error : `HTTP ${answer.status}`;
  return `render of ${tile} refused: ${reason}` + (retry ? ` (try again in ${retry} s)` : "");
}

map.on("click", async (event) => {
  const z = map.getZoom();
  const n = 2 ** z;
  const lat = event.latlng.lat * Math.PI / 180;
  const x = Math.floor(((event.latlng.lng + 180) / 360) * n);
  const y = Math.floor(((1 - Math.log(Math.tan(lat) + 1 / Math.cos(lat)) / Math.PI) / 2) * n);
  const tile = `${z}/${Math.min(Math.max(x, 0), n - 1)}/${Math.min(Math.max(y, 0), n - 1)}`;
  let text, ok = false;
  try {
    const answer = await fetch("/api/render", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ tile }),
    });
    ok = answer.ok;
    text = await clickAnswer(tile, answer);
  } catch (err) {
    text = `render of ${tile} not sent: toposm-web is not answering`;
  }
  const content = document.createElement("div");
  content.textContent = text;  // the reason may quote the bus: text, never markup
  L.popup().setLatLng(event.latlng).setContent(content).openOn(map);
  refreshOverlay();
  if (ok) setTimeout(redrawTiles, 3000);
});

refreshOverlay();
setInterval(refreshOverlay, 5000);
