"""qbroker-spark-bridge: RPC endpoints that launch PySpark tile-expiry and render-stats jobs."""
