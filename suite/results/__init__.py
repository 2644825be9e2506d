"""Run folders and what is read from them: the folder's files, the summary, a result set
read once, comparison of result sets, recovery of killed runs, statistics of repeats."""
