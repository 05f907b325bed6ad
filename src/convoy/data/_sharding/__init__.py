"""What the data service needs to shard a pipeline: split providers (dynamic sharding) and
the static rewrite (``OFF``/``FILE``/``DATA``/``HINT`` policies)."""
