"""Services built on qbroker: TopOSM tiles and the Spark bridge."""
