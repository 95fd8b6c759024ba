"""``qbroker-debug``: watch a QBroker bus without touching its traffic.

captured.py  what one AMQP delivery looked like (from our queues or from the firehose)
events.py    the decoded, printable event
pairing.py   requests remembered by message id, so replies get a name and a latency
directory.py the units we know (start/stop alerts, ping replies) and the bindings that follows from that
bindings.py  our exclusive queues and their bindings on the broker
filters.py   --name/--app/--uuid/--kind/--status
render.py    one line (or one JSON line) per event
runner.py    the connection, consumers, signals and the main loop
"""
