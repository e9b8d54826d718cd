"""The build pipeline: matrix -> plan -> compile -> package -> index."""
