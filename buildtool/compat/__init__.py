"""The install pipeline: probe -> fit -> choose -> install; doctor reports it."""
