"""fa's verification where it runs: the fp32 reference and error rule (reference.py, needs torch), the
verification record `fa check` writes and the runtime reads (record.py, stdlib only), and the check of
one unit on one problem (unitcheck.py)."""
