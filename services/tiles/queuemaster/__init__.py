"""The queuemaster process: the render queue, the registered render threads and the two wires into them.

``state_machine`` (no bus code) decides; ``service`` is its bus adapter; ``commands`` is the one command
table both wires (``service``'s qbroker endpoint and ``osm_wire``) read; ``main`` is ``toposm-queuemaster``.
"""
