"""The release workflow (GitHub Actions + cibuildwheel), rendered from matrix.yaml."""
