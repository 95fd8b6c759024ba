"""``python -m services.osmstore.preview STORE --center LON,LAT --zoom Z --size WxH OUT.png``.

Renders one picture of a store (directory or PostGIS DSN) with the TopOSM style at a web-map zoom, without
the tile services: for looking at an import or a diff, and for the sample images in docs/img.
"""

from __future__ import annotations

import argparse
import math

from .style import map_xml
from .style_layers import check_source
from .wkb import EARTH_RADIUS, mercator


def render_preview(source: str, lon: float, lat: float, zoom: int, width: int, height: int, out: str) -> None:
    import mapnik

    m = mapnik.Map(width, height)
    mapnik.load_map_from_string(m, map_xml(source))
    m.buffer_size = 128
    metres_per_pixel = 2 * math.pi * EARTH_RADIUS / (256 * 2**zoom)
    x, y = mercator(lon, lat)
    half_w, half_h = width * metres_per_pixel / 2, height * metres_per_pixel / 2
    m.zoom_to_box(mapnik.Box2d(x - half_w, y - half_h, x + half_w, y + half_h))
    image = mapnik.Image(width, height)
    mapnik.render(m, image)
    image.save(out, "png8")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m services.osmstore.preview", description=__doc__.split("\n\n")[0])
    p.add_argument("store", help="store directory or PostGIS DSN")
    p.add_argument("out", help="PNG file to write")
    p.add_argument("--center", required=True, help="LON,LAT")
    p.add_argument("--zoom", type=int, default=16)
    p.add_argument("--size", default="768x768", help="WIDTHxHEIGHT in pixels")
    a = p.parse_args(argv)
    problem = check_source(a.store)
    if problem:
        p.error(problem)
    try:
        lon, lat = (float(v) for v in a.center.split(","))
        width, height = (int(v) for v in a.size.lower().split("x"))
    except ValueError:
        p.error("--center is LON,LAT and --size is WIDTHxHEIGHT")
    if not (0 < width <= 8192 and 0 < height <= 8192 and 0 <= a.zoom <= 22):
        p.error("--size up to 8192x8192, --zoom 0..22")
    render_preview(a.store, lon, lat, a.zoom, width, height, a.out)


if __name__ == "__main__":
    main()
