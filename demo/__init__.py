"""What ``bin/demo`` runs: the tile services and the Spark bridge working together on the local broker."""
