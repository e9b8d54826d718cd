"""fa_attn in other libraries' places: flash-attn 2.8.3's package (install.py makes `import flash_attn`
give these modules; compat.py is the opt-in and its command line; extension.py and privates.py the
compiled extension and private functions that libraries call; mha.py, block.py, rotary.py, norms.py,
... its modules in plain torch), transformers' attention (hf.py) and torch SDPA's flash path (sdpa.py).
All of them call the runtime (fa_attn.runtime); nothing here decides a path."""
