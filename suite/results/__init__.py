"""Run folders and what is read from them: the folder's files, the summary, comparison
of result sets, recovery of killed runs, statistics of repeats."""

from suite._legacy import forwarding_getattr

# ``from suite.results import RunFolder`` (the flat module before 0.2) still works
__getattr__ = forwarding_getattr(__name__, "suite.results.folder")
