"""`fa check --emulate`: fa_attn's unit checks with the kernels on the CPU emulator (tests/emu), for
contributors without a GPU. The emulator lives in a source checkout (tests/emu, tests/gpu's launch
steps); harness.py finds it, ops.py registers the emulated `fa_attn::*` CPU kernels (tests/api uses
the same), run.py checks units."""
