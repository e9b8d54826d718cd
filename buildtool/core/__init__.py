"""What both pipelines use: CUDA and CPU facts, the cache and atomic writes, HTTP, where kernels/ is."""
