"""Where each rank of a hung launch was stuck, as `bench analyze` reads it: bench/worker/hangs.py owns the
records (it writes them in the ranks) and reads them back; this module is analyze's name for that."""

from bench.worker.hangs import HANGS_FILE, flight_recorder_stuck, lines, read

__all__ = ["HANGS_FILE", "flight_recorder_stuck", "lines", "read"]
