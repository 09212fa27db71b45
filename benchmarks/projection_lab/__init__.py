"""The projection's calibration lab: the published corpora's reader and the validation (published.py), the
fitting of the interval's bands (fitting.py) and the measured-protocol validation (protocols.py).
benchmarks/validate_projection.py is its command; the package (bench/project/) keeps only what was fitted,
as data, and never imports from here."""
