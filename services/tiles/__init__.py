"""TopOSM tile services on qbroker, one package per process: ``queuemaster`` and ``renderer``.

Beside them the pieces both use: ``messages``, ``tilemath``, ``strategy``, ``tile_store``. See docs/tiles.md.
Entry points: ``toposm-queuemaster`` and ``toposm-renderer`` (console scripts); ``demo.stack`` runs both
for scripts of your own.
"""
