"""TopOSM tile services on qbroker: queuemaster, renderers, render queue, tile store, backends.

See docs/tiles.md. Entry points: ``toposm-queuemaster`` and ``toposm-renderer`` (console scripts), and
``services.tiles.demo`` for a one-call local setup.
"""
