"""``toposm-replicate``: follow an OSM replication directory into a store, expiring tiles through the bridge."""
