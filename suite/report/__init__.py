"""``bench report``: figures and tables for papers from run folders alone.

``load`` reads the run folders once (suite.results.resultset) with what every figure shares,
``labels`` names each configuration once, ``figures`` draws one figure per function (or says
why it cannot), ``render`` writes report.md and a self-contained report.html around them.
"""
