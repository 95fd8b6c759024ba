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
const tiles = L.tileLayer("/tiles/{z}/{x}/{y}.png", {
  maxZoom: 18, tileSize: 256, attribution: "© OpenStreetMap contributors",
}).addTo(map);
// A tile refused for now (429/503: render budget full or still rendering) is asked for again, a few times.
tiles.on("tileerror", (event) => {
  const tries = Number(event.tile.dataset.tries || 0);
  if (tries >= 5) return;
  event.tile.dataset.tries = String(tries + 1);
  setTimeout(() => { event.tile.src = event.tile.src.split("?")[0] + "?retry=" + (tries + 1); }, 2000 * (tries + 1));
});
const overlay = L.layerGroup().addTo(map);
const colours = { expired: "#d97706", requested: "#2563eb" };

function tileToLatLng(x, y, z) {
  const n = Math.PI - (2 * Math.PI * y) / 2 ** z;
  return [(180 / Math.PI) * Math.atan(0.5 * (Math.exp(n) - Math.exp(-n))), (x / 2 ** z) * 360 - 180];
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
  } catch (err) {
    document.getElementById("overlay-count").textContent = "overlay: unavailable";
  }
}

map.on("click", async (event) => {
  const z = map.getZoom();
  const n = 2 ** z;
  const lat = event.latlng.lat * Math.PI / 180;
  const x = Math.floor(((event.latlng.lng + 180) / 360) * n);
  const y = Math.floor(((1 - Math.log(Math.tan(lat) + 1 / Math.cos(lat)) / Math.PI) / 2) * n);
  const tile = `${z}/${Math.min(Math.max(x, 0), n - 1)}/${Math.min(Math.max(y, 0), n - 1)}`;
  const answer = await fetch("/api/render", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ tile }),
  });
  const text = answer.ok ? `render of ${tile} requested` : `render of ${tile} refused (${answer.status})`;
  L.popup().setLatLng(event.latlng).setContent(text).openOn(map);
  refreshOverlay();
  if (answer.ok) setTimeout(() => tiles.redraw(), 3000);
});

refreshOverlay();
setInterval(refreshOverlay, 5000);
