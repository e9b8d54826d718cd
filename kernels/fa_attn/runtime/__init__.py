"""The runtime's call -> decide -> launch or fall back: a call is checked into one typed object
(inputs.py, call_cache.py; the API functions interface.py, packed.py, kvcache.py), its path decided
(decision.py: the pure rule the build and doctor share; all_wheel.py: which binding and CUDA major;
dispatch.py: the live device's answer), then launched on fa's kernels (loader.py: the manifest and
binding; preload.py; ops.py: the fa_attn:: operators) or run by torch SDPA (fallback.py).

Nothing is imported here: buildtool loads decision.py and all_wheel.py from this folder without torch."""
