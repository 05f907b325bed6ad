"""Neural-network helpers over parameter-server variables."""

from convoy.distribute.variables import embedding_lookup

__all__ = ["embedding_lookup"]
