"""Real OpenStreetMap data: import an extract into the stores the tile services read, and keep them current.

``importer`` (``toposm-import``) builds the rendering store (``render.sqlite``, read by Mapnik's ``sqlite``
plugin) in one pyosmium pass; ``render_store.apply_osc`` applies an osmChange to it; ``style`` builds the
Mapnik map for it (or for an osm2pgsql PostGIS database).
"""
