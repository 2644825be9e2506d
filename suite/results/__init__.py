"""Run folders and what is read from them: the folder's files and every key they hold (one
schema, one upgrade of older formats), the summary, a result set read once, the machine and
its load, recovery of killed runs, statistics of repeats."""
