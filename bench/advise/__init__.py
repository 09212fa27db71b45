"""`bench advise`: which measured configuration to run, with its ties and its projection to a target.

rank.py ranks the configurations at the largest measured world size by throughput with intervals,
answer.py writes the sentence from those rows, cli.py projects the top ones (bench.project) and writes
advice.md and advice.csv. Reads the run folder; imported by the report, never the reverse.
"""
