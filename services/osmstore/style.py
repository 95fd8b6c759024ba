"""The TopOSM style for real OSM data, as Mapnik XML built here (road widths come from one table per zoom).

A topographic look: warm paper land, soft vegetation greens, pale blue water with a darker shore line,
a clear road hierarchy (warm fills from motorway down to white minor streets, all cased), black-and-white
railways, and labels in DejaVu (shipped inside the mapnik wheel). Layers read the rendering store
(``render.sqlite``) or an osm2pgsql database; ``style_layers`` builds their datasources.
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from .style_layers import Source, datasource

# Scale denominators bounding each zoom at 256 px tiles (z13 ~68k, z14 ~34k ... z17 ~4.3k).
ZOOM_SCALES = {
    12: (100_000, 400_000),
    13: (50_000, 100_000),
    14: (25_000, 50_000),
    15: (12_500, 25_000),
    16: (6_500, 12_500),
    17: (0, 6_500),
}
LAND = "#f5f2ea"
WATER, SHORE = "#a8cbe0", "#7aa6c2"

ROAD_COLOURS = {  # class: (fill, casing)
    "motorway": ("#e8875b", "#a9512c"),
    "trunk": ("#f0a868", "#b46f36"),
    "primary": ("#f7cc72", "#ad8536"),
    "secondary": ("#fbe495", "#ad9a5c"),
    "tertiary": ("#ffffff", "#9c968a"),
    "minor": ("#ffffff", "#b3aca0"),
    "pedestrian": ("#ede9e3", "#bdb5ab"),
    "service": ("#ffffff", "#c4bdb2"),
}
ROAD_WIDTHS = {  # class: fill width in px at z12..z17 (0 = not drawn)
    "motorway": (2.5, 3.5, 5, 8, 11, 15),
    "trunk": (2.2, 3, 4.5, 7.5, 10, 14),
    "primary": (2, 2.8, 4.2, 7, 10, 14),
    "secondary": (1.5, 2.4, 3.8, 6.5, 9, 13),
    "tertiary": (1, 1.8, 3.2, 6, 8.5, 12),
    "minor": (0, 1, 2, 4.5, 7, 10),
    "pedestrian": (0, 0, 1.5, 3.5, 5.5, 8),
    "service": (0, 0, 1, 2.5, 4, 6),
}
LANDUSE_COLOURS = {
    "forest": "#cfe2b6",
    "park": "#d8ecc2",
    "grass": "#e3efcc",
    "scrub": "#dbe7c4",
    "heath": "#ebe8c8",
    "wetland": "#d9e9e1",
    "beach": "#f4eac6",
    "rock": "#e4dfd8",
    "residential": "#ece8e1",
    "commercial": "#f1e4de",
    "civic": "#ede5ea",
    "industrial": "#e7e1e7",
    "construction": "#e9e4d4",
    "education": "#f2ecd3",
    "hospital": "#f2e0e0",
    "parking": "#ebebeb",
    "pitch": "#cbe6c0",
    "cemetery": "#d6e3c9",
    "military": "#f2dddd",
    "farmland": "#f3eed6",
}
FONT, FONT_BOLD, FONT_ITALIC = "DejaVu Sans Book", "DejaVu Sans Bold", "DejaVu Sans Oblique"


def _scale(zoom_from: int, zoom_to: int = 17) -> str:
    """Scale filter for zooms zoom_from..zoom_to (zoom_to 17 means "and closer")."""
    lo = ZOOM_SCALES[zoom_to][0]
    hi = ZOOM_SCALES[zoom_from][1]
    out = f"<MaxScaleDenominator>{hi}</MaxScaleDenominator>"
    return out + (f"<MinScaleDenominator>{lo}</MinScaleDenominator>" if lo else "")


def _rule(body: str, filt: str | None = None, zooms: tuple[int, int] | None = None) -> str:
    parts = ["<Rule>"]
    if zooms:
        parts.append(_scale(*zooms))
    if filt:
        parts.append(f"<Filter>{escape(filt)}</Filter>")
    parts.append(body)
    parts.append("</Rule>")
    return "".join(parts)


def _line(colour: str, width: float, **extra: str) -> str:
    attrs = "".join(f" {k.replace('_', '-')}={quoteattr(v)}" for k, v in extra.items())
    return f'<LineSymbolizer stroke="{colour}" stroke-width="{width:g}"{attrs}/>'


def _text(field: str, face: str, size: float, fill: str, halo: str = "#ffffffcc", **extra: str) -> str:
    attrs = "".join(f" {k.replace('_', '-')}={quoteattr(v)}" for k, v in extra.items())
    return (
        f'<TextSymbolizer face-name="{face}" size="{size:g}" fill="{fill}" halo-fill="{halo}" '
        f'halo-radius="1.5"{attrs}>{field}</TextSymbolizer>'
    )


def _style(name: str, rules: list[str], **attrs: str) -> str:
    extra = "".join(f" {k.replace('_', '-')}={quoteattr(v)}" for k, v in attrs.items())
    return f'<Style name="{name}"{extra}>' + "".join(rules) + "</Style>"


def landuse_style() -> str:
    rules = [
        _rule(f'<PolygonSymbolizer fill="{colour}"/>', f"[kind] = '{kind}'") for kind, colour in LANDUSE_COLOURS.items()
    ]
    rules.append(_rule(_line("#a7cf98", 0.8), "[kind] = 'pitch'", (15, 17)))
    rules.append(_rule(_line("#b7d6a4", 0.6, stroke_opacity="0.8"), "[kind] = 'park' or [kind] = 'forest'", (14, 17)))
    return _style("landuse", rules)


def water_styles() -> str:
    # The sea is cut on a grid (coastline.split_ring): no outline, or the cuts would show; the coastline
    # layer draws its shore.
    poly = _style(
        "water",
        [
            _rule(f'<PolygonSymbolizer fill="{WATER}"/>', "[kind] = 'sea'"),
            _rule(f'<PolygonSymbolizer fill="{WATER}"/>' + _line(SHORE, 0.7)),
        ],
        filter_mode="first",
    )
    widths: dict[str, tuple[float, ...]] = {
        "river": (2, 3, 4, 6, 8, 10),
        "canal": (2, 3, 4, 6, 8, 10),
        "stream": (0, 1, 1.5, 2, 3, 4),
        "drain": (0, 0, 1, 1.5, 2, 3),
        "ditch": (0, 0, 1, 1.5, 2, 3),
    }
    rules = []
    for kind, ws in widths.items():
        for z, w in zip(range(12, 18), ws, strict=True):
            if w:
                rules.append(
                    _rule(
                        _line(WATER, w, stroke_linecap="round", stroke_linejoin="round"), f"[kind] = '{kind}'", (z, z)
                    )
                )
    lines = _style("waterways", rules)
    coast = _style("coastline", [_rule(_line(SHORE, 1.0))])
    return poly + lines + coast


def building_style() -> str:
    return _style(
        "buildings",
        [
            _rule('<PolygonSymbolizer fill="#dcd3ca"/>', zooms=(14, 14)),
            _rule('<PolygonSymbolizer fill="#d6ccc2"/>' + _line("#b8aa9d", 0.6), zooms=(15, 17)),
        ],
    )


def road_styles() -> str:
    casing, fill = [], []
    for cls, widths in ROAD_WIDTHS.items():
        colour, edge = ROAD_COLOURS[cls]
        for z, w in zip(range(12, 18), widths, strict=True):
            if not w:
                continue
            filt = f"[class] = '{cls}'"
            edge_w = 1.0 if z <= 14 else 1.4
            if cls in ("minor", "service", "pedestrian") and z <= 13:
                fill.append(_rule(_line(edge, w, stroke_linecap="round"), filt, (z, z)))
                continue
            casing.append(
                _rule(
                    _line(edge, w + 2 * edge_w, stroke_linecap="round", stroke_linejoin="round"),
                    filt + " and [tunnel] = 0",
                    (z, z),
                )
            )
            casing.append(
                _rule(
                    _line(edge, w + 2 * edge_w, stroke_dasharray="4,3", stroke_opacity="0.6"),
                    filt + " and [tunnel] = 1",
                    (z, z),
                )
            )
            opacity = "0.6"
            fill.append(
                _rule(
                    _line(colour, w, stroke_linecap="round", stroke_linejoin="round"),
                    filt + " and [tunnel] = 0",
                    (z, z),
                )
            )
            fill.append(_rule(_line(colour, w, stroke_opacity=opacity), filt + " and [tunnel] = 1", (z, z)))
    minor_ways: tuple[tuple[str, str, tuple[float, ...]], ...] = (
        ("path", "#9c7b63", (0, 0, 0, 1, 1.2, 1.5)),
        ("track", "#a2814f", (0, 0, 0.9, 1.2, 1.5, 2)),
    )
    for cls, colour, line_widths in minor_ways:
        for z, w in zip(range(12, 18), line_widths, strict=True):
            if w:
                fill.append(
                    _rule(
                        _line(colour, w, stroke_dasharray="3,2" if cls == "path" else "5,3"),
                        f"[class] = '{cls}'",
                        (z, z),
                    )
                )
    return _style("road-casing", casing) + _style("road-fill", fill)


def railway_style() -> str:
    rules = [
        _rule(_line("#7b7b7b", 1.2), "[kind] = 'rail' and [tunnel] = 0", (12, 13)),
        _rule(
            _line("#6a6a6a", 3) + _line("#ffffff", 1.6, stroke_dasharray="6,6"),
            "[kind] = 'rail' and [tunnel] = 0",
            (14, 17),
        ),
        _rule(_line("#9a9a9a", 1.5, stroke_dasharray="5,4"), "[tunnel] = 1", (14, 17)),
        _rule(_line("#8a7d8f", 0.9), "[kind] = 'tram' and [tunnel] = 0", (14, 15)),
        _rule(_line("#7d6f84", 1.3), "[kind] = 'tram' and [tunnel] = 0", (16, 17)),
        _rule(_line("#7b7b7b", 2), "[kind] != 'rail' and [kind] != 'tram' and [tunnel] = 0", (14, 17)),
    ]
    return _style("railways", rules)


def label_styles() -> str:
    road = _style(
        "road-labels",
        [
            _rule(
                _text(
                    "[name]",
                    FONT,
                    9,
                    "#3b3b3b",
                    placement="line",
                    spacing="300",
                    max_char_angle_delta="25",
                    minimum_path_length="40",
                    repeat_distance="200",
                ),
                "[class] = 'primary' or [class] = 'secondary' or [class] = 'tertiary' or [class] = 'trunk'",
                (15, 15),
            ),
            _rule(
                _text(
                    "[name]",
                    FONT,
                    10,
                    "#333333",
                    placement="line",
                    spacing="300",
                    max_char_angle_delta="25",
                    repeat_distance="200",
                ),
                "[class] != 'path' and [class] != 'track' and [class] != 'service'",
                (16, 16),
            ),
            _rule(
                _text(
                    "[name]",
                    FONT,
                    11,
                    "#333333",
                    placement="line",
                    spacing="350",
                    max_char_angle_delta="25",
                    repeat_distance="250",
                ),
                "[class] != 'track'",
                (17, 17),
            ),
        ],
        filter_mode="first",
    )
    place = _style(
        "place-labels",
        [
            _rule(
                _text("[name]", FONT_BOLD, 16, "#2f2f2f", text_transform="uppercase", character_spacing="2"),
                "[rank] <= 2",
                (12, 14),
            ),
            _rule(
                _text(
                    "[name]",
                    FONT_BOLD,
                    12,
                    "#4a4a4a",
                    text_transform="uppercase",
                    character_spacing="1.5",
                    wrap_width="80",
                ),
                "[rank] = 3",
                (14, 16),
            ),
            _rule(_text("[name]", FONT, 11, "#555555", wrap_width="80"), "[rank] >= 4 and [rank] <= 6", (15, 17)),
            _rule(_text("[name]", FONT_ITALIC, 10, "#555555", wrap_width="70"), "[rank] >= 7", (16, 17)),
        ],
    )
    area = _style(
        "area-labels",
        [
            _rule(
                _text("[name]", FONT_ITALIC, 10, "#2f6b35", placement="interior", wrap_width="70"),
                "([kind] = 'park' or [kind] = 'forest' or [kind] = 'cemetery') and [area] > 20000",
                (15, 15),
            ),
            _rule(
                _text("[name]", FONT_ITALIC, 10, "#2f6b35", placement="interior", wrap_width="80"),
                "[kind] = 'park' or [kind] = 'forest' or [kind] = 'cemetery' or [kind] = 'pitch'",
                (16, 17),
            ),
        ],
    )
    water = _style(
        "water-labels",
        [
            _rule(
                _text("[name]", FONT_ITALIC, 11, "#1f5a8a", placement="interior", wrap_width="80"),
                "[area] > 30000",
                (14, 17),
            )
        ],
    )
    building = _style(
        "building-labels",
        [_rule(_text("[name]", FONT, 9, "#6b5d52", placement="interior", wrap_width="60"), zooms=(17, 17))],
    )
    return road + place + area + water + building


# (layer name, table, styles, order by) in drawing order, bottom first; labels last so they sit on top.
LAYERS: list[tuple[str, str, list[str], str | None]] = [
    ("landuse", "landuse", ["landuse"], "area DESC"),
    ("water", "water", ["water"], None),
    ("waterways", "waterways", ["waterways"], None),
    ("coastline", "coastline", ["coastline"], None),
    ("buildings", "buildings", ["buildings"], None),
    ("roads", "roads", ["road-casing", "road-fill"], "z_order"),
    ("railways", "railways", ["railways"], None),
    ("place-labels", "places", ["place-labels"], "rank"),
    ("road-labels", "roads", ["road-labels"], "z_order DESC"),
    ("water-labels", "water", ["water-labels"], "area DESC"),
    ("area-labels", "landuse", ["area-labels"], "area DESC"),
    ("building-labels", "buildings", ["building-labels"], "area DESC"),
]


def map_xml(source: Source) -> str:
    """The whole Mapnik map for ``source`` (a store directory or a PostGIS DSN)."""
    styles = landuse_style() + water_styles() + building_style() + road_styles() + railway_style() + label_styles()
    layers = []
    for name, table, style_names, order in LAYERS:
        names = "".join(f"<StyleName>{s}</StyleName>" for s in style_names)
        layers.append(f'<Layer name="{name}" srs="epsg:3857">{names}{datasource(source, table, order)}</Layer>')
    return (
        f'<?xml version="1.0" encoding="utf-8"?>\n<Map srs="epsg:3857" background-color="{LAND}">'
        + styles
        + "".join(layers)
        + "</Map>"
    )
