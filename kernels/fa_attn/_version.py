# The version of fa: fa-toolchain's (pyproject.toml reads it from here) and the default of matrix.yaml's
# `version:`, which a wheel of fa-attn extends with its variant ("0.1.0+cu12torch2.8").
__version__ = "0.1.0"
